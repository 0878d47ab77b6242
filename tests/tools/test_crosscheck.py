"""rtx_backend.crosscheck: every region in PyTorch, ONNX Runtime and (on a GPU) TensorRT-RTX on
the same inputs; the report is true only when everything agrees."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import rtx_backend
from rtx_backend._errors import BuildError
from rtx_backend.assemble import region as _region
from rtx_backend.run.executors import OrtExecutor

from ..models import MLP, ConvNet, WithEagerOp, eval_model

ORT = {"min_block_size": 1, "runtime": "onnxruntime"}


class TwoHeads(nn.Module):
    """One region with two outputs, for per-output tolerances."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 8)
        self.b = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(self.a(x)) + 1, torch.tanh(self.b(x)) * 3


def break_ort(monkeypatch, how, output=None):
    """Make OrtExecutor return wrong values (for one output index, or all)."""
    original = OrtExecutor.run

    def broken(self, args, tensors=(), shapes=None):
        outs = original(self, args, tensors, shapes)
        return [how(o) if output in (None, i) else o for i, o in enumerate(outs)]

    monkeypatch.setattr(OrtExecutor, "run", broken)


@pytest.mark.parametrize(("cls", "shape", "dtype", "options"), [
    (MLP, (4, 16), torch.float32, {"target_compute_capabilities": [(8, 6)]}),
    (ConvNet, (2, 3, 16, 16), torch.float32, {}),
    (WithEagerOp, (3, 16), torch.float32, {"torch_executed_ops": ["aten.sigmoid"]}),
    (MLP, (4, 16), torch.float16, {}),
], ids=["mlp-aot-engine", "convnet", "two-regions", "mlp-fp16"])
def test_models_agree_between_pytorch_and_onnxruntime(cls, shape, dtype, options):
    model = eval_model(cls(), dtype)
    report = rtx_backend.crosscheck(model, torch.randn(*shape, dtype=dtype), options={"min_block_size": 1, **options})
    assert report, str(report)
    assert "onnxruntime" in report.runtimes
    n_regions = 2 if cls is WithEagerOp else 1
    assert len(report.regions) == n_regions
    ort = [c for c in report.checks if c.runtime == "onnxruntime"]
    assert len(ort) == n_regions and all(c.outputs and not c.skipped for c in ort)
    for c in ort:
        for o in c.outputs:
            assert o.dtype == dtype and o.max_abs < 1e-2 and o.nan == 0 and not o.all_zero
    model_row = next(c for c in report.checks if c.region == "model")
    assert model_row.reference == "eager" and model_row.passed
    if not torch.cuda.is_available():
        trt = [c for c in report.checks if c.runtime == "tensorrt_rtx"]
        assert len(trt) == n_regions and all(c.skipped for c in trt)  # with the reason why


def test_report_table_shows_every_region_runtime_and_number():
    model = eval_model(WithEagerOp())
    report = rtx_backend.crosscheck(model, torch.randn(3, 16),
                                     options={**ORT, "torch_executed_ops": ["aten.sigmoid"]})
    text = str(report)
    lines = text.splitlines()
    assert lines[0].startswith("trtrtx crosscheck: PASS") and "onnxruntime" in lines[0]
    for column in ("region", "runtime", "max abs", "max rel", "min atol", "min rtol", "NaN", "Inf", "zeros"):
        assert column in lines[1]
    for name in report.regions:
        assert sum(name in line and "onnxruntime" in line and line.rstrip().endswith("ok") for line in lines) == 1
        assert any(name in line and "tensorrt_rtx" in line and "skipped" in line for line in lines)


@pytest.mark.parametrize(("how", "problem"), [
    (torch.zeros_like, "all zeros"),
    (lambda o: o * 1.5, "elements differ"),
], ids=["zeros", "wrong_values"])
def test_broken_region_fails_the_report(monkeypatch, how, problem):
    break_ort(monkeypatch, how)
    model = eval_model(MLP())
    report = rtx_backend.crosscheck(model, torch.randn(4, 16), options=ORT)
    assert not report
    failed = {(c.region, c.runtime) for c in report.failures}
    assert failed == {("trtrtx_region_0", "onnxruntime"), ("model", "trtrtx")}  # validation was off
    region = next(c for c in report.failures if c.runtime == "onnxruntime")
    assert problem in region.outputs[0].problem and region.outputs[0].min_atol > 0
    text = str(report)
    assert text.startswith("trtrtx crosscheck: FAIL") and "failures:" in text and problem in text


