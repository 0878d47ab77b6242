"""Option fastest where one region is the whole graph (assemble/rest_fastest.py): trtrtx's compiled
graph against inductor's code for Dynamo's graph, decided once for the graph, and recorded.

On the CPU the region runs in ONNX Runtime and inductor's code is C++ (the tests skip without a
C++ compiler). The timing is forced (choices.time_both patched) so that each side can win.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import rtx_backend
from rtx_backend import _torch_compat
from rtx_backend._options import Options
from rtx_backend._record import recording
from rtx_backend.run import choices as _choices
from rtx_backend.run.executors import OrtExecutor
from tests.models import MLP, WithEagerOp, eval_model

pytestmark = pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None and shutil.which("clang++") is None,
    reason="inductor's CPU code needs a C++ compiler (g++, c++ or clang++), and none is on PATH")

SM86 = [(8, 6)]
INDUCTOR_FASTER = _choices.Timing(executor_ms=2.0, inductor_ms=1.0)
TRTRTX_FASTER = _choices.Timing(executor_ms=1.0, inductor_ms=2.0)


def options(tmp_path, **extra: Any) -> dict[str, Any]:
    """(a weight change is taken in the call that sees it: the runs counted are the engine's)"""
    return {"engine_cache_dir": str(tmp_path / "engines"), "runtime_cache_path": "", "min_block_size": 1,
            "rest": "inductor", "fastest": True, "target_compute_capabilities": SM86, "weight_update": "wait",
            **extra}


def _is_op_graph(gm: torch.fx.GraphModule) -> bool:
    """Whether inductor is given the partitioned graph (regions as op calls), not Dynamo's."""
    return any(n.op == "call_function" and "trtrtx" in str(n.target) for n in gm.graph.nodes)


class Counts:
    """Calls of ONNX Runtime (the region's executor), of inductor's code for Dynamo's whole
    graph, and of time_both (which returns `timing`)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, timing: _choices.Timing | None) -> None:
        self.ort = self.whole = self.timed = 0
        ort_run, compile_ = OrtExecutor.run, _torch_compat.inductor_compile

        def counting_ort(executor: OrtExecutor, args: Any, tensors: Any = (), shapes: Any = None) -> Any:
            self.ort += 1
            return ort_run(executor, args, tensors, shapes)

        def counting_compile(gm: torch.fx.GraphModule, example_inputs: list[Any], config: dict[str, Any],
                             *static: Any) -> Any:
            compiled = compile_(gm, example_inputs, config, *static)
            if _is_op_graph(gm):
                return compiled

            def whole(*args: Any) -> Any:
                self.whole += 1
                return compiled(*args)
            return whole

        def fake_time_both(executor: Any, inductor: Any, graphs: bool = False) -> _choices.Timing:
            executor(), inductor()  # both run on the call's inputs
            self.timed += 1
            if timing is None:
                pytest.fail("timed, where the recorded decision should have been used")
            return timing

        monkeypatch.setattr(OrtExecutor, "run", counting_ort)
        monkeypatch.setattr(_torch_compat, "inductor_compile", counting_compile)
        monkeypatch.setattr(_choices, "time_both", fake_time_both)


def calls(compiled: Any, model: nn.Module, x: torch.Tensor, n: int) -> None:
    with torch.no_grad():
        for _ in range(n):
            torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)


def three_calls_of_an_mlp(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> tuple[Any, nn.Module, torch.Tensor, Any]:
    """The one-region MLP compiled with fastest, called three times (each checked against eager)
    with INFO logged: the compiled model, the model, its input and the region's record."""
    torch.manual_seed(0)
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    compiled = torch.compile(model, backend="trtrtx", options=options(tmp_path))
    with recording() as graphs, caplog.at_level(logging.INFO, logger="rtx_backend"):
        calls(compiled, model, x, 3)
    (region,) = [r for g in graphs for r in g.regions]
    return compiled, model, x, region


@pytest.mark.parametrize("faster", ["inductor", "trtrtx"])
def test_one_region_is_timed_against_inductor_on_the_whole_graph_and_the_faster_kept(
        tmp_path, monkeypatch, caplog, faster):
    counts = Counts(monkeypatch, INDUCTOR_FASTER if faster == "inductor" else TRTRTX_FASTER)
    compiled, model, x, region = three_calls_of_an_mlp(tmp_path, caplog)
    assert counts.timed == 1  # one decision, for the graph: the region's runner did not time it too
    stats = rtx_backend.stats()
    assert stats["rest_inductor_whole_graphs"] == 1 and stats["rest_inductor_graphs"] == 1, stats
    assert "rest_inductor_regions_chosen" not in stats
    assert region.fastest is not None and region.fastest.scope == "graph" and region.fastest.source == "measured"
    assert region.fastest.kept == ("inductor" if faster == "inductor" else "onnxruntime")
    assert "inductor's code for the whole Dynamo graph takes" in caplog.text
    assert (stats.get("rest_inductor_graphs_chosen", 0) == 1) == (faster == "inductor")

    # from then on one of them runs the calls, the other not at all
    ort, whole = counts.ort, counts.whole
    calls(compiled, model, x, 2)
    assert (counts.ort - ort, counts.whole - whole) == ((0, 2) if faster == "inductor" else (2, 0))

    # recorded beside the engine, apart from a per-region decision
    stored = Options(engine_cache_dir=str(tmp_path / "engines"))
    assert _choices.recorded(stored, region.engine_key, "graph") == (
        INDUCTOR_FASTER if faster == "inductor" else TRTRTX_FASTER)
    assert _choices.recorded(stored, region.engine_key) is None

    assert ("inductor's code for the whole Dynamo graph takes 1.000 ms" in region.why) == (faster == "inductor")

    # a change of weights is still seen, whichever runs the graph: the guard refits the region
    # that runs it; inductor's code reads the live weights, and the region it replaced is left be
    with torch.no_grad():
        model.net[0].weight.mul_(0.5)
        model.net[2].bias.add_(1.0)
    ort, whole = counts.ort, counts.whole
    calls(compiled, model, x, 2)
    assert rtx_backend.stats().get("weight_refits", 0) == (0 if faster == "inductor" else 1)
    # (3 runs for 2 calls: the guard checks after the run, drops the run that saw the change, runs again)
    assert (counts.ort - ort, counts.whole - whole) == ((0, 3) if faster == "inductor" else (3, 0))
    # a parameter replaced by a new tensor of the same shape: the same
    with torch.no_grad():
        model.net[2].weight = nn.Parameter(torch.randn_like(model.net[2].weight))
    calls(compiled, model, x, 2)
    assert rtx_backend.stats().get("weight_refits", 0) == (0 if faster == "inductor" else 2)


def test_the_recording_shows_the_whole_graph_decision(tmp_path, monkeypatch):
    Counts(monkeypatch, INDUCTOR_FASTER)
    torch.manual_seed(0)
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    compiled = torch.compile(model, backend="trtrtx", options=options(tmp_path))
    with rtx_backend.recording() as rec:
        calls(compiled, model, x, 2)
    (region,) = rec.regions
    assert region.runtime == "inductor" and region.fastest is not None and region.fastest.scope == "graph"
    assert str(region.fastest).endswith("a call; measured; whole graph: inductor on Dynamo's graph)")


@pytest.mark.parametrize("faster", ["inductor", "trtrtx"])
def test_a_later_process_decides_from_the_record_without_timing(tmp_path, monkeypatch, faster):
    timing = INDUCTOR_FASTER if faster == "inductor" else TRTRTX_FASTER
    Counts(monkeypatch, timing)
    torch.manual_seed(0)
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    calls(torch.compile(model, backend="trtrtx", options=options(tmp_path)), model, x, 2)
    rtx_backend.stats()  # (waits for the engine-cache writes)
    torch._dynamo.reset()
    rtx_backend.reset_stats()

    counts = Counts(monkeypatch, None)  # time_both fails the test if called
    compiled = torch.compile(model, backend="trtrtx", options=options(tmp_path))
    with recording() as graphs:
        calls(compiled, model, x, 3)
    (region,) = [r for g in graphs for r in g.regions]
    assert counts.timed == 0
    assert region.fastest == _choices.Decision("onnxruntime", timing, "cached", "graph")
    # inductor's code for Dynamo's graph is compiled only where it is kept, and then runs every call
    assert rtx_backend.stats().get("rest_inductor_whole_graphs", 0) == (1 if faster == "inductor" else 0)
    assert (counts.whole, counts.ort) == ((3, 0) if faster == "inductor" else (0, 3))


@pytest.mark.parametrize("case", ["two-regions", "rest-computes"])
def test_other_graphs_keep_the_choice_per_region(tmp_path, monkeypatch, case):
    counts = Counts(monkeypatch, INDUCTOR_FASTER)
    torch.manual_seed(0)
    if case == "two-regions":
        model = eval_model(WithEagerOp())
        kept = ["aten.sigmoid"]
    else:  # one region, and a GEMM kept in PyTorch beside it
        model = eval_model(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Tanh()))
        kept = ["aten.addmm"]
    x = torch.randn(4, 16)
    compiled = torch.compile(model, backend="trtrtx", options=options(tmp_path, torch_executed_ops=kept))
    with recording() as graphs:
        calls(compiled, model, x, 3)
    regions = [r for g in graphs for r in g.regions]
    assert len(regions) == (2 if case == "two-regions" else 1)
    assert all(r.fastest is not None and r.fastest.scope == "region" and r.chosen == "inductor" for r in regions)
    assert counts.timed == len(regions) and counts.whole == 0
    stats = rtx_backend.stats()
    assert "rest_inductor_whole_graphs" not in stats and stats["rest_inductor_regions_chosen"] == len(regions)


