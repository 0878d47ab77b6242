"""First-call validation: the first result of each engine (or ONNX Runtime session) is checked
against the region's PyTorch graph, once.

TensorRT-RTX has produced silent all-zero outputs on some GPUs, and a lowering can go subtly
wrong (type promotion, layout, precision). Checking the first call costs one PyTorch run of the
region; after it, the runtime module pays one identity test per call. On disagreement the
region's PyTorch outputs are returned, an ERROR names the region and the numbers, and the
region runs in PyTorch from then on: a wrong engine is a loud event, never a wrong answer.

FP16 and BF16 outputs that miss their tolerance get a second look: the region's graph runs
once more in FP32, and the output passes if it is no further from that run than PyTorch's own
result in the same precision is (see `_compare.judge_by_fp32`). Two low-precision results can
differ from each other more than either differs from FP32, and it is FP32 they approximate.

A check that fails after the region's weights moved since its executor was made (another
thread changed one during the call) proves nothing about the executor: PyTorch's result is
returned and the executor is checked again on a later call.

No check runs while the stream is being captured into a CUDA graph (the reference run and the
host reads of the comparison cannot be captured); the check then waits for the first call that
is not captured.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from .. import _stats, _torch_compat
from ..run.compare import compare, default_tolerance, fp32_may_overturn, judge_by_fp32
from ..run.executors import TorchExecutor, stream_capturing

log = logging.getLogger("rtx_backend")


class Rechecks:
    """How many executors were armed for a first-call check after their weights moved (put in
    place by a background weight update, or checked again after a weight change raced their
    check): a weight guard that sees the count move checks the weights before its next call
    runs, so that such a check never runs on weights that changed before the call."""

    def __init__(self) -> None:
        self.count = 0

    def arm(self) -> None:
        self.count += 1  # (a lost increment under a race only costs one overlapped check)


RECHECKS = Rechecks()


def capturing(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether the current CUDA stream is capturing (never true for CPU tensors)."""
    if not any(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors):
        return False
    return stream_capturing()


def first_call(
    module: Any, executor: Any, args: Sequence[Any], outputs: tuple[torch.Tensor, ...],
    reference: tuple[torch.Tensor, ...] | None = None,
) -> tuple[torch.Tensor, ...]:
    """Validate `outputs` of `executor`, which the RegionModule `module` ran (its executor when the
    call began: another thread may have put a newer one in place since, which this leaves be), and
    return the outputs to use. `reference`: PyTorch's results on `args`, when the caller has them
    already. Where the region's weights moved since the executor was made (its `made_for`: another
    thread changed one meanwhile), a disagreement proves nothing about it, and it is checked again
    on its next call.

    Marks the executor validated, except during a CUDA graph capture (then nothing is checked).
    """
    if capturing(outputs):
        return outputs
    module.validated_executor = executor
    with _stats.stage("validate"):
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
        failed: list[Any] = [c for c in checks if not c.passed]
        if failed and len(outputs) == len(reference):
            failed = rejudge_in_fp32(module, args, outputs, reference, failed)
    if failed and executor.made_for is not None and module.weight_versions() != executor.made_for:
        log.info("trtrtx: region %s: its weights changed during its first call (on another thread); PyTorch's "
                 "result is returned and %s is checked again on its next call", module.name, executor.kind)
        module.validated_executor = None
        RECHECKS.arm()
        return reference
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
    if module.executor is executor:  # (not a newer one that another thread put in place meanwhile)
        torch_executor = TorchExecutor(module.graph_module)
        module.executor = torch_executor
        module.validated_executor = torch_executor
        module.why = f"its {executor.kind} result disagreed with PyTorch on the first call ({failed_text})"
    return reference


def rejudge_in_fp32(
    module: Any, args: Sequence[Any], outputs: Sequence[torch.Tensor], reference: Sequence[torch.Tensor],
    failed: list[Any],
) -> list[Any]:
    """The failed checks that still fail when their low-precision outputs are judged against an
    FP32 run of the region. Outputs that are all zero, of another shape or dtype, or not low
    precision keep their verdict."""
    second = [c for c in failed if fp32_may_overturn(c)]
    if not second:
        return failed
    try:
        fp32 = run_in_fp32(module.graph_module, args)
    except Exception as exc:
        log.debug("trtrtx: region %s: no FP32 run to judge its outputs by: %s", module.name, exc)
        return failed
    index = {f"output_{i}": i for i in range(len(outputs))}
    still = [c for c in failed if c not in second]
    for c in second:
        i = index[c.name]
        judgment = judge_by_fp32(outputs[i], reference[i], fp32[i], c.name)
        if judgment.passed:
            log.info("trtrtx: region %s: %s; %s", module.name, c.summary(), judgment.summary())
        else:
            still.append(judgment)
    return still


_UPCAST = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


class _Fp32Interpreter(torch.fx.Interpreter):
    """Runs a graph with every FP16/BF16 tensor and dtype argument made FP32."""

    def run_node(self, n: torch.fx.Node) -> Any:
        with self._set_current_node(n):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            args, kwargs = _torch_compat.tree_map(upcast, (args, kwargs))
            return getattr(self, n.op)(n.target, args, kwargs)


def upcast(value: Any) -> Any:
    """FP16/BF16 tensors and dtypes made FP32; anything else as it is."""
    if isinstance(value, torch.Tensor) and value.dtype in _UPCAST:
        return value.float()
    if isinstance(value, torch.dtype):
        return _UPCAST.get(value, value)
    return value


def run_in_fp32(gm: torch.fx.GraphModule, args: Sequence[Any]) -> tuple[torch.Tensor, ...]:
    """The region's outputs computed in FP32 from the same (low-precision) inputs."""
    with torch.no_grad():
        return tuple(_Fp32Interpreter(gm).run(*args))