def test_each_region_is_checked_on_pytorchs_inputs(monkeypatch):
    """An upstream fault does not spill into the downstream region's comparison."""
    original = OrtExecutor.run

    def broken(self, args, tensors=(), shapes=None):
        outs = original(self, args, tensors, shapes)
        return [torch.zeros_like(o) for o in outs] if b"Tanh" in self.region.model else outs

    monkeypatch.setattr(OrtExecutor, "run", broken)
    model = eval_model(WithEagerOp())
    x = torch.randn(3, 16)
    report = rtx_backend.crosscheck(model, x, options={**ORT, "torch_executed_ops": ["aten.sigmoid"]})
    ort = [c for c in report.checks if c.runtime == "onnxruntime"]
    assert sorted(c.passed for c in ort) == [False, True]


def test_per_output_tolerances(monkeypatch):
    break_ort(monkeypatch, lambda o: o * 1.5, output=1)  # relative error 0.5 on output_1 only
    model = eval_model(TwoHeads())
    x = torch.randn(4, 16)
    strict = rtx_backend.crosscheck(model, x, options=ORT)
    assert not strict
    region = next(c for c in strict.checks if c.runtime == "onnxruntime")
    assert [o.passed for o in region.outputs] == [True, False]
    assert region.outputs[1].min_rtol == pytest.approx(0.5, rel=1e-3)

    torch._dynamo.reset()
    rtol = {"output_1": 0.6, "model/output_1": 0.6}
    loose = rtx_backend.crosscheck(model, x, options=ORT, rtol=rtol)
    assert loose, str(loose)
    region = next(c for c in loose.checks if c.runtime == "onnxruntime")
    assert region.outputs[1].tolerance.rtol == 0.6
    assert region.outputs[0].tolerance.rtol == 1e-2  # output_0 keeps the dtype's default

    torch._dynamo.reset()
    only_region = rtx_backend.crosscheck(model, x, options=ORT, rtol={"trtrtx_region_0/output_1": 0.6})
    assert {(c.region, c.runtime) for c in only_region.failures} == {("model", "trtrtx")}

    torch._dynamo.reset()
    everything = rtx_backend.crosscheck(model, x, options=ORT, atol=0.0, rtol={"": 0.6})
    assert everything


def test_region_left_in_pytorch_is_reported_as_skipped(monkeypatch):
    def fail(*_a, **_k):
        raise BuildError("export failed on purpose")

    monkeypatch.setattr(_region, "export_region", fail)
    model = eval_model(MLP())
    report = rtx_backend.crosscheck(model, torch.randn(4, 16), options=ORT)
    assert report  # nothing disagrees: the region runs in PyTorch
    rows = [c for c in report.checks if c.region == "trtrtx_region_0"]
    assert rows and all("no ONNX model" in c.skipped for c in rows)
    assert report.runtimes == ()


def test_onnxruntime_without_a_kernel_is_skipped_not_failed():
    model = eval_model(MLP(), torch.bfloat16)  # ONNX Runtime's CPU provider has no bf16 Gemm
    report = rtx_backend.crosscheck(model, torch.randn(4, 16, dtype=torch.bfloat16), options=ORT)
    rows = [c for c in report.checks if c.runtime == "onnxruntime"]
    assert rows and all(c.skipped and "no kernel" in c.skipped for c in rows), str(report)
    assert report


class WithGraphBreak(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.a(x))
        torch._dynamo.graph_break()
        return torch.tanh(self.b(y))


def test_regions_of_every_graph_are_checked_and_labelled():
    report = rtx_backend.crosscheck(eval_model(WithGraphBreak()), torch.randn(2, 8), options=ORT)
    assert report, str(report)
    assert report.regions == ("graph0/trtrtx_region_0", "graph1/trtrtx_region_0")
    ran = [c.region for c in report.checks if c.runtime == "onnxruntime" and c.outputs]
    assert ran == list(report.regions)


def test_training_mode_is_warned_about(caplog):
    model = MLP()  # training mode
    with caplog.at_level("WARNING", logger="rtx_backend"):
        rtx_backend.crosscheck(model, torch.randn(2, 16), options=ORT)
    assert "training mode" in caplog.text


def test_bad_options_raise_before_compiling():
    with pytest.raises(rtx_backend.OptionsError, match="min_block_size"):
        rtx_backend.crosscheck(eval_model(MLP()), torch.randn(2, 16), options={"min_blok_size": 1})


