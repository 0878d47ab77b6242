"""Access to the installed TensorRT-RTX: import, version, the compute capabilities it names.

Imported lazily so that `import rtx_backend` works (and explains itself) where TensorRT-RTX is
missing; every caller goes through `trt()`.
"""

from __future__ import annotations

import functools
import os
import re
from types import ModuleType
from typing import Any

from ._errors import RuntimeUnavailableError, TargetError
from ._types import Target

SUPPORTED_VERSIONS = ((1, 4), (1, 7))  # inclusive range of major.minor we build against


def trt() -> ModuleType:
    """The `tensorrt_rtx` module; raises a clear error when it is missing or too old."""
    module, why = _load()
    if module is None:
        raise RuntimeUnavailableError(why)
    return module


@functools.cache
def _load() -> tuple[ModuleType | None, str]:
    """The module, or None and why not. Cached either way: a failed import is not retried per call."""
    try:
        import tensorrt_rtx as module
    except Exception as exc:  # ImportError, or a broken shared library
        return None, (
            f"TensorRT-RTX is not importable ({type(exc).__name__}: {exc}). Install it with "
            "`pip install tensorrt-rtx`, or use options={'runtime': 'onnxruntime'}."
        )
    text = str(getattr(module, "__version__", "unknown"))
    lo, hi = SUPPORTED_VERSIONS
    if not lo <= version_tuple(text)[:2] <= hi:
        return None, (
            f"TensorRT-RTX {text} is not supported; rtx_backend needs {lo[0]}.{lo[1]} to "
            f"{hi[0]}.{hi[1]} (`pip install 'tensorrt-rtx>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1] + 1}'`), "
            "or use options={'runtime': 'onnxruntime'}."
        )
    return module, ""


def unavailable_reason() -> str | None:
    """Why TensorRT-RTX cannot be used here (missing, broken, unsupported version), or None."""
    module, why = _load()
    return None if module is not None else why


def available() -> bool:
    return unavailable_reason() is None


def reset() -> None:
    """Forget the import result (tests that simulate a missing or old TensorRT-RTX)."""
    _load.cache_clear()
    logger.cache_clear()


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
        import sys

        finalizing = sys.is_finalizing
        base = trt().ILogger
        severity = trt().ILogger.Severity
        log = logging.getLogger("rtx_backend.trt")

        class Logger(base):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                base.__init__(self)
                self.errors: list[str] = []

            def log(self, sev: Any, msg: str) -> None:
                if finalizing():  # engines freed at interpreter exit: logging is half torn down,
                    return  # and an exception here is printed by TensorRT-RTX as an [ERROR] block
                try:
                    if sev in (severity.INTERNAL_ERROR, severity.ERROR):
                        self.errors.append(msg)
                        log.debug("TensorRT-RTX error: %s", msg)
                    elif sev == severity.WARNING:
                        log.debug("TensorRT-RTX: %s", msg)
                except Exception:  # never into TensorRT-RTX's callback: it would print its own error
                    return

        return Logger()


# What TensorRT-RTX 1.7 names, used only to validate options when TensorRT-RTX is not importable.
KNOWN_CAPABILITIES: tuple[Target, ...] = ((7, 5), (8, 0), (8, 6), (8, 9), (12, 0), (12, 1))


def buildable_capabilities() -> tuple[Target, ...]:
    if available():
        return tuple(named_capabilities())
    return KNOWN_CAPABILITIES


def check_buildable(targets: tuple[Target, ...]) -> None:
    supported = buildable_capabilities()
    bad = [t for t in targets if t not in supported]
    if bad:
        names = ", ".join(f"({a}, {b})" for a, b in supported)
        who = (f"the installed TensorRT-RTX {version()}" if available()
               else "TensorRT-RTX (not importable here; checked against the 1.7 list)")
        raise TargetError(
            f"target_compute_capabilities {bad} cannot be built by {who}; it builds for: {names}"
        )


def threads(requested: int | None = None) -> int:
    """The CPU threads TensorRT-RTX may use (the `compile_threads` option): `requested`, or every
    CPU this process may run on. Its builder and runtime use one thread unless told otherwise."""
    if requested is not None:
        return requested
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity API (macOS, Windows)
        return os.cpu_count() or 1


def allow_threads(obj: Any, count: int | None = None) -> None:
    """Let a TensorRT-RTX builder or runtime use `threads(count)` threads (where it has the setting)."""
    if hasattr(obj, "max_threads"):
        obj.max_threads = threads(count)
