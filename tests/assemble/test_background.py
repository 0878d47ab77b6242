"""Engines built behind the compile (option engine_build="background";
rtx_backend/assemble/background.py): PyTorch runs the region from the first call while the update
thread builds its engine, then the engine takes over (ONNX Runtime here, TensorRT-RTX on a GPU),
validated; weights that change meanwhile reach the engine; a failed build leaves the region in
PyTorch; options whose failures must reach the compile wait for the build."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest
import torch

import rtx_backend
from rtx_backend import OptionsError
from rtx_backend._options import Options
from rtx_backend._record import recording
from rtx_backend.assemble import background as _background
from rtx_backend.assemble import region as _region
from rtx_backend.assemble import weights as _weights
from rtx_backend.cache import store as _store
from tests.assemble.test_weights import diff, mlp
from tests.helpers import hold

CPU = {"min_block_size": 1, "target_compute_capabilities": [(8, 6)], "engine_build": "background"}


@pytest.fixture
def held(monkeypatch):
    """Engine builds held until `.set()` (then they run as usual)."""
    yield from hold(monkeypatch, _region, "build_for")


def first_call(model, x, **options):
    """The compiled model after its first call, and its one region (live)."""
    compiled = torch.compile(model, backend="trtrtx", options={**CPU, **options})
    with recording() as graphs:
        assert diff(compiled, model, x) == 0.0  # PyTorch's own result
    (region,) = [r for g in graphs for r in g.regions]
    return compiled, region


def test_pytorch_runs_the_region_until_its_engine_is_built(held, caplog):
    model, x = mlp(), torch.randn(8, 6)
    with caplog.at_level(logging.INFO, logger="rtx_backend"):
        compiled, region = first_call(model, x)
        assert region.kind == "pytorch" and region.why == _background.BUILDING
        assert diff(compiled, model, x) == 0.0
        stats = rtx_backend.stats()
        assert stats["background_builds"] == 1 and not stats.get("engine_builds"), stats
        assert not rtx_backend.wait_for_updates(timeout=0.2)  # still held
        held.set()
        assert rtx_backend.wait_for_updates(60)
    assert region.kind == "onnxruntime" and region.engine is not None and region.engine_source == "built"
    assert diff(compiled, model, x) < 1e-5
    stats = rtx_backend.stats()
    assert stats["engine_builds"] == 1 and stats["background_builds_done"] == 1, stats
    assert stats.get("validations") == 1, stats  # the engine's first call was checked
    assert "1 being built in the background" in caplog.text
    assert "built in the background in" in caplog.text


def test_the_engine_is_stored_and_a_later_compile_loads_it_at_once(held):
    model, x = mlp(), torch.randn(8, 6)
    first_call(model, x)
    held.set()
    assert rtx_backend.wait_for_updates(60)
    _store.THREADS.flush(timeout=60)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="trtrtx", options=CPU)
    with recording() as graphs:
        assert diff(compiled, model, x) < 1e-5
    (region,) = [r for g in graphs for r in g.regions]
    assert region.kind == "onnxruntime" and region.engine_source == "engine cache"
    assert rtx_backend.stats()["background_builds"] == 1  # the first compile's only


def test_weights_changed_during_the_build_reach_the_engine(held):
    model, x = mlp(), torch.randn(8, 6)
    compiled, region = first_call(model, x)
    with torch.no_grad():
        model[0].weight.mul_(2.0)
    assert diff(compiled, model, x) == 0.0  # the guard saw the change; PyTorch has the new weights
    held.set()
    assert rtx_backend.wait_for_updates(60)
    assert region.kind == "onnxruntime"
    assert diff(compiled, model, x) < 1e-5  # not the engine of the compile's weights
    stats = rtx_backend.stats()
    assert stats["background_builds_updated"] == 1 and stats.get("weight_refits") == 1, stats
    assert not stats.get("background_builds_done")


def test_weights_changed_in_place_without_a_call_are_seen_once_the_engine_runs(held):
    model, x = mlp(), torch.randn(8, 6)
    compiled, region = first_call(model, x)
    with torch.no_grad():
        model[2].bias.add_(1.0)
    held.set()
    assert rtx_backend.wait_for_updates(60)
    assert region.kind == "onnxruntime"
    assert diff(compiled, model, x) < 1e-5  # the guard saw the change on this call
    assert rtx_backend.wait_for_updates(60)
    assert diff(compiled, model, x) < 1e-5
    assert rtx_backend.stats().get("weight_refits") == 1


def test_a_failed_build_leaves_the_region_in_pytorch_with_a_warning(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("builder refused")

    monkeypatch.setattr(_region, "build_for", broken)
    model, x = mlp(), torch.randn(8, 6)
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        compiled, region = first_call(model, x)
        assert rtx_backend.wait_for_updates(60)
    assert region.kind == "pytorch" and "could not be built in the background" in region.why
    assert diff(compiled, model, x) == 0.0
    said = [r.getMessage() for r in caplog.records if "could not be built in the background" in r.getMessage()]
    assert len(said) == 1 and "RuntimeError: builder refused" in said[0]
    assert rtx_backend.stats()["background_build_failures"] == 1


def test_rest_auto_does_not_take_a_region_being_built_for_pytorch_compute(held):
    model, x = mlp(), torch.randn(8, 6)
    first_call(model, x, rest="auto")
    assert not rtx_backend.stats().get("rest_inductor_graphs")


@pytest.mark.parametrize("options", [{"strict": True}, {"runtime": "tensorrt_rtx"},
                                     {"rest": "inductor", "fastest": True}])
def test_options_whose_failures_reach_the_compile_wait_for_the_build(options):
    assert not _background.wanted(Options.from_dict({"engine_build": "background", **options}))
    assert _background.wanted(Options.from_dict({"engine_build": "background"}))
    assert not _background.wanted(Options.from_dict({}))  # waiting is the default


def test_the_tools_build_before_they_return(tmp_path):
    """crosscheck and save need the engines the compile builds: they wait, whatever the option says."""
    model, x = mlp(), torch.randn(8, 6)
    info = rtx_backend.save(model, (x,), tmp_path / "m.pt2", options=CPU)
    assert info is not None
    report = rtx_backend.crosscheck(model, x, options=CPU)
    assert report and report.regions, report
    assert not rtx_backend.stats().get("background_builds")
    assert rtx_backend.stats()["engine_builds"] >= 2  # one each, before they returned


_EXITS_AT_ONCE = """
import torch, rtx_backend
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
c = torch.compile(m, backend="trtrtx", options={"min_block_size": 1, "target_compute_capabilities": [(8, 6)],
                                                  "engine_build": "background"})
