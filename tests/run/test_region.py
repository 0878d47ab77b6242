"""The runtime module: a region whose runtime fails at call time runs in PyTorch from then on,
with one warning, unless the options ask for TensorRT-RTX or nothing (strict, runtime=tensorrt_rtx).
TensorRT-RTX is faked (tests/run/test_cuda_graphs.py's fake engine); ONNX Runtime is broken on purpose."""

from __future__ import annotations

import logging

import pytest
import torch

import rtx_backend
from rtx_backend._record import recording
from rtx_backend.run.executors import OrtExecutor

from ..models import MLP, eval_model
from ..run.test_cuda_graphs import FakeEngine, _compiled_mlp, fake_executor  # noqa: F401  (a fixture)


def _failing_enqueue(monkeypatch):
    """Contexts are made; every enqueue fails, as BERT's did on TensorRT-RTX 1.4.0 (Myelin)."""
    original = FakeEngine.create_execution_context

    def make(self, config):
        ctx = original(self, config)
        ctx.execute_async_v3 = lambda stream: False
        return ctx

    monkeypatch.setattr(FakeEngine, "create_execution_context", make)


def test_a_failed_enqueue_runs_the_region_in_pytorch_with_one_warning(fake_executor, monkeypatch, caplog):  # noqa: F811
    _failing_enqueue(monkeypatch)
    failing, _, _ = fake_executor()
    model, compiled, x, region = _compiled_mlp()
    region.executor, region.validate = failing, False
    caplog.clear()
    with torch.no_grad(), caplog.at_level(logging.WARNING, "rtx_backend"):
        for i in range(3):
            torch.testing.assert_close(compiled(x + i), model(x + i))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, caplog.text
    assert "execute_async_v3 failed" in warnings[0].getMessage()
    assert f"region {region.name} runs in PyTorch from now on" in warnings[0].getMessage()
    assert region.kind == "pytorch"


@pytest.mark.parametrize("options", [{"strict": True}, {"runtime": "tensorrt_rtx"}], ids=["strict", "tensorrt_rtx"])
def test_a_failed_enqueue_raises_when_the_options_ask_for_it(fake_executor, monkeypatch, options):  # noqa: F811
    _failing_enqueue(monkeypatch)
    failing, _, _ = fake_executor(**options)
    _, compiled, x, region = _compiled_mlp()
    region.executor, region.validate, region.strict = failing, False, True  # (as runtime_module sets it)
    with torch.no_grad():
        for _ in range(2):  # every time: nothing was swapped
            with pytest.raises(rtx_backend.RtxBackendError, match="execute_async_v3 failed"):
                compiled(x)
    assert region.kind == "tensorrt_rtx"


def _failing_ort(monkeypatch):
    def fail(self, args, tensors=(), shapes=None):
        raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code")

    monkeypatch.setattr(OrtExecutor, "run", fail)


def test_an_onnx_runtime_error_at_call_time_runs_the_region_in_pytorch(monkeypatch, caplog):
    model = eval_model(MLP())
    x = torch.randn(3, 16)
    compiled = torch.compile(model, backend="trtrtx", options={"min_block_size": 1, "runtime": "onnxruntime"})
    with torch.no_grad(), recording() as graphs:
        compiled(x)  # compiled and validated
    _failing_ort(monkeypatch)
    caplog.clear()
    with torch.no_grad(), caplog.at_level(logging.WARNING, "rtx_backend"):
        outs = [compiled(x) for _ in range(3)]
    for y in outs:
        torch.testing.assert_close(y, model(x))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "onnxruntime failed: RuntimeError" in warnings[0], warnings
    assert [r.kind for r in graphs[0].regions] == ["pytorch"]


def test_an_onnx_runtime_error_raises_with_strict(monkeypatch):
    model = eval_model(MLP())
    x = torch.randn(3, 16)
    options = {"min_block_size": 1, "runtime": "onnxruntime", "strict": True}
    compiled = torch.compile(model, backend="trtrtx", options=options)
    with torch.no_grad():
        compiled(x)
    _failing_ort(monkeypatch)
    with torch.no_grad(), pytest.raises(rtx_backend.RtxBackendError, match="onnxruntime failed") as info:
        compiled(x)
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.gpu
def test_gpu_an_engine_failing_at_call_time_runs_in_pytorch(monkeypatch, caplog):
    """A real engine whose enqueue fails after it has run (as BERT's did on TensorRT-RTX 1.4.0)."""
    from rtx_backend.run.executors import TrtExecutor

    model = eval_model(MLP(), device="cuda")
    x = torch.randn(4, 16, device="cuda")
    compiled = torch.compile(model, backend="trtrtx", options={"min_block_size": 1})
    with torch.no_grad(), recording() as graphs:
        compiled(x)
    (region,) = graphs[0].regions
    assert region.kind == "tensorrt_rtx"

    def fail(self, args, tensors=(), shapes=None):
        raise rtx_backend.RtxBackendError(f"region {self.name}: TensorRT-RTX execute_async_v3 failed: injected")

    monkeypatch.setattr(TrtExecutor, "run", fail)
    caplog.clear()
    with torch.no_grad(), caplog.at_level(logging.WARNING, "rtx_backend"):
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x))
    assert caplog.text.count("execute_async_v3 failed: injected") == 1
    assert region.kind == "pytorch"
