"""The trtrtx backend: the whole pipeline, top to bottom.

    Dynamo FX graph -> lower to ATen (frozen weights) -> capability policy -> partition
    -> per region: ONNX bridge -> TensorRT-RTX engine -> runtime module
    -> GraphModule with regions swapped for runtime modules, returned to Dynamo
"""

from __future__ import annotations

import concurrent.futures
import copy
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import _stats, _targets, _trt
from ._errors import BuildError, OptionsError, RegionRefused, RtxBackendError, RuntimeUnavailableError
from ._options import Options, options_for_mode
from ._record import CompiledGraph, record
from ._types import EngineData, OnnxRegion, Profile, Reason
from .assemble.weights import guard_weights
from .build.engine import Network, build, parse_network
from .build.profiles import EngineProfile, dim_labels, make_profile, symbol_overrides
from .build.progress import build_progress
from .build.screen import check_region
from .cache import engines as _engine_cache
from .cache.engines import EngineCache, Validation
from .cache.engines import Entry as CacheEntry
from .cache.engines import Key as CacheKey
from .cache.graphs import Entry as GraphEntry
from .cache.graphs import GraphCache, RegionRef, graph_key, shape_state
from .export.bridge import export_region, input_specs
from .export.dump import dump_region
from .export.model import OnnxModel
from .lower.lowering import is_weight, lower, needs_autograd, without_autocast
from .plan.fixes import FIXES, TARGET_RULES
from .plan.partition import PartitionPlan, partition
from .plan.policy import CapabilitySupport
from .run.executors import OrtExecutor, TorchExecutor, TrtExecutor
from .run.region import RegionModule, direct_forward, region_device

log = logging.getLogger("rtx_backend")


def trtrtx(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, options: Any = None, mode: str | None = None
) -> Callable[..., Any]:
    """The `torch.compile` backend registered as "trtrtx".

    `options` is torch.compile's `options=` dict (see `rtx_backend.Options`); `mode` is its
    `mode=`: "default", or "reduce-overhead" (TensorRT-RTX's native CUDA graphs,
    cuda_graph_strategy="whole_graph_capture"); other modes raise OptionsError.
    """
    opts = options_for_mode(mode, options)
    _stats.count("backend_calls")
    if needs_autograd(example_inputs):
        log.warning(
            "trtrtx compiles inference graphs only; this graph records autograd history (grad mode "
            "is on and an input or parameter requires grad), so it runs in PyTorch. Call the model "
            "under torch.no_grad() or torch.inference_mode() to run it on TensorRT-RTX."
        )
        return gm.forward
    if any(isinstance(t, torch.Tensor) and t.is_meta for t in example_inputs):
        # no data to run on: PyTorch gives meta outputs of the right shapes and dtypes, as eager does
        log.info("trtrtx: this graph takes meta tensors; it runs in PyTorch (meta outputs, as in eager mode)")
        return gm.forward
    try:
        with _engine_cache.digest_scope():  # weights are hashed once: for the graph key and the engine keys
            roots: list[torch.fx.GraphModule] = []
            fn = compile_or_reuse(gm, example_inputs, opts, roots)
        # (inside the net below: a graph whose weights cannot be checked runs in PyTorch)
        return guard_weights(fn, roots, example_inputs, gm.forward, opts, lambda: symbol_overrides(gm, opts))
    except torch._dynamo.exc.TorchDynamoException as exc:
        if isinstance(exc, torch._dynamo.exc.RestartAnalysis):
            # e.g. dynamic=True makes float attributes (LayerNorm eps) symbolic, then Dynamo
            # specializes them and traces again: the same compile, not a recompile
            _stats.count("backend_restarts")
        raise  # Dynamo's own control flow (restarts, graph breaks): not ours to judge
    except Exception as exc:
        if opts.strict or isinstance(exc, OptionsError) or (
                isinstance(exc, RuntimeUnavailableError) and opts.runtime == "tensorrt_rtx"):
            raise  # an option that does not fit this graph is the user's to fix, not a fallback
        # Regions fall back one by one (compile_region); this is the net under the rest of the
        # pipeline (lowering, policy, partition): a working model must not become a crash.
        log.warning("trtrtx: this graph runs in PyTorch: compiling it failed (%s: %s)", type(exc).__name__, exc)
        log.debug("trtrtx: graph compilation failed", exc_info=exc)
        return gm.forward