# ---- GPU: the three-way report (PyTorch, ONNX Runtime, TensorRT-RTX) -----------------------------

@pytest.mark.gpu
@pytest.mark.parametrize(("cls", "shape", "dtype"), [
    (MLP, (8, 16), torch.float32),
    (ConvNet, (4, 3, 32, 32), torch.float32),
    (MLP, (8, 16), torch.float16),
    (ConvNet, (4, 3, 32, 32), torch.float16),
], ids=["mlp-fp32", "convnet-fp32", "mlp-fp16", "convnet-fp16"])
def test_gpu_three_way_report(cls, shape, dtype):
    model = eval_model(cls(), dtype, "cuda")
    x = torch.randn(*shape, device="cuda", dtype=dtype)
    report = rtx_backend.crosscheck(model, x, options={"min_block_size": 1, "runtime": "tensorrt_rtx"})
    print(f"\n== {cls.__name__} {str(dtype).removeprefix('torch.')} ==\n{report}")  # pytest -s shows it
    assert report.runtimes == ("onnxruntime", "tensorrt_rtx")
    assert report, str(report)


def _fp16_pair(seed: int = 0):
    """An FP32 result and two FP16 results of it with independent errors of the same size (as two
    FP16 runtimes give): each is as close to FP32 as the other, yet they differ by more than the
    default FP16 tolerances."""
    g = torch.Generator().manual_seed(seed)
    fp32 = torch.randn(64, 32, generator=g)
    noisy = [(fp32 + 0.05 * torch.randn(64, 32, generator=g)).half() for _ in range(2)]
    return fp32, noisy[0], noisy[1]


def test_fp16_outputs_are_judged_against_fp32_when_they_miss_the_default_tolerances():
    from rtx_backend.tools.crosscheck import CrosscheckReport, RuntimeCheck, _compare_all, render

    fp32, got, want = _fp16_pair()
    plain = _compare_all([got], [want], "r", None, None)
    assert not plain[0].passed  # the plain comparison alone calls it a disagreement
    judged = _compare_all([got], [want], "r", None, None, lambda: [fp32])
    assert judged[0].passed and judged[0].fp32 is not None
    report = CrosscheckReport((RuntimeCheck("r", "onnxruntime", "pytorch", judged),), ("r",))
    assert report and "ok vs FP32" in render(report)


@pytest.mark.parametrize("case", ["far", "zeros", "user_atol"])
def test_fp32_judgement_still_catches_what_is_wrong(case):
    from rtx_backend.tools.crosscheck import _compare_all

    fp32, got, want = _fp16_pair(1)
    atol = None
    if case == "far":
        got = (fp32 * 1.5).half()  # a wrong result: much further from FP32 than PyTorch's
    elif case == "zeros":
        got = torch.zeros_like(got)
    else:
        atol = 1e-3  # the user's own tolerance is the verdict
    out = _compare_all([got], [want], "r", atol, None, lambda: [fp32])
    assert not out[0].passed and out[0].fp32 is None


class Cancellation(nn.Module):
    """(1000 x + 1) - 1000 x: in FP16 each step rounds, so PyTorch's own result is off by up to
    half a unit at 1000 (0.25), where an exact runtime gives 1."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 1000 + 1) - x * 1000


def test_crosscheck_judges_fp16_results_against_fp32_runs(monkeypatch):
    # ONNX Runtime's result replaced by the exact one (as a runtime that keeps FP32 internally
    # gives): it misses the FP16 tolerances around PyTorch's FP16 result, and is closer to FP32
    torch.manual_seed(0)
    x = torch.randn(8, 16).half()
    exact = ((x.float() * 1000 + 1) - x.float() * 1000).half()
    break_ort(monkeypatch, lambda o: exact.clone())
    report = rtx_backend.crosscheck(Cancellation(), x, options=ORT)
    assert report, str(report)
    judged = [o for c in report.checks if not c.skipped for o in c.outputs if o.fp32 is not None]
    assert {c.region for c in report.checks if not c.skipped and c.outputs[0].fp32 is not None} >= {"model"}
    assert judged and all(o.mismatches for o in judged)
    assert "ok vs FP32" in str(report)
    # a wrong result is still caught: twice the exact one
    break_ort(monkeypatch, lambda o: (exact * 2).clone())
    assert not rtx_backend.crosscheck(Cancellation(), x, options=ORT)
