"""Graph cache: a compiled graph reused in a later process, ahead of aot_autograd.

A process that runs a model again gets the same graph from Dynamo. With only the engine cache,
it still lowered that graph with aot_autograd, ran the policy and the partitioner and hashed each
region before it found its engines (0.4 s of a 1.5 s ResNet-18 warm start on the H200). A graph
cache hit goes from Dynamo's graph straight to the compiled graph: the partitioned ATen graph,
its regions' engines loaded from the engine cache.

The key is a SHA-256 of everything the compiled graph depends on: Dynamo's graph code, every
input's spec (shapes, symbolic shapes and their ranges, strides, dtypes, devices), the bytes of
every weight and constant, the grad, inference and autocast modes, the declared targets (or the
current GPU), the versions, the code of this whole package and the options. Weights are hashed
once per compile: the regions' engine-cache keys reuse these digests (`digest_scope`).

An entry is one file, `<key>.graph`, in the engine cache directory: MAGIC, the header length
(8 bytes, little endian), a JSON header (the key and its fields, each region's engine-cache key
and device, the payload's size and SHA-256) and the payload: a pickle of the partitioned
GraphModule and of each region's ATen graph (GraphModule pickles as code), in which the regions
and the weights are references, not copies. A hit binds the references to the weights Dynamo
passed and to runtime modules made from the engine-cache entries, which it begins to read (on
reader threads) as soon as the header has named them, while it checks and unpickles the
payload. A file that fails a check, a missing engine, anything a hit cannot rebuild: a warning
(a debug message for a missing engine) and the full compile, which writes the entry again.

A pickle can run code when it is loaded, so nothing is unpickled before the header's HMAC (this
user's cache key, see _trust) and the payload's SHA-256 that it vouches for are checked; and the
unpickler then takes only the classes and functions that a compiled graph is made of (torch, FX,
this package, a few builtins): a file that names anything else is refused, not loaded.

Long because the key (guards, shapes, weights), the entry's format and its restricted
unpickler belong together: the unpickler's allow-list must match what the pickler writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import logging
import os
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .. import _files, _host, _stats, _targets, _torch_compat, _trt, _trust
from .._options import Options
from ..lower.lowering import is_weight
from . import engines as _engine_cache
from . import store
from .store import CorruptEntry, Key

log = logging.getLogger("rtx_backend")

FORMAT = 1
MAGIC = store.GRAPH_MAGIC
SUFFIX = store.GRAPH_SUFFIX


@dataclasses.dataclass(frozen=True)
class RegionRef:
    """A region of a cached graph: its engine-cache key and where its tensors live."""

    name: str
    engine: Key
    device: str


@dataclasses.dataclass
class GraphEntry:
    """A cached compiled graph. In a loaded entry the regions are stand-ins (nn.Identity) until
    the caller sets the runtime modules made from their engine-cache entries."""

    graph_module: torch.fx.GraphModule
    references: dict[str, torch.fx.GraphModule]  # each region's ATen graph (validation, fallback)
    regions: list[RegionRef]
    reasons: dict[str, Any]  # the partition plan's, for explain-like records
    eager_ops: list[tuple[str, str]]


# ---- the key -----------------------------------------------------------------------------------


def graph_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Options) -> Key | None:
    """The key of Dynamo's graph `gm` with these inputs; None when it cannot be cached (a
    submodule call, an input or constant whose content or spec cannot be described, anything
    unexpected: the graph is then compiled as without the cache)."""
    try:
        return _graph_key(gm, example_inputs, options)
    except Exception as exc:
        log.debug("trtrtx: no graph cache key for this graph: %s", exc, exc_info=exc)
        return None


def _graph_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Options) -> Key | None:
    h = hashlib.sha256(gm.code.encode())
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        return None
    weights: list[torch.Tensor] = []
    for node, value in zip(placeholders, example_inputs):
        spec = _input_spec(node.meta.get("example_value"), value)
        if spec is None:
            return None
        h.update(repr(spec).encode())
        if is_weight(value):
            weights.append(value)
    for node in gm.graph.nodes:
        if node.op == "call_module":
            return None
        if node.op == "get_attr":
            value = _engine_cache.fetch_attr(gm, str(node.target))
            if not isinstance(value, torch.Tensor):
                return None
            h.update(repr((node.target, _tensor_spec(value))).encode())
            weights.append(value)
    digests = _engine_cache.tensor_digests(weights, remember=True)
    if any(d is None for d in digests):
        return None
    for digest in digests:
        h.update(digest)  # type: ignore[arg-type]
    targets = options.target_compute_capabilities
    fields = {
        "format": FORMAT,
        "graph": h.hexdigest(),
        "modes": _modes(),
        "targets": [list(t) for t in targets] if targets is not None else {"current": _engine_cache.current_gpu()},
        "tensorrt_rtx": _trt.version(),
        "torch": torch.__version__,
        "package": store.package_fingerprint(),
        "options": _option_fields(options),
    }
    return Key(_engine_cache.make_key(fields), fields)


def _input_spec(example: Any, value: Any) -> Any:
    """What the compiled graph depends on in one input: for a tensor its sizes, strides and
    offset as Dynamo traced them (ints, or symbolic sizes with their ranges: see `_sym`), dtype,
    device, layout and whether it is a weight; for a SymInt its expression and range; other
    values as they are."""
    if isinstance(value, torch.Tensor):
        if not isinstance(example, torch.Tensor):
            return None
        symbolic = [_sym(s) for s in (*example.shape, *example.stride(), example.storage_offset())]
        return ("tensor", str(value.dtype), str(value.device), str(value.layout), symbolic, is_weight(value),
                value.requires_grad)
    if isinstance(value, torch.SymInt):
        return ("symint", _sym(value))
    if isinstance(value, (bool, int, float)) or value is None:
        return ("value", type(value).__name__, _sym(example) if isinstance(example, torch.SymInt) else repr(value))
    return None


def _tensor_spec(t: torch.Tensor) -> tuple[Any, ...]:
    return (str(t.dtype), str(t.device), tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.layout)


def _sym(value: Any) -> Any:
    """An int, or a symbolic size as its expression with each symbol's range. Not its value in
    this call: the graph is the same for every value in the range (a compile that adds guards is
    not stored: `shape_state`), and an engine profile that does not cover a later size is widened
    at run time."""
    if not isinstance(value, torch.SymInt):
        return value
    node = value.node
    if node.expr.is_number:
        return int(node.expr)
    ranges = {str(s): str(node.shape_env.var_to_range.get(s)) for s in sorted(node.expr.free_symbols, key=str)}
    return (str(node.expr), ranges)


def shape_state() -> Any:
    """What the compile may add to Dynamo's knowledge of the symbolic sizes (guards, replacements,
    ranges, runtime asserts). Dynamo guards the compiled graph on it; a hit skips the lowering that
    would have added it, so a compile that changed it is not stored."""
    try:
        context = _torch_compat.tracing_context()
        env = getattr(getattr(context, "fake_mode", None), "shape_env", None)
        if env is None:
            return None
        return (len(env.guards), dict(env.replacements), dict(env.var_to_range),
                sum(len(v) for v in env.deferred_runtime_asserts.values()))
    except Exception as exc:  # a ShapeEnv without these attributes: nothing can be compared
        log.debug("trtrtx: cannot read the symbolic sizes' state: %s", exc)
        return object()  # equal to nothing: the graph is not stored


def _modes() -> dict[str, Any]:
    """Global modes that aot_autograd's graph depends on."""
    autocast = {}
    for device in ("cpu", "cuda"):
        if torch.is_autocast_enabled(device):
            autocast[device] = str(torch.get_autocast_dtype(device))
    return {"grad": torch.is_grad_enabled(), "inference": torch.is_inference_mode_enabled(), "autocast": autocast}


