"""Settings: one frozen dataclass, built from the `options=` dict given to torch.compile.

Every field is validated here, once; the rest of the pipeline receives an `Options` and trusts it.

Long because every option is validated here, once: the dataclass with one documented field per
option, and the checks its construction applies to each.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from . import _trt
from ._errors import OptionsError
from ._types import Target

RUNTIMES = ("auto", "tensorrt_rtx", "onnxruntime")
SPECIALIZATION_STRATEGIES = ("lazy", "eager", "none")
CUDA_GRAPH_STRATEGIES = ("disabled", "whole_graph_capture")
WEIGHT_MODES = ("checked", "refit", "frozen")
WEIGHT_UPDATES = ("background", "wait")
ENGINE_BUILDS = ("wait", "background")
RESTS = ("auto", "pytorch", "inductor")
MAX_DIM = 2**31 - 1  # TensorRT-RTX dimensions are int32


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
    """TensorRT-RTX's kernels for a new shape: lazy (generic first, specialized when compiled),
    eager (compiled before the call returns), none (generic only)."""
    cuda_graph_strategy: Literal["disabled", "whole_graph_capture"] = "disabled"
    """whole_graph_capture: TensorRT-RTX captures and replays each engine as a CUDA graph
    (what torch.compile's mode="reduce-overhead" sets)."""
    dynamic_shapes: Mapping[int | str, Mapping[int, tuple[int, int, int]]] | None = None
    """Per model input (argument name, or position among the graph's input tensors), per dim:
    (min, opt, max) of the optimization profile of the dims Dynamo made dynamic."""
    default_max_dim: int = 4096
    """Upper bound of a dynamic dimension that Dynamo leaves unbounded."""
    runtime_cache_path: str | None = dataclasses.field(
        default_factory=lambda: os.path.join(default_cache_root(), "runtime", "")
    )
    """File (or directory: one file per TensorRT-RTX version and GPU inside) of TensorRT-RTX's
    JIT runtime cache; default: per-user cache directory; "" or None: memory only."""
    engine_cache_dir: str | None = dataclasses.field(
        default_factory=lambda: str(default_cache_root() / "engines")
    )
    """Directory of built engines; default: per-user cache directory; None or "": disabled."""
    engine_cache_size_mb: int = 2048
    """Engine cache size limit; least recently used entries are evicted."""
    validate: bool = True
    """Compare each engine's first result with PyTorch; a mismatch falls back to PyTorch."""
    dump_onnx_dir: str | None = None
    """Write each region's ONNX model (and a JSON sidecar of its shapes) here, for Netron or trtexec."""
    strict: bool = False
    """Raise on a region that fails to export, parse or build instead of falling back."""
    progress: bool = True
    """tqdm progress bar on long engine builds (only when attached to a terminal)."""
    optimize_onnx: bool = True
    """Run the ONNX exporter's optimizer (constant folding; the parser needs it for some ops)."""
    weights: Literal["checked", "refit", "frozen"] = "checked"
    """checked: every call checks that the weights the engines froze are the model's (same
    tensors, not changed in place) and builds the engines of changed weights again when they are
    not; refit: the same check, with engines built refittable and refitted instead (on TensorRT-RTX
    a refittable build can be slower, its engine too, and a refit slower than a build: see
    docs/weights.md); frozen: no check, the engines answer with the weights of compile time (for
    deployment)."""
    weight_update: Literal["background", "wait"] = "background"
    """How a region takes weights that changed (weights checked or refit): background: PyTorch
    runs the region with the new weights at once, while its engine is built again (or refitted)
    on a background thread, and the engine takes over once ready (rtx_backend.wait_for_updates()
    waits for it); wait: the call that saw the change waits for the engine. strict=True waits."""
    engine_build: Literal["wait", "background"] = "wait"
    """When a region's engine is not in the engine cache: wait: the compile builds it (and the
    first call waits for TensorRT-RTX to compile its kernels); background: the region runs in
    PyTorch from the first call while a background thread builds the engine and makes its
    contexts, and the engine takes over once ready (validated on its first call as any new
    engine; rtx_backend.wait_for_updates() waits for it). strict=True, runtime="tensorrt_rtx"
    and fastest=True wait (their failures must reach the compile)."""
    rest: Literal["auto", "pytorch", "inductor"] = "auto"
    """What runs the graph outside the regions: pytorch (eager, as it comes from lowering),
    inductor (the graph compiled by inductor, regions as calls of the trtrtx::region op; a graph
    that is not lowered and a region that falls back run inductor's code too), or auto: inductor
    for a graph whose lowering failed and where GEMMs, attention or convolutions run outside the
    regions, pytorch where the rest is only glue. See docs/rest.md."""
    compile_threads: int | None = None
    """CPU threads TensorRT-RTX may use to build an engine and to compile its kernels when the
    engine is loaded (the builder's and the runtime's max_threads); None: every CPU this process
    may run on."""
    fastest: bool = False
    """With rest="inductor": time each region's engine against inductor's code for it on its
    first calls and keep the faster (the decision is stored beside the engine, per GPU and
    driver). See docs/rest.md."""
    truncate_double: bool = False
    """Lower float64 nodes too, computed in float32 inside the engines (TensorRT-RTX has no FP64):
    a float64 value that enters or leaves a region is cast at its edge, so PyTorch's side keeps
    float64, and first-call validation checks each such engine against PyTorch's float64. Off by
    default: float64 in a model is mostly there on purpose (rotary tables of long sequences,
    masks at float64's extremes), and float32 changes those numbers; the float64 nodes then stay
    in PyTorch (rule fp64). On for a model whose float64 is glue (diffusers' Flux computes its
    rotary tables in float64): one region instead of a split around them."""

    def __post_init__(self) -> None:
        # Validate (and normalize) here rather than in from_dict, so that Options(...) and
        # dataclasses.replace(...) cannot produce an unchecked value either.
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _VALIDATORS[f.name](f.name, getattr(self, f.name)))
        if self.fastest and self.rest != "inductor":
            raise OptionsError("option 'fastest' chooses between a region's engine and inductor's code for it, "
                               "so it needs rest='inductor'; set rest='inductor' or leave fastest out")

    @classmethod
    def from_dict(cls, options: Mapping[str, Any] | Options | None) -> Options:
        if options is None:
            return cls()
        if isinstance(options, Options):
            return options
        if not isinstance(options, Mapping):
            raise OptionsError(f"options must be a dict, got {type(options).__name__}")
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted((k for k in options if k not in valid), key=repr)
        if unknown:
            import difflib

            hints = [f"{k!r} (did you mean {close[0]!r}?)" if close else repr(k)
                     for k in unknown
                     for close in [difflib.get_close_matches(str(k), valid, n=1, cutoff=0.6)]]
            raise OptionsError(
                f"unknown option(s) {', '.join(hints)}; valid options are: {', '.join(valid)}"
            )
        root = default_cache_root()  # defaults read the environment: a change of it is a new Options
        built = BUILT.get(options, root)
        if built is not None:
            return built
        made = cls(**options)
        BUILT.put(options, root, made)
        return made

    def cache_key_fields(self) -> dict[str, Any]:
        """The options that change a built engine (part of the engine-cache key)."""
        return {"optimize_onnx": self.optimize_onnx, "weights": self.weights}

    @property
    def engine_cache_path(self) -> Path | None:
        return Path(self.engine_cache_dir).expanduser() if self.engine_cache_dir else None


