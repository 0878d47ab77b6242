"""Weights that change after compile: never a stale result; the engine built again, or refitted.

Lowering freezes parameters and buffers into the regions (ONNX initializers, engine weights),
yet Dynamo passes them to the compiled graph on every call. `WeightGuard` wraps the compiled
graph and compares, on every call, what the regions froze with what the call passes: the same
tensor objects (a replaced parameter is another object) at the same version counter (optimizer
steps, `mul_`, `copy_` and `load_state_dict` move it). The check is two C-level loops over one
tuple each (`map` over the tensors), no Python frame per weight; from the second call on it runs
after the graph is enqueued, while the GPU works (`WeightGuard.run_then_check`), unless the graph
moves its own weights' versions.

On a change, every region that froze a changed weight is brought up to date before the call
runs: the weights stay ONNX initializers under their own names (the bridge keeps them out of
constant folding, `export_region(keep_weights=True)`), so the new values replace them by name:
the engine is built again from the updated model (weights="checked"), or refitted by
TensorRT-RTX's refitter (weights="refit"; the weights its ONNX parser combined, e.g. BatchNorm
into a scale, through its ONNX parser refitter), ONNX Runtime gets a new session, and the new
engine is stored in the engine cache under the key of the new weights, so that a process
compiling the fine-tuned model finds it. A region whose model lacks a weight's initializer is
exported and built again. PyTorch's parts of the graph
read the live weights (the frozen tensors share their storage), so only a replaced tensor is
rebound there. A weight replaced by a tensor of another shape, dtype or device makes the graph
run in PyTorch from then on, with a warning (Dynamo's guards normally recompile first).

One graph that several sets of weights call (regional compilation: each block's parameters in
turn) is told from a weight change and made to take those weights as inputs in shared.py.

Long because checking, refitting and rebuilding share the guard's per-call path and the
regions' state. The ONNX initializers they replace are read and written in
`export/initializers.py`.
"""

from __future__ import annotations

import logging
import operator
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from .. import _stats, _torch_compat
from .._log import one_line
from .._options import Options
from .._types import OnnxRegion
from ..cache.engines import fetch_attr
from ..export.bridge import EXPORTED_AS
from ..export.initializers import initializer_specs, initializer_value, spec, with_weights
from ..lower.lowering import is_weight
from ..run.executors import OrtExecutor, TorchExecutor, TrtExecutor, stream_capturing
from ..run.region import RegionModule, picker
from ..run.validation import RECHECKS
from .region import checked
from .shared import WeightSets, park, switch
from .shared_graph import frozen_index
from .updates import UPDATES

log = logging.getLogger("rtx_backend")

_VERSION = operator.attrgetter("_version")


def guard_weights(
    fn: Callable[..., Any],
    roots: Sequence[torch.fx.GraphModule],
    example_inputs: Sequence[Any],
    eager: Callable[..., Any],
    options: Options,
    overrides: Callable[[], dict[str, Any]],
    direct: torch.fx.GraphModule | None = None,
) -> Callable[..., Any]:
    """`fn` behind a weight check (weights checked, `region.checked`, and a weight was frozen), else
    `fn`. `eager`: Dynamo's graph, run when a weight changes in a way no engine can follow;
    `overrides`: the dynamic-shape overrides, for a region that must be built again; `direct`: the
    partitioned graph when it computes `fn`'s results from Dynamo's inputs as they are (a graph
    that several sets of weights share is made anew from it: shared.py)."""
    if not checked(options) or not roots:
        return fn
    used = sorted({i for root in roots for i in _frozen_uses(root)
                   if i < len(example_inputs) and is_weight(example_inputs[i])})
    if not used:
        return fn
    count_fused_steps()
    return WeightGuard(fn, list(roots), example_inputs, used, eager, options, overrides, direct)


