"""The ONNX exporter's op registry, complete in what it names but filled in only where an export looks.

torch.onnx.export builds ONNXRegistry.from_torchlib() on every call: it infers an ONNX signature
for each of some 550 onnxscript functions, parsing the source of each traced one (about half a
second to a second per region on a small CPU), while a region dispatches a dozen ops. Which ops
the registry names is cheap to know and must stay complete: it decides what torch.export's
decompositions keep whole. So the registry given to the exporter here names every op the full one
names, with the same targets and opset choices, and infers an op's onnxscript signatures only when
the exporter dispatches that op: once per process, as from_torchlib would have inferred them.

If the exporter fails with that registry, it runs once more with the full one (built once per
process, shared with exporter_ops); a torch whose private exporter API moved gets the public
torch.onnx.export.

The exporter also decomposes every program it is given (torch.export's run_decompositions, a
re-trace of the whole graph: about 0.2 s per region once warm). A region comes from aot_autograd
already decomposed for this exporter, so when no op of the exported program is one that the pass
would decompose, translate skips it (see `already_decomposed`).

Long because the lazy registry mirrors, step by step, how the exporter builds its own
registry, and the translate path needs both, with the fallback to the public export.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from .. import _stats, _torch_compat
from .._log import say_once
from . import signatures

log = logging.getLogger("rtx_backend")

# The exporter's internals this module works with (see _torch_compat.exporter for why).
_onnx_constants = _torch_compat.onnx_constants()
_constants = _torch_compat.exporter("_constants")
_core = _torch_compat.exporter("_core")
_decomp = _torch_compat.exporter("_decomp")
_fx_passes = _torch_compat.exporter("_fx_passes")
_registration = _torch_compat.exporter("_registration")
_torchlib_registry = _torch_compat.torchlib_registry()



def opset_version() -> int:
    """The opset torch.onnx.export(dynamo=True) targets by default, and builds its registry for."""
    return max(_onnx_constants.ONNX_DEFAULT_OPSET, _constants.TORCHLIB_OPSET)


def _torchlib_functions() -> Iterator[tuple[str, Any, bool]]:
    """(qualified name, onnxscript function, is_complex), as onnxscript's get_torchlib_ops lists
    them, without reading function_ir (which parses the source of a traced function)."""
    from onnxscript.function_libs.torch_lib import ops, registration  # importing ops registers them

    del ops
    for qualified_name, functions in registration.default_registry.items():
        if qualified_name.startswith("internal::"):
            continue
        yield from ((qualified_name, f, False) for f in functions.overloads)
        yield from ((qualified_name, f, True) for f in functions.complex)


class _Index:
    """Every entry of from_torchlib(opset): torch's own as they are, onnxscript's deferred.

    A deferred entry is an OnnxDecompMeta with the same target, function and flags and no
    signature; `entries` swaps it for the one from_torchlib builds, the first time it is asked.
    """

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.inferred = 0  # onnxscript entries whose signature was inferred (tests count them)
        self._lock = threading.Lock()
        staging = _registration.ONNXRegistry()
        staging._opset_version = opset
        for meta in _torchlib_registry.get_torchlib_ops():
            staging._register(meta.fx_target, meta)
        self._deferred: list[Any] = []  # keeps the placeholders alive, so their ids stay theirs
        targets: dict[str, Any] = {}
        for qualified_name, function, is_complex in _torchlib_functions():
            try:  # guarded as from_torchlib guards it: one bad function does not cost the rest
                if qualified_name not in targets:
                    targets[qualified_name] = _registration._get_overload(qualified_name)
                target = targets[qualified_name]
                if target is None:
                    continue
                meta = _registration.OnnxDecompMeta(
                    onnx_function=function, fx_target=target, signature=None, is_custom=False,
                    is_complex=is_complex, skip_signature_inference=True,
                )
            except Exception as exc:
                log.debug("trtrtx: the exporter cannot register %s (%s); skipped", qualified_name, exc)
                continue
            self._deferred.append(meta)
            staging._register(target, meta)
        staging._cleanup_registry_based_on_opset_version()
        self._ids = {id(m) for m in self._deferred}
        self.functions: dict[Any, list[Any]] = staging.functions
        self.pending = {k for k, metas in self.functions.items() if any(id(m) in self._ids for m in metas)}

    def snapshot(self) -> tuple[dict[Any, list[Any]], set[Any]]:
        with self._lock:
            return {k: list(v) for k, v in self.functions.items()}, set(self.pending)

    def entries(self, key: Any) -> list[Any]:
        """The key's entries, signatures inferred; an entry whose inference fails is skipped, as
        from_torchlib skips it (and a key left with none is dropped, as from_torchlib drops it)."""
        with self._lock:
            if key in self.pending:
                built = [m for m in (self._build(m) for m in self.functions[key]) if m is not None]
                if built:
                    self.functions[key] = built
                else:
                    del self.functions[key]
                self.pending.discard(key)
            return list(self.functions.get(key, ()))

    def _build(self, meta: Any) -> Any:
        if id(meta) not in self._ids:
            return meta
        self.inferred += 1
        try:
            return _registration.OnnxDecompMeta(
                onnx_function=meta.onnx_function, fx_target=meta.fx_target, signature=None,
                is_custom=False, is_complex=meta.is_complex,
            )
        except Exception as exc:
            log.debug("trtrtx: the exporter cannot register %s (%s); skipped", meta.onnx_function, exc)
            return None


class LazyRegistry(_registration.ONNXRegistry):  # type: ignore[misc, name-defined]
    """from_torchlib's registry, whose onnxscript entries get their signatures when dispatched.

    Decompositions read `functions` for the ops' targets only (complete from the start); the
    dispatcher asks get_decomps, which fills the entry in first.
    """

    def __init__(self, index: _Index) -> None:
        super().__init__()
        self._opset_version = index.opset
        self._index = index
        self.functions, self._unfilled = index.snapshot()

    def get_decomps(self, target: Any) -> list[Any]:
        key = target.name() if isinstance(target, torch._ops.OpOverload) else target
        if key in self._unfilled:
            self._unfilled.discard(key)
            entries = self._index.entries(key)
            if entries:
                self.functions[key] = entries
            else:
                self.functions.pop(key, None)
        return super().get_decomps(target)


class Registries:
    """The process's registries: an index per opset (built once, grows as exports ask) and the
    exporter's full registry (slow: built once, and only when an export fails with the lazy one).
    Tests give the module a fresh one."""

    def __init__(self) -> None:
        self._index_lock = threading.Lock()
        self._full_lock = threading.Lock()  # another: an index is not kept waiting for the full registry
        self.indexes: dict[int, _Index] = {}
        self.full: Any = None

    def index(self, opset: int) -> _Index:
        with self._index_lock:
            if opset not in self.indexes:
                with quiet_registration():
                    self.indexes[opset] = _Index(opset)
            return self.indexes[opset]

    def full_registry(self) -> Any:
        with self._full_lock:
            if self.full is None:
                with quiet_registration():
                    self.full = _registration.ONNXRegistry.from_torchlib(opset_version())
            return self.full


REGISTRIES = Registries()


def index(opset: int | None = None) -> _Index:
    """The process's index for `opset` (default: the exporter's): built once, grows as exports ask."""
    return REGISTRIES.index(opset_version() if opset is None else opset)


def lazy_registry(opset: int | None = None) -> LazyRegistry:
    """A fresh registry for one export (it is the export's to change), over the shared index."""
    return LazyRegistry(index(opset))


def translate(
    exported: torch.export.ExportedProgram,
    args: tuple[Any, ...],
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    optimize: bool,
) -> Any:
    """What torch.onnx.export(exported, args, dynamo=True, ...) returns, without its registry
    rebuild; None when this torch's private exporter API is not the one this module knows."""
    core_export = _private_export()
    if core_export is None:
        return None
    common: dict[str, Any] = dict(
        dynamic_shapes={}, input_names=input_names, output_names=output_names, optimize=optimize,
        verbose=False, report=False, opset_version=opset_version(),
    )
    try:
        registry: Any = lazy_registry()
    except Exception as exc:
        say_once(f"trtrtx: cannot index the exporter's registry ({type(exc).__name__}: {exc}); "
                 "exports build the full registry", logging.DEBUG)
        registry = None
    if registry is not None:
        try:
            with _skipping_redecomposition(), signatures.memoized():
                return core_export(exported, args, registry=registry, **common)
        except Exception as exc:
            log.debug("trtrtx: ONNX export with the lazy registry failed (%s: %s); retrying with the "
                      "full registry", type(exc).__name__, str(exc).strip().split("\n", 1)[0])
    _stats.count("exports_with_full_registry")  # the bench and GPU runs show whether the lazy path held
    try:
        full = full_registry()
    except (AttributeError, TypeError) as exc:
        say_once(f"trtrtx: the exporter's registry cannot be built here ({exc}); using torch.onnx.export", logging.DEBUG)
        return None
    with signatures.memoized():
        return core_export(exported, args, registry=full, **common)


def _private_export() -> Callable[..., Any] | None:
    """torch.onnx's _core.export when it takes the arguments translate passes; None otherwise."""
    core_export = getattr(_core, "export", None)
    try:
        if core_export is None:
            raise AttributeError("torch.onnx._internal.exporter._core has no export")
        inspect.signature(core_export).bind(
            None, (), registry=None, dynamic_shapes={}, input_names=(), output_names=(), optimize=True,
            verbose=False, report=False, opset_version=0,
        )
    except (AttributeError, TypeError, ValueError) as exc:
        say_once(f"trtrtx: torch.onnx's private exporter API changed ({exc}); using torch.onnx.export", logging.DEBUG)
        return None
    return core_export


def already_decomposed(program: torch.export.ExportedProgram, registry: Any) -> bool:
    """Whether the exporter's decomposition pass would leave `program` as it is: one graph (no
    subgraphs of higher-order ops), no mutation, no op that the pass's table decomposes (the table
    the exporter builds from `registry`: PyTorch's decompositions of ops it cannot translate), and
    no composite op (the pass decomposes them whatever the table says) but reshape.

    Reshape is the composite op that our lowering itself puts in every graph that changes a shape
    (views become reshapes: `_lowering.views_to_reshapes`). The pass would turn it back into a
    view; the exporter translates both into the same ONNX Reshape, so it may stay. Without that,
    every convolutional network (a flatten before its classifier) paid the pass: 1.4 s of
    ResNet-50's cold compile on the H200. Getitems of tuple outputs (batch norm, max pooling) are
    no reason to run it either (the pass only adds unused getitems of the other outputs)."""
    if program.graph_signature.buffers_to_mutate or program.graph_signature.user_inputs_to_mutate:
        return False
    if any(isinstance(m, torch.fx.GraphModule) for m in program.graph_module.children()):
        return False
    table = _decomposition_table(frozenset(_decomp.get_onnx_implemented_overloads(registry)))
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            if target in table or target._schema.is_mutable:
                return False
            if _composite(target) and not (target in _TRANSLATED_AS_IS and registry.is_registered(target)):
                return False
        elif getattr(target, "__module__", None) not in ("operator", "_operator"):  # getitem, SymInt arithmetic
            return False
    return True


@functools.lru_cache(maxsize=4)
def _decomposition_table(implemented: frozenset[Any]) -> dict[Any, Any]:
    """The pass's table for a registry that implements `implemented` (the same for every export
    over the shared index: built once, not on every export; about 45 ms on a small CPU)."""
    return _decomp.create_onnx_friendly_decomposition_table(set(implemented))


# Composite ops that may stay: the exporter translates reshape as it is into what the pass's view
# would give, and the pass keeps scaled_dot_product_attention as it is (the registry implements
# it). Attention is what the bridge makes of CUDA's fused kernels (unfuse_attention): without it,
# every transformer exported on CUDA paid the pass, 2.6 s of BERT-base's cold compile on the H200.
_TRANSLATED_AS_IS = frozenset({torch.ops.aten.reshape.default, torch.ops.aten.scaled_dot_product_attention.default})


def _composite(op: torch._ops.OpOverload) -> bool:
    key = _torch_compat.DispatchKey.CompositeImplicitAutograd
    return _torch_compat.dispatch_has_kernel_for_dispatch_key(op.name(), key) or key in op.py_kernels


class _Skipping(threading.local):
    """Whether this thread's export may skip the decomposition pass; `patch_lock` guards putting
    the check in front of the exporter's pass (once per process)."""

    skip = False
    seen = False  # whether the pass ran (through the patched function) since the skip was allowed
    patch_lock = threading.Lock()  # a class attribute: one for all threads


_SKIPPING = _Skipping()


@contextlib.contextmanager
def _skipping_redecomposition() -> Iterator[None]:
    """Within: the exporter's decomposition pass returns an `already_decomposed` program as it is
    (this thread only; other exports, and a retry with the full registry, run the pass)."""
    with _Skipping.patch_lock:
        if not getattr(_fx_passes.decompose_with_registry, "_trtrtx", False):
            _fx_passes.decompose_with_registry = _decompose_unless_decomposed(_fx_passes.decompose_with_registry)
    _SKIPPING.skip, _SKIPPING.seen = True, False
    try:
        yield
    finally:
        _SKIPPING.skip = False
    if not _SKIPPING.seen:  # this exporter ran no decomposition pass through the one patched here
        _stats.count("exports_pass_not_seen")
        say_once("trtrtx: the ONNX exporter did not run its decomposition pass through "
                 f"{_fx_passes.__name__}.decompose_with_registry; exports cannot skip it", logging.DEBUG)


def _decompose_unless_decomposed(decompose: Callable[..., Any]) -> Callable[..., Any]:
    def decompose_with_registry(program: Any, registry: Any) -> Any:
        _SKIPPING.seen = True
        if _SKIPPING.skip:
            try:
                skip = already_decomposed(program, registry)
            except Exception as exc:  # a program this check does not understand gets the pass
                log.debug("trtrtx: cannot tell whether the program is decomposed (%s: %s); decomposing",
                          type(exc).__name__, exc)
                _stats.count("exports_redecomposed_unchecked")
                skip = False
            if skip:
                _stats.count("exports_without_redecomposition")
                return program
        _stats.count("exports_redecomposed")  # (seconds of a large model's export: the bench shows it)
        return decompose(program, registry)

    decompose_with_registry._trtrtx = True  # type: ignore[attr-defined]
    return decompose_with_registry


@contextlib.contextmanager
def quiet_registration() -> Iterator[None]:
    """Without torchvision, the exporter's registration WARNs "torchvision is not installed.
    Skipping torchvision::nms" and the like: not a problem of the user's compile, so hushed."""
    quiet = logging.getLogger(_registration.__name__)
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        yield
    finally:
        quiet.setLevel(level)


def full_registry() -> Any:
    """The exporter's full registry, as torch.onnx.export builds it: slow (about a second), so built
    once per process, and only when an export fails with the lazy one."""
    return REGISTRIES.full_registry()