def compile_or_reuse(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Options,
    roots: list[torch.fx.GraphModule] | None = None,
) -> Callable[..., Any]:
    """The compiled graph from the graph cache, else lowered and compiled (and then cached).
    `roots` gets the partitioned graph (whose regions froze the weights)."""
    roots = roots if roots is not None else []
    graphs = GraphCache.for_options(options)
    key = graph_key(gm, example_inputs, options) if graphs is not None else None
    overrides = symbol_overrides(gm, options)  # the option names model inputs: map it on Dynamo's graph
    if graphs is not None and key is not None:
        reused = from_graph_cache(graphs, key, example_inputs, options, overrides, roots)
        if reused is not None:
            return reused
    plans: list[PartitionPlan] = []
    plain: list[bool] = []
    shapes = shape_state() if graphs is not None and key is not None else None
    fn = lower(gm, example_inputs, lambda aten_gm, args: compile_graph(aten_gm, args, options, overrides, plans.append),
               on_plain=lambda: plain.append(True))
    roots.extend(p.graph_module for p in plans)
    if graphs is not None and key is not None and plain and len(plans) == 1:
        if shape_state() == shapes:
            to_graph_cache(graphs, key, plans[0], example_inputs)
        else:
            log.debug("trtrtx: this graph is not cached: lowering it added guards on its symbolic sizes")
    return fn


def from_graph_cache(
    graphs: GraphCache, key: CacheKey, example_inputs: Sequence[Any], options: Options,
    overrides: dict[str, Any] | None = None,
    roots: list[torch.fx.GraphModule] | None = None,
) -> Callable[..., Any] | None:
    """The compiled graph of a graph-cache entry, its regions made from their engine-cache
    entries; None when there is none or it cannot be used (then the graph is compiled)."""
    start = time.perf_counter()
    engines = EngineCache.for_options(options)
    if engines is None:
        return None
    fetched: dict[str, concurrent.futures.Future[CacheEntry | None]] = {}  # region -> its engine's read ahead

    def fetch_engines(refs: list[RegionRef]) -> None:
        try:
            fetched.update(zip([r.name for r in refs], _engine_cache.fetch_ahead(engines, [r.engine for r in refs])))
        except RuntimeError as exc:  # no new threads (the interpreter is exiting): loads read them in turn
            log.debug("trtrtx: engine entries not read ahead: %s", exc)

    entry = graphs.load(key, example_inputs, on_header=fetch_engines)
    if entry is None:
        return None
    modules = []
    try:
        for ref in entry.regions:
            hit = engines.load(ref.engine, fetched=fetched.get(ref.name))
            if hit is None:
                return None
            module = runtime_module(ref.name, entry.references[ref.name], hit.region, hit.engine, hit.profile,
                                    Validation(engines, ref.engine), options, torch.device(ref.device),
                                    overrides=overrides)
            setattr(entry.graph_module, ref.name, module)
            modules.append(module)
    except Exception as exc:  # an entry that cannot be rebuilt here: compile as if it were not there
        log.warning("trtrtx: graph cache entry %s is unusable (%s: %s); compiling the graph again",
                    key.name, type(exc).__name__, exc)
        return None
    gm = entry.graph_module
    generate_code(gm)
    if roots is not None:
        roots.append(gm)
    seconds = time.perf_counter() - start
    record(CompiledGraph(PartitionPlan(gm, [r.name for r in entry.regions], entry.reasons, entry.eager_ops),
                         modules, seconds, from_graph_cache=True))
    log.info("trtrtx: reused a compiled graph from the graph cache in %.2fs: %d region(s) %s, %d op(s) left in "
             "PyTorch", seconds, len(modules), [m.kind for m in modules], len(entry.eager_ops))
    return without_autocast(direct_forward(gm))


def to_graph_cache(graphs: GraphCache, key: CacheKey, plan: PartitionPlan, example_inputs: Sequence[Any]) -> None:
    """Store the compiled graph when every region runs an engine from the engine cache (a region
    that fell back to PyTorch may do better in another process)."""
    modules = [getattr(plan.graph_module, n) for n in plan.regions]
    if not all(isinstance(m, RegionModule) and m.engine_key is not None and not isinstance(m.executor, TorchExecutor)
               for m in modules):
        return
    entry = GraphEntry(plan.graph_module, {m.name: m.graph_module for m in modules},
                       [RegionRef(m.name, m.engine_key, str(m.device)) for m in modules], plan.reasons, plan.eager_ops)
    weights = {i: t for i, t in enumerate(example_inputs) if is_weight(t)}
    graphs.store_later(key, entry, weights)