class FusedSteps:
    """The one global optimizer post-step hook that counts fused optimizers' steps (see
    `count_fused_steps`): registered once per process; `handle` is torch's (None where this
    torch has no global step hooks)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.registered = False
        self.handle: Any = None

    def register(self) -> None:
        with self._lock:
            if self.registered:
                return
            self.registered = True
            try:
                from torch.optim.optimizer import register_optimizer_step_post_hook

                self.handle = register_optimizer_step_post_hook(_count_fused_step)
            except (ImportError, AttributeError) as exc:  # this torch has no global step hooks
                log.debug("trtrtx: fused optimizer steps cannot be counted here (%s)", exc)


FUSED_STEPS = FusedSteps()


def count_fused_steps() -> None:
    """Make the steps of fused optimizers (`torch.optim.Adam(..., fused=True)`) move their
    parameters' version counters, as every other in-place change does: their fused kernels
    write the parameters without counting it, and the check would not see the step. One global
    optimizer post-step hook (registered once), for the param groups that are fused only."""
    FUSED_STEPS.register()


def _count_fused_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    params = [p for group in optimizer.param_groups if group.get("fused") for p in group["params"]]
    if params:
        with torch.no_grad():
            _torch_compat.increment_version(params)


class WeightGuard:
    """The compiled graph, called after checking that the frozen weights are the call's."""

    # Dynamo wraps what the backend returns (torch._dynamo.disable), and functools.wraps copies the
    # guard's __dict__ into the wrapper: in slots, the weights and graphs it lets go of are not kept
    # alive there (a replaced parameter, the engines of a graph made anew: shared.py)
    __slots__ = ("__dict__", "__weakref__", "direct", "fn", "roots", "tensors")

    def __init__(
        self,
        fn: Callable[..., Any],
        roots: list[torch.fx.GraphModule],
        example_inputs: Sequence[Any],
        used: list[int],
        eager: Callable[..., Any],
        options: Options,
        overrides: Callable[[], dict[str, Any]],
        direct: torch.fx.GraphModule | None = None,
    ) -> None:
        self.fn = fn
        self.autocast_off = getattr(fn, "autocast_off", False)
        self.roots = roots
        self.direct = direct
        self.sets = WeightSets()  # several sets of weights calling this one graph? (shared.py)
        self.eager = eager
        self.options = options
        self.overrides = overrides
        self.vindices: tuple[int, ...] = ()
        self._watch(used, example_inputs)
        self.lock = threading.Lock()
        self.capture_said = False
        # check while the GPU runs the call (run_then_check): None until the first call has shown
        # whether the graph itself moves its weights' versions
        self.overlap: bool | None = None
        self.on_cuda = any(t.is_cuda for t in self.tensors)  # (a capture is possible: checked per call)
        self.rechecks = RECHECKS.count  # executors armed for a recheck when this last checked first

    def _watch(self, used: Sequence[int], inputs: Sequence[Any]) -> None:
        """Check the weights at Dynamo input indices `used`, as they are in `inputs`, from now on."""
        self.indices = tuple(used)
        self.pick = picker(used)
        self.tensors: tuple[torch.Tensor, ...] = tuple(inputs[i] for i in used)
        self._track(self.tensors)
        # the constant each index is frozen as (the object to rebind when a parameter is replaced)
        found = _all_constants(self.roots)
        self.frozen = {i: found.get(i) for i in used}

    def _track(self, weights: Sequence[torch.Tensor], versions: dict[int, int] | None = None) -> None:
        """Count versions of these weights (`versions`: as read before, by index), except
        inference tensors, which have no version counter: an in-place change to one of them
        cannot be seen (replacing it can)."""
        versioned = [i for i, t in zip(self.indices, weights) if not t.is_inference()]
        if len(versioned) < len(self.indices) and len(versioned) != len(self.vindices):
            log.warning("trtrtx: %d weight(s) are inference tensors (made under torch.inference_mode), which "
                        "count no in-place changes: a change to one in place is not seen (replacing it is)",
                        len(self.indices) - len(versioned))
        self.vindices = tuple(versioned)
        # every weight counts versions (the common case): the same picker, so a call picks once
        self.vpick = self.pick if len(versioned) == len(self.indices) else picker(versioned)
        if versions is None:
            versions = {i: t._version for i, t in zip(self.indices, weights) if not t.is_inference()}
        self.versions = tuple(versions[i] for i in versioned)

    def same(self, args: Sequence[Any]) -> bool:
        """Whether the call's weights are those the regions froze."""
        try:
            # two C loops: an unchanged weight is the same object (no __eq__ runs; another tensor in
            # its place raises here or compares False, except a one-element tensor of the same value,
            # which gives the same result and is seen by its version counter from then on), at the
            # same version
            weights = self.pick(args)
            versioned = weights if self.vpick is self.pick else self.vpick(args)
            return weights == self.tensors and tuple(map(_VERSION, versioned)) == self.versions
        except Exception:
            return False

    def __call__(self, *args: Any) -> Any:
        # (not after an executor was armed for a first-call check outside a compile, e.g. put in
        # place by a background update: that check must see the weights it was made with, so
        # they are checked first)
        if self.overlap and self.rechecks == RECHECKS.count and not (self.on_cuda and stream_capturing()):
            return self.run_then_check(args)
        self.rechecks = RECHECKS.count
        if not self.same(args):
            return self.refreshed_call(args)
        if self.sets.swapped:  # the weights the last call swapped in stay: a replacement, not a block
            self.catch_up()
        out = self.fn(*args)
        if self.overlap is None and not (self.on_cuda and stream_capturing()):
            # a graph that does not move its own weights' versions (no buffer updated in place, as
            # BatchNorm in training mode does) can be checked while the GPU runs it, from the next call
            self.overlap = self.same(args)
        return out

    def run_then_check(self, args: Sequence[Any]) -> Any:
        """Enqueue the graph first and check the weights while the GPU runs it: the check's host
        time then hides behind the GPU's work. Should they have changed, that run used the old
        ones: its outputs are dropped, the engines refitted once it is done, and the call run
        again."""
        try:
            out = self.fn(*args)
        except Exception:
            if self.same(args):
                raise
            out = None  # a changed weight made the old graph fail: it runs again with the new ones
        if self.same(args):
            return out
        if self.on_cuda:
            torch.cuda.current_stream().synchronize()  # the dropped run reads the old weights
        return self.refreshed_call(args)

    def refreshed_call(self, args: Sequence[Any]) -> Any:
        """The call after a change: the regions brought up to date, the graph run; the background
        updates it started begin once it has run (not beside it, which would slow it down)."""
        try:
            if not self.refresh(args):
                return self.eager(*args)
            return self.fn(*args)
        finally:
            UPDATES.start_deferred()

    def refresh(self, args: Sequence[Any]) -> bool:
        """Bring every region that froze a changed weight up to date with the call's weights.
        False during a CUDA graph capture, where nothing can be refitted or built: that call
        runs in PyTorch (recorded into the graph with the new weights), the next one refits."""
        if _capturing(args):
            if not self.capture_said:
                self.capture_said = True
                log.warning("trtrtx: the weights changed before a CUDA graph capture, which cannot refit or build "
                            "engines: the captured call runs in PyTorch. Call the compiled model once outside "
                            "the capture after changing weights (torch.cuda.graph's warm-up) to update them first.")
            return False
        with self.lock:  # concurrent calls wait here, then find the weights up to date
            weights = self.pick(args)
            # read before the values are: a change made meanwhile is seen on the next call
            now = {i: -1 if t.is_inference() else t._version for i, t in zip(self.indices, weights)}
            versions = tuple(now[i] for i in self.vindices)
            moved = {i for i, v in zip(self.vindices, self.versions) if now[i] != v}
            changed = [i for i, a, t in zip(self.indices, weights, self.tensors) if a is not t or i in moved]
            if not changed:
                self.versions = versions
                return True
            by_index = dict(zip(self.indices, weights))
            old = dict(zip(self.indices, self.tensors))
            unfit = [i for i in changed if not _same_spec(by_index[i], old[i])]
            if unfit:
                self._to_pytorch(unfit, by_index, old)
                return True
            # (a function that reads the live weights, as inductor's code for Dynamo's graph does
            # once option fastest keeps it, leaves the regions it no longer runs as they are)
            live = getattr(self.fn, "reads_live_weights", False)
            swap = not live and self.sets.is_swap(changed, by_index, old)
            if swap:
                shared = self.sets.returning(changed, by_index)
                if shared is not None:  # several sets of weights call this graph (shared.py)
                    self._share(shared, args)
                    return True
            gone = [weakref.ref(old[i]) for i in changed] if swap else []
            rebound = [i for i in changed if by_index[i] is not old[i]]
            del old  # (so that `gone` tells whether anything else holds the weights swapped away)
            self.tensors, self.versions = tuple(weights), versions
            if rebound:
                self._track(self.tensors, now)
            if live:
                return True
            for i in rebound:
                self._rebind(i, by_index[i])
            if swap and self.sets.park(changed, gone):  # another block's weights? the next call tells
                for module in _regions(self.roots):
                    park(module, set(changed))
                UPDATES.hold(self)
                self.rechecks = -1  # (that call checks before it runs)
                return True
            parked = self.sets.settle()  # (regions an earlier swap parked take the weights too)
            if parked:
                UPDATES.unhold(self)
            for module in _regions(self.roots):
                self._update(module, set(changed) | parked)
            return True

    def catch_up(self) -> None:
        """Bring the parked regions up to date: the swap that parked them was a replacement."""
        with self.lock:
            UPDATES.unhold(self)
            parked = self.sets.settle()
            if parked:
                for module in _regions(self.roots):
                    self._update(module, parked)
        UPDATES.start_deferred()

    def _share(self, shared: frozenset[int], args: Sequence[Any]) -> None:
        """Several sets of weights call this graph: its regions take them as inputs from now on."""
        direct = self.direct
        if direct is None or len(list(direct.graph.find_nodes(op="placeholder"))) != len(args):
            log.warning("trtrtx: this graph is called with other weights on every call (one graph for several blocks "
                        "of the model, as regional compilation makes), and its compiled form cannot take them as "
                        "inputs (lowering changed its calling convention); it runs in PyTorch from now on")
            _stats.count("weight_fallbacks")
            self.fn = self.eager
            self.indices, self.pick, self.tensors = (), picker(()), ()
            self.vindices, self.vpick, self.versions = (), picker(()), ()
            return
        UPDATES.unhold(self)
        self.fn, self.direct = switch(direct, shared, self.options, self.overrides)
        self.autocast_off = getattr(self.fn, "autocast_off", False)
        self.roots = [self.direct]
        self._watch(sorted(i for i in _frozen_uses(self.direct) if i < len(args) and is_weight(args[i])), args)
        self.overlap = None

    def _update(self, module: RegionModule, changed: set[int]) -> None:
        constants = _constants(module.graph_module)
        if not changed.intersection(constants):
            return
        try:
            update_region(module, current_values(module, constants), self.options, self.overrides)
        except Exception as exc:  # never a stale answer: PyTorch runs the region with the live weights
            if self.options.strict:
                raise
            _new_generation(module, in_pytorch=True)  # (an update of older weights under way is dropped)
            _not_taken(module, exc)

    def _rebind(self, index: int, tensor: torch.Tensor) -> None:
        """Point every use of the constant frozen for `index` at the new tensor."""
        old = self.frozen.get(index)
        new = tensor.detach()
        if old is not None:
            for module in _graph_modules(self.roots):
                for store in (module._buffers, module.__dict__):
                    for name, value in list(store.items()):
                        if value is old:
                            store[name] = new
        self.frozen[index] = new

    def _to_pytorch(self, unfit: list[int], by_index: dict[int, Any], old: dict[int, Any]) -> None:
        """A weight replaced by one of another shape, dtype or device: run Dynamo's graph."""
        described = "; ".join(f"input {i}: {_describe(old[i])} -> {_describe(by_index[i])}" for i in unfit)
        log.warning("trtrtx: a weight was replaced by a tensor of another shape, dtype or device (%s); this graph "
                    "runs in PyTorch from now on (compile the model again to run it on TensorRT-RTX)", described)
        _stats.count("weight_fallbacks")
        self.fn = self.eager
        self.indices, self.pick, self.tensors = (), picker(()), ()
        self.vindices, self.vpick, self.versions = (), picker(()), ()