with torch.no_grad(), rtx_backend.recording() as rec:
    x = torch.randn(8, 6)
    torch.testing.assert_close(c(x), m(x), atol=1e-5, rtol=1e-5)
print("background builds", rtx_backend.stats().get("background_builds", 0))
print("regions", [(r.runtime, r.engine) for r in rec.regions])
"""


def test_a_process_that_exits_while_an_engine_is_built_ends_cleanly_and_keeps_the_engine(tmp_path):
    """The interpreter waits for the build at exit (no crash, no hang), and the engine cache has
    the engine: the next process loads it."""
    env = {**os.environ, "RTX_BACKEND_CACHE_DIR": str(tmp_path / "cache")}
    runs = [subprocess.run([sys.executable, "-c", _EXITS_AT_ONCE], capture_output=True, text=True, timeout=300,
                           env=env) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    assert "background builds 1" in runs[0].stdout and "background builds 0" in runs[1].stdout, [r.stdout for r in runs]
    assert "[('ONNX Runtime', 'loaded from the engine cache')]" in runs[1].stdout, runs[1].stdout


def test_an_unknown_engine_build_is_refused():
    with pytest.raises(OptionsError, match="engine_build"):
        Options.from_dict({"engine_build": "later"})


@pytest.mark.gpu
def test_on_the_gpu_the_engine_takes_over_once_built():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).cuda().half().eval()
    x = torch.randn(16, 64, device="cuda", dtype=torch.half)
    compiled = torch.compile(model, backend="trtrtx", options={"engine_build": "background", "min_block_size": 1})
    with torch.inference_mode(), recording() as graphs:
        first = compiled(x)
        torch.testing.assert_close(first, model(x), atol=1e-2, rtol=1e-2)  # (PyTorch ran it: the build takes seconds)
        assert rtx_backend.wait_for_updates(120)
        (region,) = [r for g in graphs for r in g.regions]
        assert region.kind == "tensorrt_rtx", region.why
        torch.testing.assert_close(compiled(x), model(x), atol=2e-2, rtol=2e-2)
    stats = rtx_backend.stats()
    assert stats["background_builds_done"] == 1 and stats.get("validations") == 1, stats


@pytest.mark.gpu
def test_on_the_gpu_two_regions_with_native_cuda_graphs_take_over_while_the_model_runs():
    """Calls go on while the engines are built and their contexts made: each call is right, and
    both regions end on TensorRT-RTX (each engine captured in its own CUDA graph)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64), torch.nn.Sigmoid(),
                                torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 32)).cuda().half().eval()
    x = torch.randn(16, 64, device="cuda", dtype=torch.half)
    compiled = torch.compile(model, backend="trtrtx", options={
        "engine_build": "background", "min_block_size": 1, "torch_executed_ops": ["aten.sigmoid"],
        "cuda_graph_strategy": "whole_graph_capture"})
    deadline = time.monotonic() + 120
    with torch.inference_mode(), recording() as graphs:
        expected = model(x)
        kinds: list[str] = []
        while time.monotonic() < deadline:
            torch.testing.assert_close(compiled(x), expected, atol=2e-2, rtol=2e-2)
            kinds = [r.kind for g in graphs for r in g.regions]
            if kinds == ["tensorrt_rtx", "tensorrt_rtx"]:
                break
        assert kinds == ["tensorrt_rtx", "tensorrt_rtx"], [r.why for g in graphs for r in g.regions]
        assert rtx_backend.wait_for_updates(60)
        for _ in range(3):
            torch.testing.assert_close(compiled(x), expected, atol=2e-2, rtol=2e-2)
    stats = rtx_backend.stats()
    assert stats["background_builds"] == 2 and stats["background_builds_done"] == 2, stats


