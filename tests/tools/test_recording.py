"""rtx_backend.recording(): where each region of a compiled model ran, why, and its engine."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import rtx_backend
from rtx_backend import _log
from rtx_backend.assemble import region as _region
from rtx_backend.run import executors as _executors

from ..models import MLP, WithEagerOp, eval_model

SM86 = [(8, 6)]
TWO_REGIONS = {"min_block_size": 1, "torch_executed_ops": ["aten.sigmoid"], "target_compute_capabilities": SM86}
NO_GPU = not torch.cuda.is_available()


def run(model, x, **options):
    compiled = torch.compile(model, backend="trtrtx", options=options)
    with torch.no_grad(), rtx_backend.recording() as rec:
        y = compiled(x)
    return rec, y


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(_log, "SAID", _log.Once())


def test_regions_say_where_they_ran_why_and_that_their_engine_was_built(tmp_path):
    model = eval_model(WithEagerOp())
    rec, _ = run(model, torch.randn(3, 16), engine_cache_dir=str(tmp_path), **TWO_REGIONS)
    assert [g.index for g in rec.graphs] == [0] and not rec.graphs[0].from_graph_cache
    assert sorted(r.name for r in rec.regions) == ["trtrtx_region_0", "trtrtx_region_1"]
    assert all(r.engine == "built" and r.engine_bytes > 1000 for r in rec.regions)
    sigmoid = [n for n in rec.kept_in_pytorch if n.rule == "torch_executed_ops"]
    assert [n.op for n in sigmoid] == ["aten.sigmoid.default"]
    if NO_GPU:
        assert rec.runtimes == {"ONNX Runtime"}
        assert all("CPU-only build" in r.why or "no CUDA GPU" in r.why for r in rec.regions)
    text = str(rec)
    assert text.splitlines()[0].startswith("trtrtx: 1 graph(s) compiled, 2 region(s)")
    assert "engines: 2 built, 0 loaded from the engine cache" in text
    assert "trtrtx_region_1: runs on" in text and "torch_executed_ops x1" in text
    if NO_GPU:  # the one reason of both regions is printed once
        assert text.count(rec.regions[0].why) == 1 and "trtrtx_region_1: runs on ONNX Runtime" in text
        assert "; the same reason" in text
    assert json.loads(json.dumps(rec.to_dict()))["graphs"][0]["regions"][0]["name"] == rec.regions[0].name


def test_a_second_process_loads_the_engines_and_reuses_the_graph(tmp_path):
    model = eval_model(WithEagerOp())
    x = torch.randn(3, 16)
    run(model, x, engine_cache_dir=str(tmp_path), **TWO_REGIONS)
    rtx_backend.stats()  # waits for the cache writes behind the compile
    torch._dynamo.reset()  # as a new process would: Dynamo compiles the model again
    rec, _ = run(model, x, engine_cache_dir=str(tmp_path), **TWO_REGIONS)
    assert [r.engine for r in rec.regions] == ["loaded from the engine cache"] * 2
    assert rec.graphs[0].from_graph_cache == (rtx_backend.stats().get("graph_cache_hits", 0) == 1)


def test_runtime_onnxruntime_is_the_reason_when_it_was_asked_for():
    rec, _ = run(eval_model(MLP()), torch.randn(2, 16), min_block_size=1, runtime="onnxruntime", engine_cache_dir="")
    (region,) = rec.regions
    assert region.runtime == "ONNX Runtime" and region.why == "runtime='onnxruntime' was asked for"
    assert region.engine == "none" and region.engine_bytes == 0


def test_a_region_that_failed_to_compile_runs_in_pytorch_and_says_why(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("exporter exploded")

    monkeypatch.setattr(_region, "export_region", broken)
    rec, _ = run(eval_model(MLP()), torch.randn(2, 16), min_block_size=1, engine_cache_dir="")
    (region,) = rec.regions
    assert region.runtime == "PyTorch" and "exporter exploded" in region.why and "compiling it failed" in region.why


def test_validation_failure_shows_as_pytorch_after_the_call(monkeypatch):
    """The record is read from the live region: first-call validation moved it to PyTorch."""
    real_call = _executors.OrtExecutor.run
    monkeypatch.setattr(_executors.OrtExecutor, "run", lambda self, a, t=(), s=None: [o * 0 for o in real_call(self, a, t, s)])
    model = eval_model(MLP())
    x = torch.randn(2, 16)
    rec, y = run(model, x, min_block_size=1, runtime="onnxruntime", engine_cache_dir="")
    torch.testing.assert_close(y, model(x))  # PyTorch's result, not the zeros
    (region,) = rec.regions
    assert region.runtime == "PyTorch" and "disagreed with PyTorch" in region.why


def test_only_graphs_compiled_inside_the_block_are_recorded():
    model = eval_model(MLP())
    compiled = torch.compile(model, backend="trtrtx", options={"min_block_size": 1, "engine_cache_dir": ""})
    with torch.no_grad():
        compiled(torch.randn(2, 16))
        with rtx_backend.recording() as outer:
            with rtx_backend.recording() as inner:
                torch._dynamo.reset()
                compiled(torch.randn(2, 16))
            compiled(torch.randn(2, 16))  # already compiled: nothing new
    assert len(inner.graphs) == 1 and outer.graphs == ()
    assert "0 graph(s) compiled" in str(outer)


NO_CXX = shutil.which("g++") is None and shutil.which("c++") is None and shutil.which("clang++") is None


def test_without_fastest_a_region_shows_no_decision():
    rec, _ = run(eval_model(MLP()), torch.randn(2, 16), min_block_size=1, engine_cache_dir="", runtime_cache_path="")
    (region,) = rec.regions
    assert region.fastest is None and "fastest" not in str(rec)
    assert json.loads(json.dumps(rec.to_dict()))["graphs"][0]["regions"][0]["fastest"] is None


@pytest.mark.skipif(NO_CXX, reason="inductor's CPU code needs a C++ compiler (g++, c++ or clang++)")
@pytest.mark.parametrize("scope", ["region", "graph"])
@pytest.mark.parametrize("faster", ["inductor", "executor"])
def test_fastest_shows_the_runtime_kept_its_times_and_whether_they_were_measured_or_cached(
        tmp_path, monkeypatch, faster, scope):
    """Per region (two regions around an op kept in PyTorch), and for the graph (one region that
    is the whole graph, timed against inductor's code for Dynamo's graph)."""
    from rtx_backend.run import choices as _choices

    timing = (_choices.Timing(executor_ms=2.5, inductor_ms=1.25) if faster == "inductor"
              else _choices.Timing(executor_ms=1.25, inductor_ms=2.5))
    monkeypatch.setattr(_choices, "time_both", lambda executor, inductor, graphs=False: timing)
    model = eval_model(WithEagerOp() if scope == "region" else MLP())
    x = torch.randn(4, 16)
    options = {"min_block_size": 1, "rest": "inductor", "fastest": True, "engine_cache_dir": str(tmp_path),
               "runtime_cache_path": "", "target_compute_capabilities": SM86,
               "torch_executed_ops": ["aten.sigmoid"] if scope == "region" else []}
    kept = "inductor" if faster == "inductor" else "ONNX Runtime"
    whole = "; whole graph: inductor on Dynamo's graph" if scope == "graph" else ""
    for source in ("measured", "cached"):  # a second process reads the decision beside the engine
        rtx_backend.stats()  # (the engine-cache writes behind the compile)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="trtrtx", options=options)
        with torch.no_grad(), rtx_backend.recording() as rec:
            for _ in range(3):
                torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
        assert len(rec.regions) == (2 if scope == "region" else 1)
        for region in rec.regions:
            assert region.runtime == kept
            assert region.fastest == rtx_backend.FastestRecord(
                kept, {"ONNX Runtime": timing.executor_ms, "inductor": timing.inductor_ms}, source, scope)
            line = next(line for line in str(rec).splitlines() if line.strip().startswith(region.name))
            assert line.endswith(f"fastest: {kept} kept (ONNX Runtime {timing.executor_ms:.3f} ms, "
                                 f"inductor {timing.inductor_ms:.3f} ms a call; {source}{whole})"), line
            assert line.count("1.250 ms") == 1  # the reason inductor runs it is not said twice
        fastest = json.loads(json.dumps(rec.to_dict()))["graphs"][0]["regions"][0]["fastest"]
        assert fastest == {"kept": kept, "source": source, "scope": scope,
                           "times_ms": {"ONNX Runtime": timing.executor_ms, "inductor": timing.inductor_ms}}
        monkeypatch.setattr(_choices, "time_both", lambda *a: pytest.fail("timed again"))


@pytest.mark.gpu
def test_gpu_regions_run_on_tensorrt_rtx_with_no_reason_given(tmp_path):
    model = eval_model(MLP(), torch.float16, "cuda")
    x = torch.randn(4, 16, device="cuda", dtype=torch.float16)
    rec, y = run(model, x, min_block_size=1, engine_cache_dir=str(tmp_path))
    torch.testing.assert_close(y, model(x), atol=1e-2, rtol=1e-2)
    assert rec.runtimes == {"TensorRT-RTX"}
    assert all(r.why == "" and r.engine == "built" and r.engine_bytes > 0 for r in rec.regions)
    rtx_backend.stats()  # the engine-cache writes behind the compile
    torch._dynamo.reset()
    again, _ = run(model, x, min_block_size=1, engine_cache_dir=str(tmp_path))
    assert again.runtimes == {"TensorRT-RTX"}
    assert {r.engine for r in again.regions} == {"loaded from the engine cache"}


@pytest.mark.gpu
def test_gpu_reduce_overhead_mode_runs_tensorrt_rtx_cuda_graphs():
    model = eval_model(MLP(), torch.float16, "cuda")
    x = torch.randn(4, 16, device="cuda", dtype=torch.float16)
    compiled = torch.compile(model, backend="trtrtx", mode="reduce-overhead")
    with torch.no_grad(), rtx_backend.recording() as rec:
        for _ in range(3):
            y = compiled(x)
    torch.testing.assert_close(y, model(x), atol=1e-2, rtol=1e-2)
    assert rec.runtimes == {"TensorRT-RTX"}
    graphs = rec._graphs  # the region modules: their executors use TensorRT-RTX's own CUDA graphs
    assert all(m.executor.native_graphs for g in graphs for m in g.regions)