def update_region(
    module: RegionModule, values: dict[str, torch.Tensor], options: Options, overrides: Callable[[], dict[str, Any]]
) -> str:
    """Give one region the weights `values` (initializer name -> tensor, every weight it froze);
    returns what was done: "refit", "rebuild", "background" (under way on the update thread,
    PyTorch runs the region meanwhile: see updates.py) or "" (PyTorch runs it: nothing to do)."""
    with UPDATES.swap:
        if module.building:  # its engine is still being built from older weights: it takes these next
            module.generation += 1
            return "background"
    executor = module.updating or module.executor  # (the engine's, also while an update is under way)
    if isinstance(executor, TorchExecutor) or module.onnx is None:
        return ""
    start = time.perf_counter()
    onnx = module.onnx
    specs = initializer_specs(onnx)
    unmatched = sorted(n for n, t in values.items() if specs.get(n) != spec(t))
    if unmatched:
        _new_generation(module)
        _rebuild_region(module, options, overrides())
        return _done(module, "rebuild", f"exported and built again: its model has no initializer for {unmatched[:3]}",
                     start)
    made_for = module.weight_versions()  # read before the values are, as the guard reads them
    region = with_weights(onnx, values)  # a snapshot: the weights may change again while it is built
    if options.weight_update == "wait" or options.strict:
        _new_generation(module)
        action, how, new, engine = _take(module, executor, onnx, region, values, options)
        _install(module, region, new, engine, options, made_for)
        return _done(module, action, how, start)
    generation = _new_generation(module, updating=executor, in_pytorch=True)
    UPDATES.defer(lambda: _in_background(module, generation, executor, onnx, region, values, options, start,
                                         made_for))
    return "background"


