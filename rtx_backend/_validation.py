"""First-call validation: the first result of each engine (or ONNX Runtime session) is checked
against the region's PyTorch graph, once.

TensorRT-RTX has produced silent all-zero outputs on some GPUs, and a lowering can go subtly
wrong (type promotion, layout, precision). Checking the first call costs one PyTorch run of the
region; after it, the runtime module pays one identity test per call. On disagreement the
region's PyTorch outputs are returned, an ERROR names the region and the numbers, and the
region runs in PyTorch from then on: a wrong engine is a loud event, never a wrong answer.

No check runs while the stream is being captured into a CUDA graph (the reference run and the
host reads of the comparison cannot be captured); the check then waits for the first call that
is not captured.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from . import _stats
from ._compare import compare, default_tolerance
from ._executors import TorchExecutor, stream_capturing

log = logging.getLogger("rtx_backend")


def capturing(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether the current CUDA stream is capturing (never true for CPU tensors)."""
    if not any(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors):
        return False
    return stream_capturing()


def first_call(
    module: Any, args: Sequence[Any], outputs: tuple[torch.Tensor, ...], reference: tuple[torch.Tensor, ...] | None = None
) -> tuple[torch.Tensor, ...]:
    """Validate `outputs` of `module.executor` (a RegionModule's) and return the outputs to use.
    `reference`: PyTorch's results on `args`, when the caller has them already.

    Marks the executor validated, except during a CUDA graph capture (then nothing is checked).
    """
    executor = module.executor
    if capturing(outputs):
        return outputs
    module.validated_executor = executor
    try:
        if reference is None:
            reference = tuple(module.graph_module(*args))
        checks = [
            compare(out, ref, default_tolerance(ref.dtype, ref), f"output_{i}")
            for i, (out, ref) in enumerate(zip(outputs, reference))
        ]
    except Exception as exc:  # never let the check itself break inference
        log.warning("trtrtx: could not validate region %s against PyTorch: %s", module.name, exc)
        return outputs
    _stats.count("validations")
    failed = [c for c in checks if not c.passed]
    if len(outputs) != len(reference):
        failed_text = f"{len(outputs)} outputs where PyTorch gives {len(reference)}"
    elif failed:
        failed_text = "; ".join(c.summary() for c in failed)
    else:
        log.debug("trtrtx: region %s (%s) agrees with PyTorch on its first call", module.name, executor.kind)
        record = getattr(module, "on_validated", None)
        if record is not None and record[0] is executor:
            record[1]()
        return outputs
    log.error(
        "trtrtx: region %s: %s disagrees with PyTorch on its first call: %s. Returning PyTorch's "
        "result; the region runs in PyTorch from now on.",
        module.name, executor.kind, failed_text,
    )
    _stats.count("validation_failures")
    torch_executor = TorchExecutor(module.graph_module)
    module.executor = torch_executor
    module.validated_executor = torch_executor
    module.why = f"its {executor.kind} result disagreed with PyTorch on the first call ({failed_text})"
    return reference