# torch.compile's `mode=` as trtrtx reads it: what maps onto TensorRT-RTX, as options.
MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "reduce-overhead": {"cuda_graph_strategy": "whole_graph_capture"},  # TensorRT-RTX's own CUDA graphs
}


def options_for_mode(mode: Any, options: Mapping[str, Any] | Options | None = None) -> Options:
    """The Options of `torch.compile(..., backend="trtrtx", mode=mode)`.

    "reduce-overhead" is what CUDA graphs are for: it sets cuda_graph_strategy="whole_graph_capture"
    (TensorRT-RTX captures and replays each engine). inductor's autotuning modes have no
    counterpart: TensorRT-RTX's builder chooses the kernels itself, so they raise OptionsError
    rather than being silently ignored.
    """
    if mode is None:
        return Options.from_dict(options)
    if mode in ("max-autotune", "max-autotune-no-cudagraphs"):
        raise OptionsError(
            f"mode={mode!r} is inductor's autotuning; trtrtx has no such mode (TensorRT-RTX's builder "
            "picks the kernels itself). Use mode='reduce-overhead' for TensorRT-RTX's CUDA graphs, or "
            "leave mode out"
        )
    if mode not in MODES:
        raise OptionsError(
            f"mode={mode!r} is not valid for trtrtx; choose one of {list(MODES)}, or leave mode out "
            "and pass options={...}"
        )
    base = Options.from_dict(options)
    implied = MODES[mode]
    given = options if isinstance(options, Mapping) else {}
    clash = [k for k, v in implied.items() if k in given and str(given[k]).lower() != v]
    if clash:
        raise OptionsError(f"mode={mode!r} sets {', '.join(f'{k}={implied[k]!r}' for k in clash)}, "
                           f"but options give {', '.join(f'{k}={given[k]!r}' for k in clash)}; drop one")
    return dataclasses.replace(base, **{k: v for k, v in implied.items() if k not in given})


