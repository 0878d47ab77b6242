"""One region, compiled: its ONNX model and engine (from the engine cache, or exported, screened
and built), its executor, and the runtime module that replaces it in the graph. A region that
fails anywhere here runs in PyTorch, with a warning naming it and the cause."""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

from .. import _stats, _targets
from .._errors import BuildError, RegionRefused, RtxBackendError, RuntimeUnavailableError
from .._log import one_line
from .._options import Options
from .._types import EngineData, OnnxRegion, Profile
from ..build.engine import Network, build, parse_network
from ..build.profiles import EngineProfile, dim_labels, make_profile
from ..build.progress import build_progress
from ..build.screen import check_region
from ..cache import engines as _engine_cache
from ..cache.engines import EngineCache, EngineEntry, Validation
from ..cache.store import Key
from ..export.bridge import export_region, input_specs
from ..export.dump import dump_region
from ..export.model import OnnxModel
from ..run.choose import choose_executor
from ..run.executors import Executor, TorchExecutor, TrtExecutor
from ..run.region import RegionModule, region_device

log = logging.getLogger("rtx_backend")


Later = Callable[[str, torch.fx.GraphModule, "Unbuilt", Options, torch.device, dict[str, Any]], RegionModule]


def compile_region(
    name: str, region_gm: torch.fx.GraphModule, overrides: dict[str, Any], options: Options,
    later: Later | None = None,
) -> RegionModule:
    """Export, build and pick an executor for one region; on failure fall back to PyTorch.
    `later`: given, it makes the module of a region whose engine is to be built, instead of the
    build (background.start: the engine is built behind the compile)."""
    # the region as PyTorch runs it, with a graph of its own: the bridge edits region_gm's
    reference = torch.fx.GraphModule(region_gm, copy.deepcopy(region_gm.graph))
    onnx_region = engine = None
    try:
        found = export_and_screen(region_gm, overrides, options)
        onnx_region = found.onnx_region if isinstance(found, Unbuilt) else found[0]
        if options.dump_onnx_dir:
            dump_region(name, onnx_region, options.dump_onnx_dir)
        device = region_device(reference)
        if isinstance(found, Unbuilt) and later is not None:
            return later(name, reference, found, options, device, overrides)
        onnx_region, engine, profile, record, source = found.build(options) if isinstance(found, Unbuilt) else found
        with _stats.stage("runtime"):
            executor = choose_executor(name, onnx_region, engine, options, device)
    except Exception as exc:  # a bug of ours or of a library must not break the user's model
        if isinstance(exc, RegionRefused):
            raise  # compile_regions partitions again without the refused nodes
        error = exc if isinstance(exc, RtxBackendError) else BuildError(f"{type(exc).__name__}: {exc}")
        if options.strict or (isinstance(exc, RuntimeUnavailableError) and options.runtime == "tensorrt_rtx"):
            if error is exc:
                raise
            raise error from exc
        log.warning("trtrtx: region %s runs in PyTorch: %s", name, one_line(error).removeprefix("BuildError: "))
        log.debug("trtrtx: region %s failed", name, exc_info=exc)
        fallback = RegionModule(name, reference, onnx_region, engine, TorchExecutor(reference))
        fallback.why = f"compiling it failed: {one_line(error)}"
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
    executor: Executor | None = None,
    overrides: dict[str, Any] | None = None,
) -> RegionModule:
    """The runtime module of a region whose model and engine are at hand: its executor (chosen
    here unless given), the profile widener, and first-call validation unless this GPU has
    validated the engine-cache entry's engine before."""
    if executor is None:
        executor = choose_executor(name, onnx_region, engine, options, device)
    base = record.key if record is not None else None
    labels = dim_labels(onnx_region.inputs, overrides if overrides is not None else {})  # the widening warning names the model's inputs
    widener = (EngineProfile(profile, functools.partial(widened_engine, onnx_region, options, base), labels)
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
    module.why = executor.why
    module.engine_source = "engine cache" if engine is not None and record is not None else ""
    executor.made_for = module.weight_versions()  # the weights it was made for: these
    return module


@dataclasses.dataclass
class Unbuilt:
    """A region exported and screened (the parsed network keeps the host copies of its weights),
    whose engine is still to be built, then stored under `key`."""

    onnx_region: OnnxRegion
    network: Network
    profile: Profile
    cache: EngineCache | None
    key: Key | None
    cacheable: bool  # the exported inputs are those the key was made for

    def build(self, options: Options, keep: Callable[[], bool] = lambda: True,
              ) -> tuple[OnnxRegion, EngineData, Profile, Validation | None, str]:
        """The engine built; stored unless `keep()` says, once it is built, that the weights it was
        built from may have changed meanwhile (a build behind the compile: background.py)."""
        engine = build_for(self.network, options, self.profile)
        _stats.count("engine_builds")
        if self.cache and self.key and self.cacheable and keep():
            self.cache.store_later(self.key, EngineEntry(self.onnx_region, engine, self.profile))
            return self.onnx_region, engine, self.profile, Validation(self.cache, self.key), "built"
        return self.onnx_region, engine, self.profile, None, "built"


def export_and_screen(
    region_gm: torch.fx.GraphModule, overrides: dict[str, Any], options: Options
) -> tuple[OnnxRegion, EngineData | None, Profile, Validation | None, str] | Unbuilt:
    """The region's ONNX model, engine and the engine's profile, when the engine cache holds them
    or no engine can be built or is wanted (then none, and an empty profile); the cache entry's
    validation record; and where the engine came from ("engine cache", or "" for none). Else the
    region exported and screened, its engine to be built (Unbuilt.build gives the same tuple)."""
    if not (_targets.can_build(options) and options.runtime != "onnxruntime"):
        with _stats.stage("export"):
            return export_region(region_gm, optimize=options.optimize_onnx, keep_weights=checked(options)), None, {}, None, ""
    cache = EngineCache.for_options(options)
    inputs = input_specs(region_gm)
    key = cache.key(region_gm, make_profile(inputs, overrides, options), options) if cache else None
    hit = cache.load(key, inputs) if cache and key else None
    if hit is not None:
        assert cache is not None and key is not None
        return hit.region, hit.engine, hit.profile, Validation(cache, key), "engine cache"
    fx_names = [n.name for n in region_gm.graph.nodes if n.op == "call_function"]
    with _stats.stage("export"):
        onnx_region = export_region(region_gm, optimize=options.optimize_onnx, keep_weights=checked(options))  # edits region_gm
    with _stats.stage("screen"):
        network = parse_network(onnx_region.source)  # parsed once: for the screen's verdict and the build
        check_region(onnx_region.source, fx_names, _targets.policy_targets(options), network=network)  # may raise RegionRefused
    profile = make_profile(onnx_region.inputs, overrides, options)
    return Unbuilt(onnx_region, network, profile, cache, key, onnx_region.inputs == inputs)


def widened_engine(onnx_region: OnnxRegion, options: Options, base: Key | None, profile: Profile) -> EngineData:
    """The engine of a region for a widened profile: from the engine cache (under the key of the
    region's first engine with this profile) or built and stored there."""
    cache = EngineCache.for_options(options) if base is not None else None
    key = _engine_cache.with_profile(base, profile) if base is not None else None
    if cache is not None and key is not None:
        hit = cache.load(key, onnx_region.inputs)
        if hit is not None:
            return hit.engine
    engine = build_for(onnx_region.source, options, profile)
    _stats.count("engine_builds")
    _stats.count("engine_rebuilds")
    if cache is not None and key is not None:
        cache.store_later(key, EngineEntry(onnx_region, engine, profile))
    return engine


def build_for(model: bytes | OnnxModel | Network, options: Options, profile: Profile) -> EngineData:
    """An engine for the region's model and a profile (also when a call fell outside the first one)."""
    targets = options.target_compute_capabilities
    refittable = (options.weights == "refit" and REFITS.builds and torch.cuda.is_available()
                  and targets not in REFITS.refused)
    with _stats.stage("build"), build_progress(options) as monitor:
        if refittable:
            try:
                return build(model, targets, profile, monitor=monitor, refittable=True,
                             threads=options.compile_threads).data
            except BuildError as exc:  # a weight change then builds the engine again instead
                # not tried again for these targets in this process: a failed build costs seconds
                REFITS.refused.add(targets)
                log.info("trtrtx: TensorRT-RTX builds no refittable engine for %s here (%s); engines are built "
                         "as for frozen weights, and a weight change builds the region's engine again",
                         _targets.describe(targets) if targets else "this GPU", exc)
        return build(model, targets, profile, monitor=monitor, threads=options.compile_threads).data


class Refits:
    """How engines of weights="refit" are built, for the whole process.

    `builds`: they are built refittable (where a GPU is present: TensorRT-RTX's builder needs one
    for a refittable engine), so that a weight change is a refit; False: as for frozen weights,
    and a weight change builds the region's engine again (what weights="checked" does).

    `refused`: the targets (None: this GPU) for which a refittable build failed in this process
    (TensorRT-RTX 1.6 on an SM 9.0 GPU, off its list, fails every one in Myelin: "target_sm '90'
    does not have arch kind assigned"); not tried again, as a failed build costs seconds.
    """

    def __init__(self, builds: bool = True) -> None:
        self.builds = builds
        self.refused: set[tuple[tuple[int, int], ...] | None] = set()


REFITS = Refits()  # tests give the module a fresh one


def checked(options: Options) -> bool:
    """Whether the weights are checked on every call (and each frozen weight kept an initializer
    of its own in the region's model, so that new values replace it by name)."""
    return options.weights != "frozen"
