"""First-call validation: a region whose runtime disagrees with PyTorch on its first call is
reported, corrected and run in PyTorch from then on; an agreeing region is untouched and checked
once. On CPU the checked runtime is ONNX Runtime, broken on purpose by monkeypatching."""

from __future__ import annotations

import logging

import pytest
import torch

import rtx_backend
from rtx_backend._record import recording
from rtx_backend.run import validation as _validation
from rtx_backend.run.executors import OrtExecutor

from ..models import MLP, ConvNet, WithEagerOp, eval_model

ORT = {"min_block_size": 1, "runtime": "onnxruntime"}


def break_ort(monkeypatch, how, only=None):
    """Make OrtExecutor return wrong outputs (for regions whose ONNX model contains `only`)."""
    original = OrtExecutor.run

    def broken(self, args, tensors=(), shapes=None):
        outputs = original(self, args, tensors, shapes)
        if only is not None and only not in self.region.model:
            return outputs
        return [how(o) for o in outputs]

    monkeypatch.setattr(OrtExecutor, "run", broken)


_GRAPHS: list = []


def run(model, x, calls=1, **options):
    """Compile and call `calls` times under no_grad; `regions()` gives the regions afterwards."""
    compiled = torch.compile(model, backend="trtrtx", options=options)
    with torch.no_grad(), recording() as graphs:
        outs = [compiled(x) for _ in range(calls)]
    _GRAPHS[:] = graphs
    return outs


def regions():
    return [r for g in _GRAPHS for r in g.regions]


@pytest.mark.parametrize(("how", "message"), [
    (torch.zeros_like, "all zeros"),
    (lambda o: o * 1.5 + 0.1, "elements differ"),
    (lambda o: torch.full_like(o, float("nan")), "NaN 32"),
], ids=["zeros", "wrong_values", "nan"])
def test_broken_region_is_caught_and_results_are_pytorchs(monkeypatch, caplog, how, message):
    break_ort(monkeypatch, how)
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    with caplog.at_level(logging.ERROR, logger="rtx_backend"):
        first, second, third = run(model, x, calls=3, **ORT)
    expected = model(x)
    for y in (first, second, third):
        torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-5)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, caplog.text  # once, not per call
    text = errors[0].getMessage()
    assert "trtrtx_region_0" in text and "onnxruntime" in text and message in text
    assert "max abs err" in text  # the numbers
    assert [r.kind for r in regions()] == ["pytorch"]  # runs in PyTorch from now on
    stats = rtx_backend.stats()
    assert stats["validations"] == 1 and stats["validation_failures"] == 1


def test_agreeing_region_keeps_its_results_and_is_checked_once(monkeypatch):
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    calls = []
    original = _validation.compare
    monkeypatch.setattr(_validation, "compare", lambda *a, **k: calls.append(1) or original(*a, **k))
    validated = run(model, x, calls=3, **ORT)
    assert len(calls) == 1  # one output, compared on the first call only
    assert rtx_backend.stats()["validations"] == 1
    assert [r.kind for r in regions()] == ["onnxruntime"]
    torch._dynamo.reset()
    unvalidated = run(model, x, calls=1, validate=False, **ORT)
    for y in validated:
        assert torch.equal(y, unvalidated[0])  # validation does not change results


def test_validate_false_checks_nothing(monkeypatch):
    break_ort(monkeypatch, torch.zeros_like)
    model = eval_model(MLP())
    (y,) = run(model, torch.randn(4, 16), validate=False, **ORT)
    assert not y.any()  # the broken runtime's output: nothing checked it
    assert "validations" not in rtx_backend.stats()
    assert [r.kind for r in regions()] == ["onnxruntime"]


def test_only_the_broken_region_falls_back(monkeypatch, caplog):
    break_ort(monkeypatch, torch.zeros_like, only=b"Tanh")  # the first block of WithEagerOp
    model = eval_model(WithEagerOp())
    x = torch.randn(3, 16)
    with caplog.at_level(logging.ERROR, logger="rtx_backend"):
        (y,) = run(model, x, torch_executed_ops=["aten.sigmoid"], **ORT)
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    kinds = sorted(r.kind for r in regions())
    assert kinds == ["onnxruntime", "pytorch"]
    broken = next(r for r in regions() if r.kind == "pytorch")
    assert broken.name in caplog.text
    assert rtx_backend.stats()["validations"] == 2