class BuiltOptions:
    """The Options last built from each `options` dict (at most `size`).

    torch.compile hands the backend the same `options` dict on every compile: the Options built
    from it are reused while it holds the same values (identity), so an iterator or generator
    given as a value is read once, not found empty by the second compile. Each dict is kept here,
    so its id is not reused by another while it is."""

    def __init__(self, size: int = 64) -> None:
        self._lock = threading.Lock()
        self._size = size
        self._built: OrderedDict[int, tuple[Mapping[str, Any], Path, tuple[tuple[str, Any], ...], Options]] = (
            OrderedDict())

    def get(self, options: Mapping[str, Any], root: Path) -> Options | None:
        with self._lock:
            built = self._built.get(id(options))
        if built is not None and built[0] is options and built[1] == root and _unchanged(built[2], options):
            return built[3]
        return None

    def put(self, options: Mapping[str, Any], root: Path, made: Options) -> None:
        with self._lock:
            self._built[id(options)] = (options, root, tuple(options.items()), made)
            while len(self._built) > self._size:
                self._built.popitem(last=False)


BUILT = BuiltOptions()
_MISSING = object()


def _unchanged(items: tuple[tuple[str, Any], ...], options: Mapping[str, Any]) -> bool:
    return len(items) == len(options) and all(options.get(k, _MISSING) is v for k, v in items)


def _choice(choices: tuple[str, ...]) -> Any:
    def check(key: str, value: Any) -> str:
        if not isinstance(value, str) or value.lower() not in choices:
            raise OptionsError(f"{key}={value!r} is not valid; choose one of {list(choices)}")
        return value.lower()

    return check


