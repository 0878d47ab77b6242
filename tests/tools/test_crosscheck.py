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