def test_no_check_during_cuda_graph_capture_then_on_the_next_call(monkeypatch):
    break_ort(monkeypatch, torch.zeros_like)
    capturing = [True]
    monkeypatch.setattr(_validation, "capturing", lambda tensors: capturing[0])
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    compiled = torch.compile(model, backend="trtrtx", options=ORT)
    with torch.no_grad():
        captured = compiled(x)
        assert not captured.any()  # nothing can be checked inside a capture
        assert "validations" not in rtx_backend.stats()
        capturing[0] = False
        y = compiled(x)
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    assert rtx_backend.stats()["validation_failures"] == 1


def test_fp16_rounding_noise_is_not_a_disagreement(monkeypatch):
    break_ort(monkeypatch, lambda o: o * (1 + 2e-3))  # about two fp16 ulps
    model = eval_model(MLP(), torch.float16)
    x = torch.randn(4, 16, dtype=torch.float16)
    run(model, x, **ORT)
    assert rtx_backend.stats()["validations"] == 1
    assert "validation_failures" not in rtx_backend.stats()
    assert [r.kind for r in regions()] == ["onnxruntime"]


class Cancellation(torch.nn.Module):
    """In FP16, x + 1000 keeps steps of 0.5: PyTorch's FP16 result is off from FP32 by up to 25
    (of an RMS of 100), an FP32-accurate runtime's by FP16 rounding of the output only. The two
    FP16 results disagree beyond tolerance; the runtime is the better one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x + 1000) - 1000) * 100


def fp32_accurate(x: torch.Tensor) -> torch.Tensor:
    return (((x.float() + 1000) - 1000) * 100).half()


def replace_ort(monkeypatch, fn):
    monkeypatch.setattr(OrtExecutor, "run", lambda self, args, tensors=(), shapes=None: [fn(tensors[0])])


X16 = torch.randn(64, 32, generator=torch.Generator().manual_seed(0)).half()


def test_fp16_runtime_closer_to_fp32_than_pytorch_is_not_a_disagreement(monkeypatch, caplog):
    replace_ort(monkeypatch, fp32_accurate)
    model = Cancellation()
    reference = model(X16)
    assert not _validation.compare(fp32_accurate(X16), reference).passed  # the old verdict: a false alarm
    with caplog.at_level(logging.INFO, logger="rtx_backend"):
        (y,) = run(model, X16, **ORT)
    assert "validation_failures" not in rtx_backend.stats()
    assert [r.kind for r in regions()] == ["onnxruntime"]
    assert torch.equal(y, fp32_accurate(X16))  # the runtime's result, kept
    assert "against an FP32 run: ok" in caplog.text  # the second look is logged with its numbers


@pytest.mark.parametrize(("how", "message"), [
    (lambda x: fp32_accurate(x) * 1.3, "further from FP32"),
    (lambda x: fp32_accurate(x).flip(0), "further from FP32"),  # a layout error
    (lambda x: fp32_accurate(x) + torch.randn_like(x) * 60, "further from FP32"),  # 4x PyTorch's error
    (lambda x: torch.where(x > 2, float("nan"), fp32_accurate(x)), "NaN or Inf"),
    (lambda x: torch.where(x > 2, float("inf"), fp32_accurate(x)), "NaN or Inf"),
    (torch.zeros_like, "all zeros"),
], ids=["scaled", "flipped", "noisy", "nan", "inf", "zeros"])
def test_fp16_wrong_results_are_still_caught(monkeypatch, caplog, how, message):
    replace_ort(monkeypatch, how)
    model = Cancellation()
    with caplog.at_level(logging.ERROR, logger="rtx_backend"):
        (y,) = run(model, X16, **ORT)
    assert torch.equal(y, model(X16))  # PyTorch's result
    assert [r.kind for r in regions()] == ["pytorch"]
    assert rtx_backend.stats()["validation_failures"] == 1
    assert message in caplog.text


def test_fp32_run_upcasts_tensors_and_dtype_arguments():
    class CastsBack(torch.nn.Module):
        def forward(self, x):
            return ((x.to(torch.float16) + 1000 - 1000) * torch.ones(1, dtype=torch.float16),)

    gm = torch.fx.symbolic_trace(CastsBack())
    x = torch.tensor([0.1234], dtype=torch.float16)
    out = _validation.run_in_fp32(gm, (x,))[0]
    assert out.dtype == torch.float32
    assert abs(out.item() - x.float().item()) < 1e-4  # FP16 would round to 0.0 or 0.125


def test_a_new_executor_is_checked_on_its_first_call(monkeypatch):
    """A region that gets a new engine (e.g. a widened profile) has it validated again."""
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    compiled = torch.compile(model, backend="trtrtx", options=ORT)
    with torch.no_grad(), recording() as graphs:
        compiled(x)
    region = graphs[0].regions[0]
    break_ort(monkeypatch, torch.zeros_like)
    region.executor = OrtExecutor(region.onnx)  # what a rebuild would install
    with torch.no_grad():
        y = compiled(x)
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    assert region.kind == "pytorch"
    assert rtx_backend.stats()["validations"] == 2


def test_validate_must_be_a_bool():
    with pytest.raises(rtx_backend.OptionsError, match="validate"):
        rtx_backend.Options.from_dict({"validate": "yes"})


# ---- GPU: TensorRT-RTX engines -------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(("cls", "shape"), [(MLP, (8, 16)), (ConvNet, (4, 3, 32, 32))], ids=["mlp", "convnet"])
def test_gpu_engine_agrees_and_keeps_running_on_tensorrt_rtx(cls, shape, dtype):
    """No false alarm: real engines pass their dtype's tolerance."""
    model = eval_model(cls(), dtype, "cuda")
    x = torch.randn(*shape, device="cuda", dtype=dtype)
    run(model, x, calls=2, min_block_size=1, runtime="tensorrt_rtx")
    assert [r.kind for r in regions()] == ["tensorrt_rtx"]
    assert rtx_backend.stats()["validations"] == 1
    assert "validation_failures" not in rtx_backend.stats()