def _option_fields(options: Options) -> dict[str, Any]:
    """The options that shape a compiled graph (not where caches live, not progress bars)."""
    skip = {"engine_cache_dir", "engine_cache_size_mb", "runtime_cache_path", "progress"}
    return {f.name: repr(getattr(options, f.name)) for f in dataclasses.fields(options) if f.name not in skip}


# ---- the entry ---------------------------------------------------------------------------------


def path_of(directory: Path, key: Key) -> Path:
    return directory / f"{key.name}{SUFFIX}"


def encode(key: Key, entry: GraphEntry, weights: dict[int, torch.Tensor]) -> list[bytes]:
    """The entry file's chunks. Weights (tensors that view a weight's memory) and runtime modules
    are pickled as references; raises TypeError/pickle.PicklingError for what cannot be stored."""
    buffer = io.BytesIO()
    regions = {id(getattr(entry.graph_module, r.name)): r.name for r in entry.regions}
    _Pickler(buffer, weights, regions).dump({
        "graph_module": entry.graph_module,
        "references": entry.references,
        "reasons": entry.reasons,
        "eager_ops": entry.eager_ops,
    })
    payload = buffer.getvalue()
    header: dict[str, Any] = {
        "format": FORMAT,
        "key": key.name,
        "fields": key.fields,
        "regions": [{"name": r.name, "engine": r.engine.name, "engine_fields": r.engine.fields, "device": r.device}
                    for r in entry.regions],
        "payload": {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()},
    }
    return [*store.framed_header(MAGIC, header), payload]