def test_a_graph_with_symbolic_shapes_keeps_the_choice_per_region(tmp_path, monkeypatch):
    """Inductor's code for Dynamo's graph, compiled at call time, would fit one shape only."""
    counts = Counts(monkeypatch, INDUCTOR_FASTER)
    torch.manual_seed(0)
    model = eval_model(MLP())
    compiled = torch.compile(model, backend="trtrtx", dynamic=True, options=options(tmp_path))
    with recording() as graphs:
        for b in (3, 5, 7):
            calls(compiled, model, torch.randn(b, 16), 1)
    regions = [r for g in graphs for r in g.regions]
    assert regions and all(r.fastest is not None and r.fastest.scope == "region" for r in regions)
    assert counts.whole == 0


def break_inductor_on_dynamos_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor raises on Dynamo's graph, and compiles the partitioned graph (the op graph) as ever."""
    compile_ = _torch_compat.inductor_compile

    def broken(gm: torch.fx.GraphModule, example_inputs: list[Any], config: dict[str, Any], *static: Any) -> Any:
        if not _is_op_graph(gm):
            raise RuntimeError("inductor broke on Dynamo's graph")
        return compile_(gm, example_inputs, config, *static)

    monkeypatch.setattr(_torch_compat, "inductor_compile", broken)


