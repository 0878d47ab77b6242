"""Reliability of compilation: a region whose export, parse, build or ONNX Runtime load fails
runs in PyTorch with a warning naming the region and the cause (default), or raises our error
through Dynamo's wrapper (strict=True). Failures are injected at each stage; outputs still match
eager, and a failure never poisons the engine cache."""

from __future__ import annotations

import logging

import onnxruntime
import pytest
import torch

import rtx_backend
from rtx_backend import BuildError
from rtx_backend.assemble import graph as _graph
from rtx_backend.assemble import region as _region
from rtx_backend.build import engine as _engine
from rtx_backend.export import bridge

from .helpers import backend_error, compile_and_run, regions
from .models import MLP, WithEagerOp, eval_model

BUILD = {"min_block_size": 1, "target_compute_capabilities": [(8, 6)]}  # engines built here (AOT)


def _raise(exc):
    def fail(*args, **kwargs):
        raise exc
    return fail


class _NullBuilder:
    """A TensorRT-RTX builder whose build returns None (how the builder reports most failures)."""

    def __init__(self, real):
        self.real = real

    def __getattr__(self, name):
        return getattr(self.real, name)

    def build_serialized_network(self, network, config):
        return None


def _builder_returns_none(monkeypatch):
    original = _engine._parser

    def parser():
        builder, network, parser = original()
        return _NullBuilder(builder), network, parser

    monkeypatch.setattr(_engine, "_parser", parser)


def _ort_refuses(monkeypatch):
    monkeypatch.setattr(onnxruntime, "InferenceSession", _raise(RuntimeError("injected: ORT load failed")))


# (stage, how to inject, text the warning must carry)
STAGES = [
    ("export", lambda mp: mp.setattr(_region, "export_region", _raise(BuildError("ONNX export failed: injected"))),
     "ONNX export failed: injected"),
    ("export_bug", lambda mp: mp.setattr(_region, "export_region", _raise(KeyError("injected bug"))),
     "KeyError"),
    ("parse", lambda mp: mp.setattr(_region, "parse_network", _raise(BuildError("parser rejected: injected"))),
     "parser rejected: injected"),
    ("build", lambda mp: mp.setattr(_region, "build", _raise(BuildError("TensorRT-RTX build failed: injected"))),
     "build failed: injected"),
    ("build_returns_none", _builder_returns_none, "TensorRT-RTX build failed"),
    ("ort_session", _ort_refuses, "injected: ORT load failed"),
]
IDS = [s[0] for s in STAGES]


@pytest.mark.parametrize(("stage", "inject", "cause"), STAGES, ids=IDS)
def test_failed_region_falls_back_to_pytorch_with_a_warning(monkeypatch, caplog, stage, inject, cause):
    inject(monkeypatch)
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        y = compile_and_run(model, x, **BUILD)
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    assert [r.kind for r in regions()] == ["pytorch"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and "runs in PyTorch" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert "trtrtx_region_0" in warnings[0] and cause in warnings[0]
    assert "engine_cache_hits" not in rtx_backend.stats()


@pytest.mark.parametrize(("stage", "inject", "cause"), STAGES, ids=IDS)
def test_strict_raises_our_error_through_dynamo(monkeypatch, stage, inject, cause):
    inject(monkeypatch)
    model = eval_model(MLP())
    with pytest.raises(BuildError) as info:  # `except rtx_backend.BuildError` catches it: not Dynamo's wrapper
        compile_and_run(model, torch.randn(4, 16), strict=True, **BUILD)
    assert cause in str(info.value)
    assert "TORCHDYNAMO_VERBOSE" not in str(info.value)  # our message, without Dynamo's debugging hints


def test_only_the_failing_region_falls_back(monkeypatch, caplog):
    """Two regions; the export of the second fails: the first still runs in ONNX Runtime."""
    original = _region.export_region
    calls = []

    def export_second_fails(gm, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise BuildError("ONNX export failed: injected")
        return original(gm, **kwargs)

    monkeypatch.setattr(_region, "export_region", export_second_fails)
    model = eval_model(WithEagerOp())
    x = torch.randn(3, 16)
    y = compile_and_run(model, x, torch_executed_ops=["aten.sigmoid"], **BUILD)
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    first, second = regions()  # in graph order, the order they are compiled in
    assert (first.kind, second.kind) == ("onnxruntime", "pytorch")
    assert f"{second.name} runs in PyTorch" in caplog.text
    assert f"{first.name} runs in PyTorch" not in caplog.text


def test_a_failed_build_is_not_cached_and_the_next_compile_builds(monkeypatch):
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    with monkeypatch.context() as mp:
        mp.setattr(_region, "parse_network", _raise(BuildError("parser rejected: injected")))
        compile_and_run(model, x, **BUILD)
    assert [r.kind for r in regions()] == ["pytorch"]
    torch._dynamo.reset()
    y = compile_and_run(model, x, **BUILD)
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    assert [r.kind for r in regions()] == ["onnxruntime"]
    assert regions()[0].engine is not None
    stats = rtx_backend.stats()
    assert stats["engine_builds"] == 1 and "engine_cache_hits" not in stats


@pytest.mark.parametrize("strict", [False, True])
def test_a_failure_outside_the_regions_runs_the_graph_in_pytorch(monkeypatch, caplog, strict):
    """The net under policy and partition: a bug there is a warning (or, strict, an error)."""
    monkeypatch.setattr(_graph, "plan_graph", _raise(ValueError("injected policy bug")))
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    if strict:
        with pytest.raises(Exception) as info:
            compile_and_run(model, x, strict=True, **BUILD)
        assert "injected policy bug" in str(backend_error(info.value))
        return
    y = compile_and_run(model, x, rest="pytorch", **BUILD)  # (rest="auto" sends it to inductor: test_rest.py)
    torch.testing.assert_close(y, model(x))
    assert "this graph runs in PyTorch" in caplog.text and "injected policy bug" in caplog.text


def test_fallback_model_keeps_working_across_calls_and_shapes(monkeypatch):
    """A region that fell back is a plain PyTorch graph: later calls (new values) stay correct."""
    monkeypatch.setattr(_region, "export_region", _raise(BuildError("ONNX export failed: injected")))
    model = eval_model(MLP())
    compiled = torch.compile(model, backend="trtrtx", options=BUILD)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 16)
            torch.testing.assert_close(compiled(x), model(x))


def test_failed_export_never_falls_back_to_strict_export(monkeypatch, caplog):
    """torch.onnx would retry a failed non-strict torch.export in strict mode, which runs Dynamo:
    inside the user's torch.compile that waits on Dynamo's compile lock forever (seen on the GPU
    machine). The bridge exports non-strict only; a failure is a PyTorch fallback, not a hang."""
    real = torch.export.export
    calls = []

    def export(*args, strict=True, **kwargs):
        calls.append(strict)
        if not strict:
            raise RuntimeError("injected non-strict export failure")
        return real(*args, strict=strict, **kwargs)

    monkeypatch.setattr(torch.export, "export", export)
    monkeypatch.setattr(bridge, "direct_program", lambda *a: None)  # (static regions are not traced otherwise)
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    with caplog.at_level(logging.WARNING, "rtx_backend"):
        y = compile_and_run(model, x, **BUILD)
    torch.testing.assert_close(y, model(x))
    assert calls and not any(calls), calls  # only strict=False was tried
    assert "injected non-strict export failure" in caplog.text
    assert [r.kind for r in regions()] == ["pytorch"]