def current_values(module: RegionModule, constants: dict[int, tuple[str, torch.Tensor | None]] | None = None) -> dict[str, torch.Tensor]:
    """The region's frozen weights as they are now, by initializer name."""
    found = constants if constants is not None else _constants(module.graph_module)
    return {EXPORTED_AS + target: value for target, value in found.values() if value is not None}


def _new_generation(module: RegionModule, updating: Any = None, in_pytorch: bool = False) -> int:
    """Start a new generation of the region's weights, and return it: an update of an older one
    still under way is dropped when it ends. `updating`: the engine's executor, which the update
    thread brings the new weights to; `in_pytorch`: PyTorch runs the region meanwhile (for good,
    without `updating`)."""
    with UPDATES.swap:
        module.generation += 1
        module.updating = updating
        if in_pytorch:
            module.executor = TorchExecutor(module.graph_module)
            if updating is not None:
                module.why = "its weights changed: PyTorch runs it until its engine has the new ones"
        return module.generation


def _take(module: RegionModule, executor: Any, onnx: OnnxRegion, region: OnnxRegion, values: dict[str, torch.Tensor],
          options: Options) -> tuple[str, str, Any, Any]:
    """The region's executor with the weights of `region`: (action, how, executor, engine)."""
    from . import region as _region

    if isinstance(executor, TrtExecutor):
        if executor.refit(values, lambda name: initializer_value(onnx, name), region.source):
            return "refit", "engine refitted", executor, executor.serialized()
        profile = module.profile.profile if module.profile is not None else {}
        engine = _region.build_for(region.source, options, profile)
        return "rebuild", "engine built again (it is not refittable)", TrtExecutor(engine, region, options,
                                                                                    module.name), engine
    return "refit", "ONNX Runtime session made with the new weights", OrtExecutor(region), None


