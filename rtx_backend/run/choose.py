"""Which executor runs a region: TensorRT-RTX where this GPU runs the engine, else ONNX Runtime
(runtime="auto"), with the reason kept for `rtx_backend.recording()`. `why_not_tensorrt` is the
rule, for compiled models and saved packages alike."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import torch

from .. import _targets, _trt
from .._errors import BuildError, RuntimeUnavailableError
from .._log import say_once
from .._options import Options
from .._types import EngineData, Target
from .executors import Executor, OrtExecutor, TrtExecutor

log = logging.getLogger("rtx_backend")


@dataclasses.dataclass(frozen=True)
class Advice:
    """What the reasons of `why_not_tensorrt` tell the user to do: a compiled model and a loaded
    package are fixed differently. `device` takes {device}, `target` {current}."""

    engines: str
    device: str
    target: str


COMPILED = Advice("the engines",
                  "the model's tensors are on {device}; move model and inputs to CUDA for TensorRT-RTX",
                  "add {current} to target_compute_capabilities to run here")
PACKAGE = Advice("its engines", "the inputs are on {device}; load with device='cuda' for TensorRT-RTX",
                 "save it again with {current} among the targets")


def why_not_tensorrt(device: torch.device, targets: Sequence[Target] | None, *, built_by: str | None = None,
                     advice: Advice = COMPILED) -> str | None:
    """Why engines built for `targets` (by TensorRT-RTX `built_by`; None: by this process's)
    cannot run on `device` (None: nothing here stops them): TensorRT-RTX missing or another
    version, no CUDA, a GPU not among the targets. The one rule of a compiled model and of a
    saved package."""
    missing = _trt.unavailable_reason()
    if missing is not None:
        return missing
    if built_by is not None and built_by != _trt.version():
        return (f"{advice.engines} were built by TensorRT-RTX {built_by}, and this is TensorRT-RTX {_trt.version()}, "
                "which does not run them; save the package again with this version, or install that one")
    if device.type != "cuda":
        return _targets.no_cuda_reason() or advice.device.format(device=device)
    current = _targets.current_capability()
    if targets and current not in targets:
        if current is None:
            return "there is no usable GPU"
        return (f"{advice.engines} are built for {_targets.describe(tuple(targets))}, not for this GPU "
                f"(SM{current[0]}.{current[1]}); " + advice.target.format(current=current))
    return None


def choose_executor(
    name: str, onnx_region: Any, engine: EngineData | None, options: Options, device: torch.device
) -> Executor:
    """TensorRT-RTX where this GPU runs the engine; else ONNX Runtime (runtime='auto')."""
    if options.runtime == "onnxruntime":
        executor = _ort(onnx_region)
        executor.why = "runtime='onnxruntime' was asked for"
        return executor
    why = why_not_tensorrt(device, options.target_compute_capabilities)
    if why is None:
        if engine is None:
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
