"""Access to the installed TensorRT-RTX: import, version, the compute capabilities it names.

Imported lazily so that `import rtx_backend` works (and explains itself) where TensorRT-RTX is
missing; every caller goes through `trt()`.
"""

from __future__ import annotations

import functools
import re
from types import ModuleType
from typing import Any

from ._errors import RuntimeUnavailableError

SUPPORTED_VERSIONS = ((1, 4), (1, 7))  # inclusive range of major.minor we build against


@functools.cache
def trt() -> ModuleType:
    """The `tensorrt_rtx` module; raises a clear error when it is missing or too old."""
    try:
        import tensorrt_rtx as module
    except Exception as exc:  # ImportError, or a broken shared library
        raise RuntimeUnavailableError(
            f"TensorRT-RTX is not importable ({exc}). Install it with "
            "`pip install tensorrt-rtx`, or use options={'runtime': 'onnxruntime'}."
        ) from exc
    major_minor = version_tuple(module.__version__)[:2]
    lo, hi = SUPPORTED_VERSIONS
    if not lo <= major_minor <= hi:
        raise RuntimeUnavailableError(
            f"TensorRT-RTX {module.__version__} is not supported; rtx_backend needs "
            f"{lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}."
        )
    return module


def available() -> bool:
    try:
        trt()
    except RuntimeUnavailableError:
        return False
    return True


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:4])


def version() -> str:
    return str(trt().__version__)


def named_capabilities() -> dict[tuple[int, int], Any]:
    """(major, minor) -> trt.ComputeCapability member, for every SM the installed version names."""
    out: dict[tuple[int, int], Any] = {}
    for name, member in trt().ComputeCapability.__members__.items():
        match = re.fullmatch(r"SM(\d+?)(\d)", name)
        if match:
            out[(int(match.group(1)), int(match.group(2)))] = member
    return dict(sorted(out.items()))


@functools.cache
def logger() -> Any:
    return _Logger()


class _Logger:
    """Routes TensorRT-RTX messages to logging.getLogger('rtx_backend.trt') and keeps errors."""

    def __new__(cls) -> Any:
        import logging

        base = trt().ILogger
        severity = trt().ILogger.Severity
        log = logging.getLogger("rtx_backend.trt")

        class Logger(base):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                base.__init__(self)
                self.errors: list[str] = []

            def log(self, sev: Any, msg: str) -> None:
                if sev in (severity.INTERNAL_ERROR, severity.ERROR):
                    self.errors.append(msg)
                    log.debug("TensorRT-RTX error: %s", msg)
                elif sev == severity.WARNING:
                    log.debug("TensorRT-RTX: %s", msg)

        return Logger()