def _in_background(module: RegionModule, generation: int, executor: Any, onnx: OnnxRegion, region: OnnxRegion,
                   values: dict[str, torch.Tensor], options: Options, start: float,
                   made_for: tuple[tuple[int, int], ...]) -> None:
    """One update on the update thread: skipped or dropped if a later change overtook it."""
    if module.generation != generation:
        _stats.count("weight_updates_overtaken")
        return
    try:
        action, how, new, engine = _take(module, executor, onnx, region, values, options)
        if isinstance(new, TrtExecutor):
            new.ready()  # its contexts made here, not on the next call
    except Exception as exc:  # PyTorch runs the region already: it goes on doing so
        with UPDATES.swap:
            if module.generation != generation:
                return
            module.updating = None
            module.why = f"its weights changed and it could not take the new ones ({one_line(exc)})"
        _not_taken(module, exc)
        return
    with UPDATES.swap:
        if module.generation != generation:
            _stats.count("weight_updates_overtaken")
            return
        module.updating = None
        _install(module, region, new, engine, options, made_for)
        RECHECKS.arm()
    _done(module, action, f"{how} in the background", start)


def _not_taken(module: RegionModule, exc: BaseException) -> None:
    """Say that the region could not take its new weights, and count it (PyTorch runs it now)."""
    log.warning("trtrtx: region %s: its weights changed and it could not take the new ones (%s); "
                "it runs in PyTorch from now on", module.name, one_line(exc))
    log.debug("trtrtx: region %s: weight update failed", module.name, exc_info=exc)
    _stats.count("weight_fallbacks")


def _done(module: RegionModule, action: str, how: str, start: float) -> str:
    _stats.count(f"weight_{action}s")
    log.info("trtrtx: region %s: weights changed; %s in %.2fs", module.name, how, time.perf_counter() - start)
    return action