def plan_graph(
    aten_gm: torch.fx.GraphModule, options: Options, refused: dict[str, Reason] | None = None
) -> PartitionPlan:
    """Policy and partition (no build): shared by compilation and `explain`. `refused`: nodes
    the ONNX screen keeps in PyTorch (see compile_regions)."""
    support = CapabilitySupport(_targets.policy_targets(options), options.torch_executed_ops, refused=refused)
    return partition(aten_gm, support, options.min_block_size)


def compile_graph(
    aten_gm: torch.fx.GraphModule,
    args: Sequence[Any],
    options: Options,
    overrides: dict[str, Any] | None = None,
    on_plan: Callable[[PartitionPlan], None] | None = None,
) -> Callable[..., Any]:
    start, before = time.perf_counter(), _stats.stats()
    plan = compile_regions(aten_gm, overrides if overrides is not None else {}, options)
    if on_plan is not None:
        on_plan(plan)
    gm = plan.graph_module
    modules = [getattr(gm, n) for n in plan.regions]
    generate_code(gm)
    seconds = time.perf_counter() - start
    record(CompiledGraph(plan, modules, seconds))
    if not modules:
        _warn_nothing_lowered(plan)
    after = _stats.stats()
    built, cached = (after.get(k, 0) - before.get(k, 0) for k in ("engine_builds", "engine_cache_hits"))
    log.info(
        "trtrtx: compiled a graph in %.2fs: %d region(s) %s, %d engine(s) built, %d loaded from cache, "
        "%d op(s) left in PyTorch",
        seconds, len(modules), [m.kind for m in modules], built, cached, len(plan.eager_ops),
    )
    return direct_forward(gm)


def generate_code(gm: torch.fx.GraphModule) -> None:
    """Generate the graph's code now. A lazily recompiled GraphModule (what the partitioner makes)
    would keep `forward` as a stub that re-enters `__call__` and checks for a recompile on every
    call: microseconds per call, for nothing."""
    torch.fx.GraphModule.recompile(gm)  # GraphModule's own recompile: the real code generation


def compile_regions(
    aten_gm: torch.fx.GraphModule, overrides: dict[str, Any], options: Options
) -> PartitionPlan:
    """Plan, then compile every region in place. When the ONNX screen refuses nodes of a region
    (RegionRefused), plan again with them in PyTorch, from a copy of the graph (partitioning
    edits it). Each round refuses nodes that were in a region, so the loop ends."""
    pristine = copy.deepcopy(aten_gm.graph)
    known = {n.name for n in pristine.nodes}
    refused: dict[str, Reason] = {}
    gm = aten_gm
    while True:
        plan = plan_graph(gm, options, refused)
        try:
            for name in plan.regions:
                region = compile_region(name, getattr(plan.graph_module, name), overrides, options)
                setattr(plan.graph_module, name, region)
            return plan
        except RegionRefused as exc:
            new = {k: v for k, v in exc.reasons.items() if k in known and k not in refused}
            if not new:
                raise BuildError(f"the ONNX screen refused nodes that are in no region: {exc}") from exc
            refused.update(new)  # type: ignore[arg-type]
            gm = torch.fx.GraphModule(aten_gm, copy.deepcopy(pristine))


def compile_region(
    name: str, region_gm: torch.fx.GraphModule, overrides: dict[str, Any], options: Options
) -> RegionModule:
    """Export, build and pick an executor for one region; on failure fall back to PyTorch."""
    # the region as PyTorch runs it, with a graph of its own: the bridge edits region_gm's
    reference = torch.fx.GraphModule(region_gm, copy.deepcopy(region_gm.graph))
    onnx_region = engine = None
    try:
        onnx_region, engine, profile, record, source = export_and_build(region_gm, overrides, options)
        if options.dump_onnx_dir:
            dump_region(name, onnx_region, options.dump_onnx_dir)
        device = region_device(reference)
        executor = choose_executor(name, onnx_region, engine, options, device)
    except Exception as exc:  # a bug of ours or of a library must not break the user's model
        if isinstance(exc, RegionRefused):
            raise  # compile_regions partitions again without the refused nodes
        error = exc if isinstance(exc, RtxBackendError) else BuildError(f"{type(exc).__name__}: {exc}")
        if options.strict or (isinstance(exc, RuntimeUnavailableError) and options.runtime == "tensorrt_rtx"):
            if error is exc:
                raise
            raise error from exc
        log.warning("trtrtx: region %s runs in PyTorch: %s", name, error)
        log.debug("trtrtx: region %s failed", name, exc_info=exc)
        fallback = RegionModule(name, reference, onnx_region, engine, TorchExecutor(reference))
        fallback.why = f"compiling it failed: {error}"
        return fallback
    module = runtime_module(name, reference, onnx_region, engine, profile, record, options, device, executor,
                            overrides=overrides)
    module.engine_source = source
    return module


