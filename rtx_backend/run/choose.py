"""Which executor runs a region: TensorRT-RTX where this GPU runs the engine, else ONNX Runtime
(runtime="auto"), with the reason kept for `rtx_backend.recording()`."""

from __future__ import annotations

import logging
from typing import Any

import torch

from .. import _targets, _trt
from .._errors import BuildError, RuntimeUnavailableError
from .._log import say_once
from .._options import Options
from .._types import EngineData
from .executors import Executor, OrtExecutor, TrtExecutor

log = logging.getLogger("rtx_backend")


def choose_executor(
    name: str, onnx_region: Any, engine: EngineData | None, options: Options, device: torch.device
) -> Executor:
    """TensorRT-RTX where this GPU runs the engine; else ONNX Runtime (runtime='auto')."""
    if options.runtime == "onnxruntime":
        executor = _ort(onnx_region)
        executor.why = "runtime='onnxruntime' was asked for"
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
    say_once(f"trtrtx: TensorRT-RTX cannot run engines here ({why}); regions run in ONNX Runtime instead")
    executor = _ort(onnx_region)
    executor.why = why  # for rtx_backend.recording()
    return executor


def _ort(onnx_region: Any) -> OrtExecutor:
    try:
        return OrtExecutor(onnx_region)
    except Exception as exc:
        raise BuildError(f"ONNX Runtime could not load the region: {exc}") from exc