def decode(
    data: Any, key: Key, example_inputs: Sequence[Any], on_header: Callable[[list[RegionRef]], None] | None = None
) -> GraphEntry:
    """The entry in `data`, its weights bound to `example_inputs`; raises CorruptEntry.
    `on_header` is given the regions named by the checked header, before the payload is checked
    and unpickled (the caller may begin reading their engines)."""
    header, at = store.read_header(data, MAGIC, key, FORMAT)
    try:
        regions = [RegionRef(r["name"], Key(r["engine"], r["engine_fields"]), r["device"]) for r in header["regions"]]
        size, digest = int(header["payload"]["size"]), header["payload"]["sha256"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptEntry(f"unreadable header ({type(exc).__name__}: {exc})") from exc
    if on_header is not None:
        on_header(regions)
    payload = memoryview(data)[at:]
    if len(payload) != size or hashlib.sha256(payload).hexdigest() != digest:
        raise CorruptEntry("payload truncated or damaged")
    try:
        body = _Unpickler(io.BytesIO(payload), example_inputs).load()
        entry = GraphEntry(body["graph_module"], body["references"], regions, body["reasons"], body["eager_ops"])
    except Exception as exc:  # anything in an unpickled payload: another torch, a damaged file
        raise CorruptEntry(f"its graph cannot be rebuilt ({type(exc).__name__}: {exc})") from exc
    if not isinstance(entry.graph_module, torch.fx.GraphModule) or set(entry.references) != {r.name for r in regions}:
        raise CorruptEntry("its graph does not match its header")
    return entry


_NOT_STORED = ("_tracer_cls", "_tracer_extras", "meta")


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, weights: dict[int, torch.Tensor], regions: dict[int, str]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.weights = {m: i for i, t in weights.items() if (m := _host.place(t)) is not None}
        self.regions = regions  # id of each region module -> its name (stored as its engine's reference)

    def reducer_override(self, obj: Any) -> Any:
        """A GraphModule as its code, to be traced again with FX's plain tracer: the tracer it was
        made with (make_fx's) would inline the region calls. Its metadata is not needed."""
        if not isinstance(obj, torch.fx.GraphModule):
            return NotImplemented
        rebuild, (body, import_block) = obj.__reduce__()
        body = {k: v for k, v in body.items() if k not in _NOT_STORED}
        return rebuild, (body, import_block)

    def persistent_id(self, obj: Any) -> Any:
        region = self.regions.get(id(obj))
        if region is not None:
            return ("region", region)
        if isinstance(obj, torch.Tensor):
            index = self.weights.get(_host.place(obj))  # type: ignore[arg-type]
            if index is not None:
                return ("weight", index)
        return None


def allowed_global(module: str, name: str) -> bool:
    """Whether a graph entry may name this class or function (defence in depth behind the HMAC:
    a compiled graph is made of torch, FX and this package's objects, and plain containers)."""
    root = module.split(".")[0]
    if root in _ALLOWED_ROOTS:
        return True
    return (module, name) in _ALLOWED_NAMES


_ALLOWED_ROOTS = frozenset({"torch", "rtx_backend", "sympy"})
_ALLOWED_NAMES = frozenset({
    ("builtins", n) for n in ("set", "frozenset", "slice", "range", "complex", "getattr", "dict", "list", "tuple",
                              "int", "float", "bool", "str", "bytes", "bytearray", "object", "Ellipsis", "NotImplemented")
} | {("collections", "OrderedDict"), ("collections", "defaultdict"), ("copyreg", "_reconstructor"),
     ("copyreg", "__newobj__"), ("_operator", "getitem"), ("operator", "getitem"), ("numpy", "dtype")})


def scan_globals(payload: Any) -> list[str]:
    """The classes and functions that a pickle names and `allowed_global` refuses, read from its
    opcodes without running any of it (for `adopt-cache`)."""
    import pickletools

    refused: list[str] = []
    strings: list[str] = []
    for op, arg, _ in pickletools.genops(bytes(payload)):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
            strings.append(str(arg))
        elif op.name == "GLOBAL":
            module, name = str(arg).split(" ", 1)
            if not allowed_global(module, name):
                refused.append(f"{module}.{name}")
        elif op.name == "STACK_GLOBAL":
            if len(strings) < 2:
                refused.append("a global it builds at load time")
            elif not allowed_global(strings[-2], strings[-1]):
                refused.append(f"{strings[-2]}.{strings[-1]}")
    return refused


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, example_inputs: Sequence[Any]) -> None:
        super().__init__(file)
        self.example_inputs = example_inputs

    def find_class(self, module: str, name: str) -> Any:
        if not allowed_global(module, name):
            raise pickle.UnpicklingError(f"it names {module}.{name}, which no compiled graph holds")
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        kind, value = pid
        if kind == "region":
            return torch.nn.Identity()  # a stand-in until the runtime module is set
        if kind == "weight":
            return self.example_inputs[value].detach()
        raise pickle.UnpicklingError(f"unknown reference {pid!r}")