def test_a_dynamic_region_built_in_the_background_serves_every_shape(held):
    model = mlp()
    compiled = torch.compile(model, backend="trtrtx", options=CPU, dynamic=True)
    with recording() as graphs:
        for batch in (8, 3):
            assert diff(compiled, model, torch.randn(batch, 6)) == 0.0
        held.set()
        assert rtx_backend.wait_for_updates(60)
        for batch in (8, 3, 17):
            assert diff(compiled, model, torch.randn(batch, 6)) < 1e-5
    assert [r.kind for g in graphs for r in g.regions] == ["onnxruntime"]
    assert rtx_backend.stats()["background_builds_done"] == 1


@pytest.mark.parametrize("rest", ["pytorch", "inductor"])
def test_two_regions_both_take_over_around_the_rest(held, rest):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.Sigmoid(),
                                torch.nn.Linear(16, 4)).eval()
    x = torch.randn(8, 6)
    compiled = torch.compile(model, backend="trtrtx", options={**CPU, "rest": rest, "torch_executed_ops": ["aten.sigmoid"]})
    with recording() as graphs:
        assert diff(compiled, model, x) < 1e-5
        assert [r.kind for g in graphs for r in g.regions] == ["pytorch", "pytorch"]
        held.set()
        assert rtx_backend.wait_for_updates(60)
        assert diff(compiled, model, x) < 1e-5
    assert [r.kind for g in graphs for r in g.regions] == ["onnxruntime", "onnxruntime"]
    stats = rtx_backend.stats()
    assert stats["background_builds_done"] == 2 and not stats.get("rest_inductor_region_fallbacks"), stats


def test_weights_that_changed_during_the_build_and_cannot_be_taken_leave_the_region_in_pytorch(held, monkeypatch,
                                                                                               caplog):
    def refused(*args, **kwargs):
        raise RuntimeError("refit refused")

    monkeypatch.setattr(_weights, "_take", refused)
    model, x = mlp(), torch.randn(8, 6)
    compiled, region = first_call(model, x, weight_update="wait")
    with torch.no_grad():
        model[0].weight.mul_(2.0)
    assert diff(compiled, model, x) == 0.0
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        held.set()
        assert rtx_backend.wait_for_updates(60)
    assert region.kind == "pytorch" and "could not take them" in region.why
    assert diff(compiled, model, x) == 0.0  # PyTorch, with the live weights
    assert "RuntimeError: refit refused" in caplog.text
