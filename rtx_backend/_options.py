"""Settings: one frozen dataclass, built from the `options=` dict given to torch.compile.

Every field is validated here, once; the rest of the pipeline receives an `Options` and trusts it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from ._errors import OptionsError

Target = tuple[int, int]
RUNTIMES = ("auto", "tensorrt_rtx", "onnxruntime")
SPECIALIZATION_STRATEGIES = ("lazy", "eager", "none")
CUDA_GRAPH_STRATEGIES = ("disabled", "whole_graph_capture")


def default_cache_root() -> Path:
    base = os.environ.get("RTX_BACKEND_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "rtx_backend"


_DEFAULT = object()  # "use the per-user default path"


@dataclasses.dataclass(frozen=True)
class Options:
    """All settings of one compilation. Build with `Options.from_dict(options)`."""

    target_compute_capabilities: tuple[Target, ...] | None = None
    """GPUs the engines must run on, as (major, minor). None: the current device."""
    min_block_size: int = 5
    """Regions with fewer compute nodes stay in PyTorch (engine calls have a fixed cost)."""
    torch_executed_ops: frozenset[str] = frozenset()
    """ATen ops forced to stay in PyTorch, e.g. {"aten.relu"} or {"aten.relu.default"}."""
    runtime: Literal["auto", "tensorrt_rtx", "onnxruntime"] = "auto"
    """auto: TensorRT-RTX where the GPU can run the engine, else ONNX Runtime (one warning)."""
    dynamic_shapes_kernel_specialization_strategy: Literal["lazy", "eager", "none"] = "lazy"
    cuda_graph_strategy: Literal["disabled", "whole_graph_capture"] = "disabled"
    dynamic_shapes: Mapping[int, Mapping[int, tuple[int, int, int]]] | None = None
    """Per graph input index, per dim: (min, opt, max) of the optimization profile."""
    default_max_dim: int = 4096
    """Upper bound of a dynamic dimension that Dynamo leaves unbounded."""
    runtime_cache_path: str | None = None
    """File of TensorRT-RTX's JIT runtime cache; None: per-user default; "": memory only."""
    engine_cache_dir: str | None = None
    """Directory of built engines; None: per-user default; "": disabled."""
    engine_cache_size_mb: int = 2048
    validate: bool = True
    """Compare each engine's first result with PyTorch; a mismatch falls back to PyTorch."""
    dump_onnx_dir: str | None = None
    strict: bool = False
    """Raise on a region that fails to export, parse or build instead of falling back."""
    progress: bool = True
    """tqdm progress bar on long engine builds (only when attached to a terminal)."""
    optimize_onnx: bool = True
    """Run the ONNX exporter's optimizer (constant folding; the parser needs it for some ops)."""

    @classmethod
    def from_dict(cls, options: Mapping[str, Any] | Options | None) -> Options:
        if options is None:
            return cls()
        if isinstance(options, Options):
            return options
        if not isinstance(options, Mapping):
            raise OptionsError(f"options must be a dict, got {type(options).__name__}")
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(str(k) for k in options if k not in valid)
        if unknown:
            raise OptionsError(
                f"unknown option(s) {unknown}; valid options are: {', '.join(valid)}"
            )
        values = {key: _VALIDATORS[key](key, value) for key, value in options.items()}
        return cls(**values)

    def cache_key_fields(self) -> dict[str, Any]:
        """The options that change a built engine (part of the engine-cache key)."""
        return {"optimize_onnx": self.optimize_onnx}

    @property
    def engine_cache_path(self) -> Path | None:
        if self.engine_cache_dir == "":
            return None
        if self.engine_cache_dir is None:
            return default_cache_root() / "engines"
        return Path(self.engine_cache_dir)


def _choice(choices: tuple[str, ...]) -> Any:
    def check(key: str, value: Any) -> str:
        if not isinstance(value, str) or value.lower() not in choices:
            raise OptionsError(f"{key}={value!r} is not valid; choose one of {list(choices)}")
        return value.lower()

    return check


def _int_at_least(low: int) -> Any:
    def check(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise OptionsError(f"{key}={value!r} is not valid; it must be an integer >= {low}")
        return value

    return check


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise OptionsError(f"{key}={value!r} is not valid; it must be True or False")
    return value


def _optional_path(key: str, value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)  # type: ignore[return-value]
    raise OptionsError(f"{key}={value!r} is not valid; it must be a path string or None")


def _targets(key: str, value: Any) -> tuple[Target, ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise OptionsError(f"{key}={value!r} is not valid; give a list of (major, minor) tuples")
    out: list[Target] = []
    for item in value:
        if isinstance(item, str) and item.replace(".", "", 1).isdigit() and "." in item:
            item = tuple(int(p) for p in item.split("."))
        if (
            not isinstance(item, (tuple, list))
            or len(item) != 2
            or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in item)
        ):
            raise OptionsError(
                f"{key}: {item!r} is not a compute capability; give (major, minor), e.g. (8, 6)"
            )
        target = (int(item[0]), int(item[1]))
        if target not in out:
            out.append(target)
    if not out:
        raise OptionsError(f"{key} is empty; give at least one (major, minor) or None")
    from ._targets import check_buildable

    check_buildable(tuple(out))
    return tuple(out)


def _op_names(key: str, value: Any) -> frozenset[str]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise OptionsError(f"{key}={value!r} is not valid; give a list of op names")
    from ._policy import normalize_op_name

    names = set()
    for item in value:
        name = normalize_op_name(item)
        if name is None:
            raise OptionsError(
                f"{key}: {item!r} is not an ATen op; use names like 'aten.relu' or "
                "'aten.addmm.default', or torch.ops.aten.relu"
            )
        names.add(name)
    return frozenset(names)


def _dynamic_shapes(key: str, value: Any) -> Mapping[int, Mapping[int, tuple[int, int, int]]] | None:
    if value is None:
        return None
    hint = f"{key} must map input index -> {{dim: (min, opt, max)}}, e.g. {{0: {{0: (1, 8, 64)}}}}"
    if not isinstance(value, Mapping):
        raise OptionsError(hint)
    out: dict[int, dict[int, tuple[int, int, int]]] = {}
    for index, dims in value.items():
        if not isinstance(index, int) or index < 0 or not isinstance(dims, Mapping):
            raise OptionsError(hint)
        out[index] = {}
        for dim, rng in dims.items():
            ok = (
                isinstance(dim, int)
                and isinstance(rng, (tuple, list))
                and len(rng) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) for v in rng)
                and 0 <= rng[0] <= rng[1] <= rng[2]
            )
            if not ok:
                raise OptionsError(f"{hint}; got {dim!r}: {rng!r} (need 0 <= min <= opt <= max)")
            out[index][dim] = (rng[0], rng[1], rng[2])
    return out


_VALIDATORS: dict[str, Any] = {
    "target_compute_capabilities": _targets,
    "min_block_size": _int_at_least(1),
    "torch_executed_ops": _op_names,
    "runtime": _choice(RUNTIMES),
    "dynamic_shapes_kernel_specialization_strategy": _choice(SPECIALIZATION_STRATEGIES),
    "cuda_graph_strategy": _choice(CUDA_GRAPH_STRATEGIES),
    "dynamic_shapes": _dynamic_shapes,
    "default_max_dim": _int_at_least(1),
    "runtime_cache_path": _optional_path,
    "engine_cache_dir": _optional_path,
    "engine_cache_size_mb": _int_at_least(0),
    "validate": _bool,
    "dump_onnx_dir": _optional_path,
    "strict": _bool,
    "progress": _bool,
    "optimize_onnx": _bool,
}