# ---- the cache ---------------------------------------------------------------------------------


class GraphCache:
    """Graph entries beside the engine cache's entries (same directory, size limit and eviction)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @classmethod
    def for_options(cls, options: Options) -> GraphCache | None:
        """None where regions do not come from the engine cache (no cache, ONNX Runtime only, no
        engines buildable here) or the graph must be exported anyway (dump_onnx_dir)."""
        directory = options.engine_cache_path
        if directory is None or options.dump_onnx_dir or options.runtime == "onnxruntime":
            return None
        if not _targets.can_build(options) or not _trust.trusted_directory(directory, "engine cache"):
            return None
        return cls(directory)

    def load(
        self, key: Key, example_inputs: Sequence[Any], on_header: Callable[[list[RegionRef]], None] | None = None
    ) -> GraphEntry | None:
        """The entry, or None: a miss, or a file that fails a check (a warning). `on_header`: see
        `decode`."""
        path = path_of(self.directory, key)
        store.flush()  # this process may still be writing it
        try:
            data = _files.read_buffer(path, limit=store.GRAPH_MAX_BYTES, what="a graph cache entry")
            entry = decode(data, key, example_inputs, on_header) if data is not None else None
        except (OSError, CorruptEntry) as exc:
            log.warning("trtrtx: graph cache entry %s is unusable (%s); compiling the graph again", path, exc)
            entry = None
        if entry is not None:
            missing = [r.name for r in entry.regions if not _engine_cache.entry_path(self.directory, r.engine).exists()]
            if missing:
                log.debug("trtrtx: graph cache entry %s: the engines of %s are gone; compiling again", path.name, missing)
                entry = None
        _stats.count("graph_cache_hits" if entry is not None else "graph_cache_misses")
        if entry is not None:
            with contextlib.suppress(OSError):
                os.utime(path)  # least recently used = oldest mtime, as for engine entries
        return entry

    def store_later(self, key: Key, entry: GraphEntry, weights: dict[int, torch.Tensor]) -> None:
        """Encode now (the graph must not change under the pickler), write behind: after the
        engine entries that this compile submitted, which it names."""
        try:
            chunks = encode(key, entry, weights)
        except Exception as exc:  # what pickle cannot store (an op or constant of an unusual kind)
            log.info("trtrtx: this graph is not cached (%s: %s)", type(exc).__name__, exc)
            return
        store.write_behind(key, self._write, key, chunks)

    def _write(self, key: Key, chunks: list[bytes]) -> None:
        try:
            _files.atomic_write(path_of(self.directory, key), chunks, lock=self.directory / ".lock")
            _stats.count("graph_cache_stores")
        except OSError as exc:
            log.warning("trtrtx: cannot write to the graph cache %s (%s)", self.directory, exc)