@pytest.mark.parametrize("failing", ["compile", "timing"])
def test_inductor_failing_on_the_whole_graph_keeps_trtrtx(tmp_path, monkeypatch, caplog, failing):
    counts = Counts(monkeypatch, INDUCTOR_FASTER)
    if failing == "compile":
        break_inductor_on_dynamos_graph(monkeypatch)
    else:
        def broken_timing(executor: Any, inductor: Any, graphs: bool = False) -> Any:
            executor(), inductor()
            raise RuntimeError("timing broke")

        monkeypatch.setattr(_choices, "time_both", broken_timing)
    compiled, model, x, region = three_calls_of_an_mlp(tmp_path, caplog)
    assert region.fastest is None and region.kind == "onnxruntime"
    lines = [r.getMessage() for r in caplog.records if "whole Dynamo graph" in r.getMessage()]
    assert len(lines) == 1 and "trtrtx's compiled graph runs it" in lines[0], lines
    assert ("inductor broke" if failing == "compile" else "timing broke") in lines[0]
    ort, whole = counts.ort, counts.whole
    calls(compiled, model, x, 2)
    assert (counts.ort - ort, counts.whole - whole) == (2, 0)
    assert _choices.recorded(Options(engine_cache_dir=str(tmp_path / "engines")), region.engine_key, "graph") is None


def test_strict_raises_where_inductor_fails_on_the_whole_graph(tmp_path, monkeypatch):
    break_inductor_on_dynamos_graph(monkeypatch)
    torch.manual_seed(0)
    model = eval_model(MLP())
    compiled = torch.compile(model, backend="trtrtx", options=options(tmp_path, strict=True))
    with torch.no_grad(), pytest.raises(RuntimeError, match="inductor broke on Dynamo's graph"):
        for _ in range(3):
            compiled(torch.randn(4, 16))


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", ["disabled", "whole_graph_capture"])
def test_gpu_one_region_against_inductor_on_the_whole_graph(tmp_path, graphs):
    """On the GPU, inductor's CUDA graphs included (with whole_graph_capture both sides are timed
    as replays of graphs of their own, compiled without inductor's graphs): timed for real, kept,
    recorded, every call right, and the CUDA generator usable after (torch.randn each call)."""
    torch.manual_seed(0)
    model = eval_model(MLP(), torch.float16, "cuda")
    compiled = torch.compile(model, backend="trtrtx", options={
        "min_block_size": 1, "runtime": "tensorrt_rtx", "rest": "inductor", "fastest": True,
        "cuda_graph_strategy": graphs, "engine_cache_dir": str(tmp_path)})
    with torch.no_grad(), recording() as records:
        for _ in range(6):
            x = torch.randn(8, 16, device="cuda", dtype=torch.float16)
            torch.testing.assert_close(compiled(x).clone(), model(x), atol=2e-2, rtol=2e-2)
    (region,) = [r for g in records for r in g.regions]
    assert region.fastest is not None and region.fastest.scope == "graph"
    stored = _choices.recorded(Options(engine_cache_dir=str(tmp_path), cuda_graph_strategy=graphs),
                               region.engine_key, "graph")
    assert stored is not None and stored == region.fastest.timing