def runtime_module(
    name: str,
    reference: torch.fx.GraphModule,
    onnx_region: OnnxRegion,
    engine: EngineData | None,
    profile: Profile,
    record: Validation | None,
    options: Options,
    device: torch.device,
    executor: TrtExecutor | OrtExecutor | None = None,
    overrides: dict[str, Any] | None = None,
) -> RegionModule:
    """The runtime module of a region whose model and engine are at hand: its executor (chosen
    here unless given), the profile widener, and first-call validation unless this GPU has
    validated the engine-cache entry's engine before."""
    if executor is None:
        executor = choose_executor(name, onnx_region, engine, options, device)
    base = record.key if record is not None else None
    labels = dim_labels(onnx_region.inputs, overrides if overrides is not None else {})  # the widening warning names the model's inputs
    widener = (EngineProfile(profile, functools.partial(_widened_engine, onnx_region, options, base), labels)
               if profile else None)
    validate, on_validated = options.validate, None
    if record is not None and isinstance(executor, TrtExecutor):
        on_validated = record.mark
        if validate and record.done():  # this cached engine agreed with PyTorch on this GPU before
            validate = False
            _stats.count("validations_skipped")
            log.info("trtrtx: region %s: its cached engine was validated on this GPU before; not checked again", name)
    module = RegionModule(name, reference, onnx_region, engine, executor, validate=validate, profile=widener,
                          on_validated=on_validated, engine_key=record.key if record is not None else None,
                          device=device, strict=options.strict or options.runtime == "tensorrt_rtx")
    module.why = getattr(executor, "why", "")
    module.engine_source = "engine cache" if engine is not None and record is not None else ""
    return module


def export_and_build(
    region_gm: torch.fx.GraphModule, overrides: dict[str, Any], options: Options
) -> tuple[OnnxRegion, EngineData | None, Profile, Validation | None, str]:
    """The region's ONNX model, engine and the engine's profile: from the engine cache when it
    holds them, else exported and built (and stored); the cache entry's validation record; and
    where the engine came from ("engine cache", "built", or "" for none).
    No engine (and an empty profile) where none can be built or none is wanted."""
    if not (_targets.can_build(options) and options.runtime != "onnxruntime"):
        return export_region(region_gm, optimize=options.optimize_onnx, keep_weights=checked(options)), None, {}, None, ""
    cache = EngineCache.for_options(options)
    inputs = input_specs(region_gm)
    key = cache.key(region_gm, make_profile(inputs, overrides, options), options) if cache else None
    hit = cache.load(key, inputs) if cache and key else None
    if hit is not None:
        assert cache is not None and key is not None
        return hit.region, hit.engine, hit.profile, Validation(cache, key), "engine cache"
    fx_names = [n.name for n in region_gm.graph.nodes if n.op == "call_function"]
    onnx_region = export_region(region_gm, optimize=options.optimize_onnx, keep_weights=checked(options))  # edits region_gm
    network = parse_network(onnx_region.source)  # parsed once: for the screen's verdict and the build
    check_region(onnx_region.source, fx_names, _targets.policy_targets(options), network=network)  # may raise RegionRefused
    profile = make_profile(onnx_region.inputs, overrides, options)
    engine = _build_for(network, options, profile)
    _stats.count("engine_builds")
    if cache and key and onnx_region.inputs == inputs:
        cache.store_later(key, CacheEntry(onnx_region, engine, profile))
        return onnx_region, engine, profile, Validation(cache, key), "built"
    return onnx_region, engine, profile, None, "built"


def _widened_engine(onnx_region: OnnxRegion, options: Options, base: CacheKey | None, profile: Profile) -> EngineData:
    """The engine of a region for a widened profile: from the engine cache (under the key of the
    region's first engine with this profile) or built and stored there."""
    cache = EngineCache.for_options(options) if base is not None else None
    key = _engine_cache.with_profile(base, profile) if base is not None else None
    if cache is not None and key is not None:
        hit = cache.load(key, onnx_region.inputs)
        if hit is not None:
            return hit.engine
    engine = _build_for(onnx_region.source, options, profile)
    _stats.count("engine_builds")
    _stats.count("engine_rebuilds")
    if cache is not None and key is not None:
        cache.store_later(key, CacheEntry(onnx_region, engine, profile))
    return engine