def as_int(value: Any) -> int | None:
    """The int of an integer-like value (Python and NumPy integers, anything with __index__);
    None for anything else, and for bools (True is an int, but never a size)."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _optional(check: Any) -> Any:
    def optional(key: str, value: Any) -> Any:
        return None if value is None else check(key, value)

    return optional


def _int_at_least(low: int, high: int | None = None) -> Any:
    def check(key: str, value: Any) -> int:
        number = as_int(value)
        if number is None or number < low or (high is not None and number > high):
            bound = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise OptionsError(f"{key}={value!r} is not valid; it must be an integer {bound}")
        return number

    return check


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise OptionsError(f"{key}={value!r} is not valid; it must be True or False")
    return value


def _optional_path(key: str, value: Any) -> str | None:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if value is None or (isinstance(value, str) and "\0" not in value):
        return value
    raise OptionsError(f"{key}={value!r} is not valid; it must be a path string (no NUL) or None")


def _targets(key: str, value: Any) -> tuple[Target, ...] | None:
    if value is None:
        return None
    if _is_pair(value):  # one target, (8, 6) or "8.6": the user means [(8, 6)]
        value = [value]
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise OptionsError(f"{key}={value!r} is not valid; give (major, minor) or a list of them, "
                           "e.g. [(7, 5), (8, 6)]")
    out: list[Target] = []
    for item in value:
        if isinstance(item, str) and re.fullmatch(r"\d+\.\d+", item.strip(), re.ASCII):
            item = tuple(int(p) for p in item.strip().split("."))
        parts = [as_int(p) for p in item] if isinstance(item, (tuple, list)) else []
        if len(parts) != 2 or not all(p is not None and p >= 0 for p in parts):
            raise OptionsError(
                f"{key}: {item!r} in {value!r} is not a compute capability; give (major, minor) "
                "or a list of them, e.g. (8, 6) or [(7, 5), (8, 6)]"
            )
        target = (int(parts[0]), int(parts[1]))  # type: ignore[arg-type]
        if target not in out:
            out.append(target)
    if not out:
        raise OptionsError(f"{key} is empty; give at least one (major, minor) or None")
    _trt.check_buildable(tuple(out))
    return tuple(out)


def _is_pair(value: Any) -> bool:
    """(8, 6), [8, 6] or "8.6": one compute capability rather than a list of them."""
    if isinstance(value, str):
        return re.fullmatch(r"\d+\.\d+", value.strip(), re.ASCII) is not None
    return isinstance(value, (tuple, list)) and len(value) == 2 and all(as_int(p) is not None for p in value)


def _op_names(key: str, value: Any) -> frozenset[str]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise OptionsError(f"{key}={value!r} is not valid; give a list of op names")
    names = set()
    for item in value:
        name = normalize_op_name(item)
        if name is None:
            raise OptionsError(
                f"{key}: {item!r} is not an ATen op; use names like 'aten.relu' or "
                "'aten.addmm.default', or torch.ops.aten.relu"
            )
        _check_op_exists(key, name)
        names.add(name)
    return frozenset(names)


def _check_op_exists(key: str, name: str) -> None:
    """A misspelt op would silently keep nothing in PyTorch: say so, with the nearest names."""
    import difflib

    import torch

    namespace, _, rest = name.partition("::")
    packet_name, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, namespace), packet_name)
        found = not overload or overload in packet.overloads()
    except (AttributeError, RuntimeError):
        found = False
    if not found:
        from . import _torch_compat

        known = {n.split(".")[0] for n in _torch_compat.dispatch_get_all_op_names()}
        close = difflib.get_close_matches(name.split(".")[0], known, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise OptionsError(f"{key}: there is no op {name!r} in this PyTorch{hint}")


def _dynamic_shapes(key: str, value: Any) -> Mapping[int | str, Mapping[int, tuple[int, int, int]]] | None:
    if value is None:
        return None
    hint = (f"{key} must map an input (argument name or index) -> {{dim: (min, opt, max)}}, "
            "e.g. {'x': {0: (1, 8, 64)}}")
    if not isinstance(value, Mapping):
        raise OptionsError(hint)
    out: dict[int | str, dict[int, tuple[int, int, int]]] = {}
    for index, dims in value.items():
        named = isinstance(index, str) and index.isidentifier()
        number = None if isinstance(index, str) else as_int(index)
        if not (named or (number is not None and number >= 0)) or not isinstance(dims, Mapping):
            raise OptionsError(hint)
        name: int | str = index if named else number  # type: ignore[assignment]
        out[name] = {}
        for dim, rng in dims.items():
            axis = as_int(dim)
            bounds = [as_int(v) for v in rng] if isinstance(rng, (tuple, list)) else []
            ok = (
                axis is not None
                and len(bounds) == 3
                and all(v is not None for v in bounds)
                and 0 <= bounds[0] <= bounds[1] <= bounds[2] <= MAX_DIM  # type: ignore[operator]
                and bounds[2] >= 1  # type: ignore[operator]
            )
            if not ok:
                raise OptionsError(f"{hint}; got {dim!r}: {rng!r} (need 0 <= min <= opt <= max <= {MAX_DIM}, "
                                   "max >= 1)")
            out[name][axis] = (bounds[0], bounds[1], bounds[2])  # type: ignore[index,assignment]
    return out


_VALIDATORS: dict[str, Any] = {
    "target_compute_capabilities": _targets,
    "min_block_size": _int_at_least(1),
    "torch_executed_ops": _op_names,
    "runtime": _choice(RUNTIMES),
    "dynamic_shapes_kernel_specialization_strategy": _choice(SPECIALIZATION_STRATEGIES),
    "cuda_graph_strategy": _choice(CUDA_GRAPH_STRATEGIES),
    "dynamic_shapes": _dynamic_shapes,
    "default_max_dim": _int_at_least(1, MAX_DIM),
    "runtime_cache_path": _optional_path,
    "engine_cache_dir": _optional_path,
    "engine_cache_size_mb": _int_at_least(0),
    "validate": _bool,
    "dump_onnx_dir": _optional_path,
    "strict": _bool,
    "progress": _bool,
    "optimize_onnx": _bool,
    "weights": _choice(WEIGHT_MODES),
    "weight_update": _choice(WEIGHT_UPDATES),
    "engine_build": _choice(ENGINE_BUILDS),
    "rest": _choice(RESTS),
    "compile_threads": _optional(_int_at_least(1)),
    "fastest": _bool,
    "truncate_double": _bool,
}


def _field_notes(cls: type) -> dict[str, str]:
    """The docstring under each field of `cls` (Python keeps none of them at run time)."""
    import ast
    import inspect
    import itertools
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    notes = {}
    for node, after in itertools.pairwise(body):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            notes[node.target.id] = " ".join(after.value.value.split())
    return notes


def _document(cls: type) -> None:
    """Put every field, its default and its note into the class docstring, for help(Options)."""
    notes = _field_notes(cls)
    lines = [cls.__doc__ or "", "", "Fields (the keys of torch.compile's options= dict):", ""]
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        default = repr(f.default) if f.default is not dataclasses.MISSING else "under the per-user cache directory"
        lines.append(f"    {f.name} (default {default}): {notes.get(f.name, '')}".rstrip(": "))
    cls.__doc__ = "\n".join(lines)


_document(Options)


def normalize_op_name(item: Any) -> str | None:
    """'aten.relu', 'aten::relu.default', torch.ops.aten.relu -> 'aten::relu[.overload]'."""
    import torch

    if isinstance(item, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        item = str(item)
    if not isinstance(item, str):
        return None
    text = item.strip().removeprefix("torch.ops.").replace("::", ".")
    parts = text.split(".")
    if len(parts) not in (2, 3) or not all(re.fullmatch(r"\w+", p) for p in parts):
        return None
    name = f"{parts[0]}::{parts[1]}"
    if len(parts) == 3 and parts[2] != "default":
        name += f".{parts[2]}"
    return name