@pytest.mark.gpu
def test_gpu_broken_engine_is_caught(monkeypatch, caplog):
    from rtx_backend.run.executors import TrtExecutor

    original = TrtExecutor.run
    monkeypatch.setattr(TrtExecutor, "run", lambda self, a, t=(), shapes=None: [torch.zeros_like(o) for o in original(self, a, t, shapes)])
    model = eval_model(MLP(), torch.float16, "cuda")
    x = torch.randn(8, 16, device="cuda", dtype=torch.float16)
    with caplog.at_level(logging.ERROR, logger="rtx_backend"):
        first, second = run(model, x, calls=2, min_block_size=1, runtime="tensorrt_rtx")
    for y in (first, second):
        torch.testing.assert_close(y, model(x), atol=1e-2, rtol=1e-2)
    assert "tensorrt_rtx disagrees" in caplog.text and "all zeros" in caplog.text
    assert [r.kind for r in regions()] == ["pytorch"]


@pytest.mark.gpu
def test_gpu_no_check_inside_an_outer_cuda_graph_capture():
    model = eval_model(MLP(), torch.float16, "cuda")
    x = torch.randn(8, 16, device="cuda", dtype=torch.float16)
    compiled = torch.compile(model, backend="trtrtx", options={"min_block_size": 1, "runtime": "tensorrt_rtx"})
    with torch.no_grad(), recording() as graphs:
        compiled(x)  # compiles and validates
    region = graphs[0].regions[0]
    region.validated_executor = region.checked = None  # as if the first call were the captured one
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        y = compiled(x)
    assert region.validated_executor is None  # skipped inside the capture
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, model(x), atol=1e-2, rtol=1e-2)
    with torch.no_grad():
        compiled(x)
    assert region.validated_executor is region.executor and region.kind == "tensorrt_rtx"
