"""The trtrtx backend: the whole pipeline, top to bottom.

    Dynamo FX graph -> lower to ATen (frozen weights) -> capability policy -> partition
    -> per region: ONNX bridge -> TensorRT-RTX engine -> runtime module
    -> GraphModule with regions swapped for runtime modules, returned to Dynamo
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import _stats, _targets, _trt
from ._dump import dump_region
from ._engine import build
from ._errors import BuildError, RtxBackendError, RuntimeUnavailableError
from ._executors import OrtExecutor, TorchExecutor, TrtExecutor
from ._lowering import lower, needs_autograd
from ._onnx_bridge import export_region
from ._options import Options
from ._partition import PartitionPlan, partition
from ._policy import CapabilitySupport
from ._profiles import make_profile, symbol_overrides
from ._record import CompiledGraph, record
from ._runtime import RegionModule

log = logging.getLogger("rtx_backend")


def trtrtx(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, options: Any = None
) -> Callable[..., Any]:
    """The `torch.compile` backend registered as "trtrtx"."""
    opts = Options.from_dict(options)
    _stats.count("backend_calls")
    if needs_autograd(example_inputs):
        log.warning(
            "trtrtx compiles inference graphs only; this graph records autograd history (grad mode "
            "is on and an input or parameter requires grad), so it runs in PyTorch. Call the model "
            "under torch.no_grad() or torch.inference_mode() to run it on TensorRT-RTX."
        )
        return gm.forward
    return lower(gm, example_inputs, lambda aten_gm, args: compile_graph(aten_gm, args, opts))


def plan_graph(aten_gm: torch.fx.GraphModule, options: Options) -> PartitionPlan:
    """Policy and partition (no build): shared by compilation and `explain`."""
    support = CapabilitySupport(_targets.policy_targets(options), options.torch_executed_ops)
    return partition(aten_gm, support, options.min_block_size)


def compile_graph(
    aten_gm: torch.fx.GraphModule, args: Sequence[Any], options: Options
) -> Callable[..., Any]:
    start = time.perf_counter()
    plan = plan_graph(aten_gm, options)
    gm = plan.graph_module
    graph_inputs = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    overrides = symbol_overrides(graph_inputs, options)
    for name in plan.regions:
        region_gm = getattr(gm, name)
        setattr(gm, name, compile_region(name, region_gm, overrides, options))
    gm.recompile()
    modules = [getattr(gm, n) for n in plan.regions]
    seconds = time.perf_counter() - start
    record(CompiledGraph(plan, modules, seconds))
    log.info(
        "trtrtx: compiled a graph in %.2fs: %d region(s) %s, %d op(s) left in PyTorch",
        seconds, len(modules), [m.kind for m in modules], len(plan.eager_ops),
    )
    return gm.forward


def compile_region(
    name: str, region_gm: torch.fx.GraphModule, overrides: dict[str, Any], options: Options
) -> RegionModule:
    """Export, build and pick an executor for one region; on failure fall back to PyTorch."""
    n_args = sum(1 for n in region_gm.graph.nodes if n.op == "placeholder")
    reference = torch.fx.GraphModule(region_gm, region_gm.graph)  # before the bridge edits it
    onnx_region = engine = None
    try:
        onnx_region = export_region(region_gm, optimize=options.optimize_onnx)
        if options.dump_onnx_dir:
            dump_region(name, onnx_region, options.dump_onnx_dir)
        if _targets.can_build(options) and options.runtime != "onnxruntime":
            profile = make_profile(onnx_region.inputs, overrides, options)
            engine = build(onnx_region.model, options.target_compute_capabilities, profile).data
            _stats.count("engine_builds")
        executor = choose_executor(name, onnx_region, engine, options, _device(reference))
    except RtxBackendError as exc:
        if options.strict or (isinstance(exc, RuntimeUnavailableError) and options.runtime == "tensorrt_rtx"):
            raise
        log.warning("trtrtx: region %s runs in PyTorch: %s", name, exc)
        return RegionModule(name, reference, onnx_region, engine, TorchExecutor(reference, None, n_args))
    return RegionModule(name, reference, onnx_region, engine, executor, validate=options.validate)


def _device(region_gm: torch.fx.GraphModule) -> torch.device:
    """Where the region's tensors live (its inputs', else its outputs')."""
    for node in region_gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            return val.device
    return torch.device("cpu")


def choose_executor(
    name: str, onnx_region: Any, engine: bytes | None, options: Options, device: torch.device
) -> TrtExecutor | OrtExecutor:
    """TensorRT-RTX where this GPU runs the engine; else ONNX Runtime (runtime='auto')."""
    if options.runtime == "onnxruntime":
        return _ort(onnx_region)
    why = "TensorRT-RTX is not installed"
    targets = options.target_compute_capabilities
    current = _targets.current_capability()
    if device.type != "cuda":
        why = f"the model's tensors are on {device}; move model and inputs to CUDA for TensorRT-RTX"
    elif targets is not None and current is not None and current not in targets:
        why = (f"the engines are built for {_targets.describe(targets)}, not for this GPU "
               f"(SM{current[0]}.{current[1]}); add {current} to target_compute_capabilities to run here")
    elif _trt.available():
        if engine is None:
            why = "no engine could be built here (no GPU and no declared target)"
        else:
            try:
                return TrtExecutor(engine, onnx_region, options)
            except RuntimeUnavailableError as exc:
                why = str(exc)
    if options.runtime == "tensorrt_rtx":
        raise RuntimeUnavailableError(f"runtime='tensorrt_rtx' but region {name} cannot run here: {why}")
    _warn_once(f"trtrtx: TensorRT-RTX cannot run engines here ({why}); regions run in ONNX Runtime instead")
    return _ort(onnx_region)


def _ort(onnx_region: Any) -> OrtExecutor:
    try:
        return OrtExecutor(onnx_region)
    except Exception as exc:
        raise BuildError(f"ONNX Runtime could not load the region: {exc}") from exc


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning(message)