def _install(module: RegionModule, region: OnnxRegion, executor: Any, engine: Any, options: Options,
             made_for: tuple[tuple[int, int], ...]) -> None:
    """Put the executor for the new weights in place: the engine (or none), its cache entry under
    the new weights' key, the widening builder bound to the new model, first-call validation armed
    again, and the executor last (a call on another thread then finds the rest in place)."""
    from ..cache import engines as _engine_cache
    from . import region as _region

    module.onnx = region
    key = _store(module, region, engine, options) if engine is not None else None
    module.engine = engine
    module.engine_key = key
    if module.profile is not None:
        module.profile.build = lambda profile: _region.widened_engine(region, options, key, profile)
    module.validate = options.validate
    module.validated_executor = None
    module.checked = None
    module.fitted_shapes = None
    cache = _engine_cache.EngineCache.for_options(options) if key is not None else None
    module.on_validated = (executor, _engine_cache.Validation(cache, key).mark) if cache and key else None
    module.why = ""
    executor.made_for = made_for
    module.executor = executor


def _store(module: RegionModule, region: OnnxRegion, engine: Any, options: Options) -> Any:
    """Store the region's engine under the key of its new weights; returns the key (or None)."""
    from ..cache import engines as _engine_cache

    cache = _engine_cache.EngineCache.for_options(options)
    old = module.engine_key
    if cache is None or old is None:
        return None
    digest = _engine_cache.graph_digest(module.graph_module)
    if digest is None:
        return None
    profile = module.profile.profile if module.profile is not None else {}
    fields = {**old.fields, "graph": digest}
    key = _engine_cache.with_profile(_engine_cache.Key(_engine_cache.make_key(fields), fields), profile)
    cache.store_later(key, _engine_cache.EngineEntry(region, bytes(engine), profile))
    return key


def _rebuild_region(module: RegionModule, options: Options, overrides: dict[str, Any]) -> None:
    """Export and build the region again from its PyTorch graph (which reads the new weights)."""
    from . import region as _region

    graph = module.graph_module
    # (built now, whatever option engine_build says: this region's module takes the new engine)
    fresh = _region.compile_region(module.name, torch.fx.GraphModule(graph, _copy_graph(graph)), overrides, options)
    module.take(fresh)


def _copy_graph(graph_module: torch.fx.GraphModule) -> torch.fx.Graph:
    import copy

    return copy.deepcopy(graph_module.graph)


# ---- helpers -----------------------------------------------------------------------------------


def _same_spec(a: Any, b: Any) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and a.dtype == b.dtype and a.device == b.device)


def _capturing(args: Sequence[Any]) -> bool:
    """Whether the current CUDA stream is being captured (never for a call without CUDA tensors)."""
    if not any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
        return False
    return bool(torch.cuda.is_current_stream_capturing())


def _describe(t: Any) -> str:
    return f"{tuple(t.shape)} {t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__


def _graph_modules(roots: Sequence[torch.nn.Module]) -> Iterator[torch.nn.Module]:
    seen: set[int] = set()
    for root in roots:
        for module in root.modules():
            if id(module) not in seen:
                seen.add(id(module))
                yield module


def _regions(roots: Sequence[torch.nn.Module]) -> list[RegionModule]:
    return [m for m in _graph_modules(roots) if isinstance(m, RegionModule)]


def _constants(gm: torch.fx.GraphModule) -> dict[int, tuple[str, torch.Tensor | None]]:
    """The frozen constants `gm`'s graph reads: Dynamo input index -> (attribute path, tensor or
    None), in one pass over its get_attr nodes (the first path of an index is kept)."""
    found: dict[int, tuple[str, torch.Tensor | None]] = {}
    for node in gm.graph.find_nodes(op="get_attr"):
        target = str(node.target)
        index = frozen_index(target)
        if index is None or index in found:
            continue
        value = fetch_attr(gm, target)
        found[index] = (target, value if isinstance(value, torch.Tensor) else None)
    return found


def _frozen_uses(root: torch.nn.Module) -> set[int]:
    """The Dynamo inputs whose frozen constants the graphs under `root` read."""
    uses: set[int] = set()
    for module in _graph_modules([root]):
        if isinstance(module, torch.fx.GraphModule):
            uses.update(_constants(module))
    return uses


def _all_constants(roots: Sequence[torch.nn.Module]) -> dict[int, torch.Tensor]:
    """Each frozen constant under `roots` by its Dynamo input index (the first graph's, where
    several graphs read it)."""
    found: dict[int, torch.Tensor] = {}
    for module in _graph_modules(roots):
        if isinstance(module, torch.fx.GraphModule):
            for index, (_, value) in _constants(module).items():
                if value is not None:
                    found.setdefault(index, value)
    return found