def _build_for(model: bytes | OnnxModel | Network, options: Options, profile: Profile) -> EngineData:
    """An engine for the region's model and a profile (also when a call fell outside the first one)."""
    targets = options.target_compute_capabilities
    refittable = (checked(options) and REFITTABLE_BUILDS and torch.cuda.is_available()
                  and targets not in _REFIT_REFUSED)
    with build_progress(options) as monitor:
        if refittable:
            try:
                return build(model, targets, profile, monitor=monitor, refittable=True).data
            except BuildError as exc:  # a weight change then builds the engine again instead
                # not tried again for these targets in this process: a failed build costs seconds
                _REFIT_REFUSED.add(targets)
                log.info("trtrtx: TensorRT-RTX builds no refittable engine for %s here (%s); engines are built "
                         "as for frozen weights, and a weight change builds the region's engine again",
                         _targets.describe(targets) if targets else "this GPU", exc)
        return build(model, targets, profile, monitor=monitor).data


# Engines of checked weights are built refittable (where a GPU is present: TensorRT-RTX's builder
# needs one for a refittable engine), so that a weight change is a refit. Where refittable
# engines run slower (bench/refit.py measures it), set this False: engines are then built as for
# frozen weights, and a weight change builds the region's engine again.
REFITTABLE_BUILDS = True
# Targets (None: this GPU) for which a refittable build failed in this process (TensorRT-RTX 1.6
# on an SM 9.0 GPU, off its list, fails every one in Myelin: "target_sm '90' does not have arch
# kind assigned").
_REFIT_REFUSED: set[tuple[tuple[int, int], ...] | None] = set()


def checked(options: Options) -> bool:
    """Whether the weights are checked on every call (and the regions kept refittable)."""
    return options.weights == "checked"


def choose_executor(
    name: str, onnx_region: Any, engine: EngineData | None, options: Options, device: torch.device
) -> TrtExecutor | OrtExecutor:
    """TensorRT-RTX where this GPU runs the engine; else ONNX Runtime (runtime='auto')."""
    if options.runtime == "onnxruntime":
        executor = _ort(onnx_region)
        executor.why = "runtime='onnxruntime' was asked for"  # type: ignore[attr-defined]
        return executor
    targets = options.target_compute_capabilities
    current = _targets.current_capability()
    missing = _trt.unavailable_reason()
    if missing is not None:
        why = missing
    elif device.type != "cuda":
        why = _targets.no_cuda_reason() or (
            f"the model's tensors are on {device}; move model and inputs to CUDA for TensorRT-RTX")
    elif targets is not None and current is not None and current not in targets:
        why = (f"the engines are built for {_targets.describe(targets)}, not for this GPU "
               f"(SM{current[0]}.{current[1]}); add {current} to target_compute_capabilities to run here")
    elif engine is None:
        why = "no engine could be built here (no GPU and no declared target)"
    else:
        try:
            return TrtExecutor(engine, onnx_region, options, name)
        except RuntimeUnavailableError as exc:
            why = str(exc)
    if options.runtime == "tensorrt_rtx":
        raise RuntimeUnavailableError(f"runtime='tensorrt_rtx' but region {name} cannot run here: {why}")
    _warn_once(f"trtrtx: TensorRT-RTX cannot run engines here ({why}); regions run in ONNX Runtime instead")
    executor = _ort(onnx_region)
    executor.why = why  # type: ignore[attr-defined]  # for rtx_backend.recording()
    return executor


def _ort(onnx_region: Any) -> OrtExecutor:
    try:
        return OrtExecutor(onnx_region)
    except Exception as exc:
        raise BuildError(f"ONNX Runtime could not load the region: {exc}") from exc


def _warn_nothing_lowered(plan: PartitionPlan) -> None:
    """A graph of which nothing runs on TensorRT-RTX because of the declared targets (an FP32
    model for Turing, say) deserves more than an INFO line: say which rules, and the fix."""
    counts: dict[str, int] = {}
    for reason in plan.reasons.values():
        if reason.rule in TARGET_RULES:
            counts[reason.rule] = counts.get(reason.rule, 0) + 1
    if counts:
        rules = "; ".join(f"{rule} kept {n} node(s) in PyTorch (fix: {FIXES[rule]})" for rule, n in counts.items())
        _warn_once(f"trtrtx: nothing of this graph runs on TensorRT-RTX: {rules}. rtx_backend.explain(model, "
                   "*inputs, options=...) lists every node")


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning(message)
