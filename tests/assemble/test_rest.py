"""rest="inductor": inductor compiles what stays in PyTorch, regions as calls of the region op.

On the CPU the regions run in ONNX Runtime and inductor's code is C++ (it needs a C++ compiler;
the tests skip without one). Each path that leads to PyTorch code has a test: the rest around
the regions, a graph whose lowering failed, a region that fell back at build, validation and
call time; and dynamic shapes with one compile.
"""

from __future__ import annotations

import logging
import shutil
from typing import Any

import pytest
import torch
from torch import nn

import rtx_backend
from rtx_backend._errors import OptionsError
from rtx_backend._options import Options, options_for_mode
from rtx_backend._record import recording
from rtx_backend.assemble import region as _region
from rtx_backend.assemble import rest as _rest
from rtx_backend.assemble import reuse as _reuse
from rtx_backend.run.executors import OrtExecutor
from tests.models import MLP, ConvNet, WithEagerOp, eval_model
from tests.test_dynamic import SWEEP, Block, compiles, size_oblivious

pytestmark = pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None and shutil.which("clang++") is None,
    reason="inductor's CPU code needs a C++ compiler (g++, c++ or clang++), and none is on PATH")

SM86 = [(8, 6)]
BASE = {"engine_cache_dir": "", "runtime_cache_path": "", "min_block_size": 1, "rest": "inductor",
        "target_compute_capabilities": SM86}


def run(model: nn.Module, inputs: list[torch.Tensor], atol: float = 1e-4, **options: Any) -> list[Any]:
    """Compile with rest="inductor", check each call against eager; the compiled regions."""
    compiled = torch.compile(model, backend="trtrtx", options={**BASE, **options})
    with torch.no_grad(), recording() as graphs:
        for x in inputs:
            torch.testing.assert_close(compiled(x), model(x), atol=atol, rtol=atol)
    return [r for g in graphs for r in g.regions]


# ---- options ------------------------------------------------------------------------------------

def test_rest_option_is_validated():
    assert Options.from_dict({"rest": "Inductor"}).rest == "inductor"
    assert Options().rest == "auto"
    with pytest.raises(OptionsError, match=r"rest='tvm' is not valid; choose one of \['auto', 'pytorch', 'inductor'\]"):
        Options.from_dict({"rest": "tvm"})
    with pytest.raises(OptionsError):
        Options(rest=None)  # type: ignore[arg-type]


def test_reduce_overhead_with_the_rest_in_inductor_is_inductors_cuda_graphs():
    ro = options_for_mode("reduce-overhead")
    assert ro.cuda_graph_strategy == "whole_graph_capture" and ro.rest == "auto"
    # rest="pytorch": TensorRT-RTX's own graphs, per engine (unchanged)
    assert _rest.for_regions(ro).cuda_graph_strategy == "whole_graph_capture"
    both = Options(rest="inductor", cuda_graph_strategy="whole_graph_capture")
    # rest="inductor": inductor captures the whole graph; the engines do not capture themselves inside it
    assert _rest._config(both) == {"triton.cudagraphs": True}
    regions = _rest.for_regions(both)
    assert regions.cuda_graph_strategy == "disabled" and regions.rest == "pytorch"


# ---- the rest around the regions ----------------------------------------------------------------

@pytest.mark.parametrize("factory, shape, options", [
    (MLP, (4, 16), {}),
    (WithEagerOp, (4, 16), {"torch_executed_ops": ["aten.sigmoid"]}),
    (ConvNet, (2, 3, 16, 16), {"torch_executed_ops": ["aten.max_pool2d_with_indices"]}),
], ids=["mlp", "eager-op-between-regions", "convnet"])
def test_the_same_graphs_compile_with_the_rest_in_inductor_and_match_eager(factory, shape, options):
    torch.manual_seed(0)
    model = eval_model(factory())
    regions = run(model, [torch.randn(shape), torch.randn(shape)], **options)
    assert regions and all(r.kind == "onnxruntime" for r in regions)
    assert rtx_backend.stats()["rest_inductor_graphs"] == 1


def test_gemms_kept_in_pytorch_run_in_inductor():
    """The Turing-like partition: every GEMM in PyTorch, the rest between them in regions."""
    torch.manual_seed(0)
    model = eval_model(MLP())
    run(model, [torch.randn(4, 16)], torch_executed_ops=["aten.addmm", "aten.mm"])
    assert rtx_backend.stats()["rest_inductor_graphs"] == 1


@pytest.mark.parametrize("kept", [[], ["aten.addmm", "aten.mm"]], ids=["all-lowered", "gemms-in-rest"])
def test_inductor_reads_the_weights_in_place(monkeypatch, kept):
    """Inductor's CUDA graphs copy each input not known to be static into their own memory on every
    replay; for Dynamo's graphs inductor knows the weights from Dynamo's metadata. The rest's
    graph, which we made, is compiled with the weights marked static all the same: every
    parameter's input, and nothing else."""
    from torch._inductor import compile_fx

    seen: list[tuple[list[int], list[Any]]] = []
    inner = compile_fx.compile_fx_inner

    def recording_inner(gm: torch.fx.GraphModule, inputs: list[Any], **kwargs: Any) -> Any:
        seen.append((list(kwargs.get("static_input_idxs") or ()), list(inputs)))
        return inner(gm, inputs, **kwargs)

    monkeypatch.setattr(compile_fx, "compile_fx_inner", recording_inner)
    torch.manual_seed(0)
    model = eval_model(MLP())
    run(model, [torch.randn(4, 16)], torch_executed_ops=kept)
    (static, inputs), = seen
    shapes = {tuple(p.shape) for p in model.parameters()}
    assert static and all(tuple(inputs[i].shape) in shapes for i in static)
    assert [tuple(t.shape) for i, t in enumerate(inputs) if i not in static] == [(4, 16)]


def test_dynamic_shapes_compile_once():
    torch.manual_seed(0)
    model = Block().eval()
    compiled = torch.compile(model, backend="trtrtx", dynamic=True,
                             options={**BASE, "torch_executed_ops": ["aten._softmax"]})
    with size_oblivious(), torch.no_grad(), recording() as graphs:
        for b, s in SWEEP[:8]:
            x = torch.randn(b, s, 32)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4, msg=f"shape {(b, s)}")
    assert compiles() == 1, rtx_backend.stats()  # 0 recompiles over the sweep
    # (inductor tensorifies float scalars by restarting Dynamo's analysis once: a graph
    # recorded before the restart, then the one that runs)
    assert graphs[-1].regions and all(r.onnx.dynamic for r in graphs[-1].regions)
    assert rtx_backend.stats()["rest_inductor_graphs"] == 1


# ---- rest="auto" (the default): inductor where the rest computes ------------------------------------

AUTO = {**BASE, "rest": "auto"}


def test_auto_keeps_a_glue_only_rest_in_pytorch():
    torch.manual_seed(0)
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    compiled = torch.compile(model, backend="trtrtx", options=AUTO)
    with torch.no_grad(), recording() as graphs:
        torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
    assert [r.kind for g in graphs for r in g.regions] == ["onnxruntime"]
    stats = rtx_backend.stats()
    assert stats.get("rest_inductor_graphs", 0) == 0 and stats.get("rest_inductor_whole_graphs", 0) == 0, stats


def test_auto_sends_gemms_kept_in_pytorch_to_inductor(caplog):
    torch.manual_seed(0)
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    compiled = torch.compile(model, backend="trtrtx", options={**AUTO, "torch_executed_ops": ["aten.addmm", "aten.mm"]})
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="rtx_backend"):
        torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
    assert rtx_backend.stats()["rest_inductor_graphs"] == 1
    assert "rest='auto': inductor compiles this graph's rest (it runs addmm outside the regions)" in caplog.text


def test_auto_finds_compute_in_a_region_that_fell_back_at_build(monkeypatch):
    def no_build(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("builder refused")

    monkeypatch.setattr(_region, "export_and_screen", no_build)
    torch.manual_seed(0)
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    compiled = torch.compile(model, backend="trtrtx", options=AUTO)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
    assert rtx_backend.stats()["rest_inductor_graphs"] == 1


# ---- fallbacks: each leads to inductor's code -----------------------------------------------------

@pytest.mark.parametrize("rest", ["inductor", "auto"])
def test_a_graph_whose_lowering_failed_runs_in_inductor(monkeypatch, caplog, rest):
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("lowering broke")

    monkeypatch.setattr(_reuse, "lower", broken)
    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        run(eval_model(MLP()), [torch.randn(4, 16)], rest=rest)
    assert "this graph runs in inductor: compiling it failed (RuntimeError: lowering broke)" in caplog.text
    assert rtx_backend.stats()["rest_inductor_whole_graphs"] == 1


def test_a_region_that_fails_to_build_is_inlined_into_inductors_graph(monkeypatch):
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("export broke")

    monkeypatch.setattr(_region, "export_and_screen", broken)
    torch.manual_seed(0)
    regions = run(eval_model(WithEagerOp()), [torch.randn(4, 16)], torch_executed_ops=["aten.sigmoid"])
    assert len(regions) == 2 and all(r.kind == "pytorch" for r in regions)
    assert rtx_backend.stats()["rest_inductor_graphs"] == 1


def test_a_region_that_fails_at_call_time_runs_in_inductor_from_then_on(monkeypatch, caplog):
    calls = {"n": 0}
    real = OrtExecutor.run

    def flaky(self: OrtExecutor, args: Any, tensors: Any = (), shapes: Any = None) -> Any:
        calls["n"] += 1
        if calls["n"] > 2:  # the first call (validated) works, then the executor fails
            raise RuntimeError("ORT broke")
        return real(self, args, tensors, shapes)

    monkeypatch.setattr(OrtExecutor, "run", flaky)
    torch.manual_seed(0)
    model = eval_model(WithEagerOp())
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        regions = run(model, [torch.randn(4, 16) for _ in range(4)], torch_executed_ops=["aten.sigmoid"])
    assert "ORT broke" in caplog.text
    assert any(r.kind == "pytorch" for r in regions)
    assert rtx_backend.stats()["rest_inductor_region_fallbacks"] >= 1


def test_a_region_that_fails_validation_runs_in_inductor(monkeypatch):
    real = OrtExecutor.run

    def wrong(self: OrtExecutor, args: Any, tensors: Any = (), shapes: Any = None) -> Any:
        return [torch.zeros_like(t) + 3.0 for t in real(self, args, tensors, shapes)]

    monkeypatch.setattr(OrtExecutor, "run", wrong)
    torch.manual_seed(0)
    regions = run(eval_model(MLP()), [torch.randn(4, 16) for _ in range(3)])
    assert regions and all(r.kind == "pytorch" for r in regions)
    assert rtx_backend.stats()["rest_inductor_region_fallbacks"] == len(regions)


def test_inductor_failing_on_the_rest_is_one_warning_and_pytorch(monkeypatch, caplog):
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("inductor broke")

    from torch._inductor import compile_fx

    monkeypatch.setattr(torch._inductor, "compile", broken)
    monkeypatch.setattr(compile_fx, "compile_fx", broken)  # (the entry point where weights are marked static)
    torch.manual_seed(0)
    model = eval_model(WithEagerOp())
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        regions = run(model, [torch.randn(4, 16), torch.randn(4, 16)], torch_executed_ops=["aten.sigmoid"])
    assert regions and all(r.kind == "onnxruntime" for r in regions)
    warnings = [r for r in caplog.records if "inductor could not compile" in r.getMessage()]
    assert len(warnings) == 1 and "RuntimeError: inductor broke" in warnings[0].getMessage()
    assert "rest_inductor_graphs" not in rtx_backend.stats()


# ---- GPU: TensorRT-RTX engines inside inductor's code ---------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("graphs", ["disabled", "whole_graph_capture"])
def test_gpu_engines_run_inside_inductor(graphs):
    """Regions on TensorRT-RTX, the rest in inductor (Triton); with whole_graph_capture the whole
    graph in inductor's CUDA graphs, the engines' enqueues recorded in them."""
    torch.manual_seed(0)
    model = eval_model(WithEagerOp(), torch.float16, "cuda")
    compiled = torch.compile(model, backend="trtrtx", options={
        "min_block_size": 1, "runtime": "tensorrt_rtx", "rest": "inductor", "cuda_graph_strategy": graphs,
        "torch_executed_ops": ["aten.sigmoid"]})
    with torch.no_grad(), recording() as records:
        for _ in range(6):  # cudagraph trees: warm-up, record, then replays
            x = torch.randn(8, 16, device="cuda", dtype=torch.float16)
            torch.testing.assert_close(compiled(x).clone(), model(x), atol=2e-2, rtol=2e-2)
    regions = [r for g in records for r in g.regions]
    assert regions and all(r.kind == "tensorrt_rtx" for r in regions)
    assert all(not r.capture_fallback_said for r in regions)  # recorded, not a PyTorch fallback
    assert all(not r.executor.native_graphs for r in regions)  # no native capture inside inductor's
    assert rtx_backend.stats()["rest_inductor_graphs"] == 1
    if graphs == "whole_graph_capture":
        from torch._dynamo.utils import counters

        assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


@pytest.mark.gpu
def test_gpu_dynamic_sweep_compiles_once_with_the_rest_in_inductor():
    torch.manual_seed(0)
    model = Block().eval().cuda().half()
    compiled = torch.compile(model, backend="trtrtx", dynamic=True, options={
        "runtime": "tensorrt_rtx", "rest": "inductor", "min_block_size": 1,
        "torch_executed_ops": ["aten._softmax"]})
    with size_oblivious(), torch.no_grad():
        for b, s in SWEEP:
            x = torch.randn(b, s, 32, device="cuda", dtype=torch.float16)
            torch.testing.assert_close(compiled(x), model(x), atol=2e-2, rtol=2e-2)
    assert compiles() == 1


def test_the_graph_cache_serves_the_rest_in_inductor(tmp_path):
    torch.manual_seed(0)
    model = eval_model(WithEagerOp())
    options = {"engine_cache_dir": str(tmp_path / "engines"), "torch_executed_ops": ["aten.sigmoid"]}
    run(model, [torch.randn(4, 16)], **options)
    rtx_backend.stats()  # (waits for the cache writes)
    torch._dynamo.reset()
    rtx_backend.reset_stats()
    regions = run(model, [torch.randn(4, 16)], **options)
    stats = rtx_backend.stats()
    assert stats.get("graph_cache_hits") == 1 and stats["rest_inductor_graphs"] == 1
    assert regions and all(r.kind == "onnxruntime" for r in regions)


# ---- fastest: the faster of the engine and inductor's code, per region ---------------------------

def test_fastest_needs_the_rest_in_inductor():
    assert Options(rest="inductor", fastest=True).fastest
    with pytest.raises(OptionsError, match="needs rest='inductor'"):
        Options.from_dict({"fastest": True})
    with pytest.raises(OptionsError):
        Options.from_dict({"rest": "inductor", "fastest": "yes"})


def _count_ort_calls(monkeypatch) -> list[int]:
    calls = [0]
    original = OrtExecutor.run

    def counting(self, args, tensors=(), shapes=None):
        calls[0] += 1
        return original(self, args, tensors, shapes)

    monkeypatch.setattr(OrtExecutor, "run", counting)
    return calls


@pytest.mark.parametrize("faster", ["inductor", "executor"])
def test_fastest_keeps_the_faster_and_records_it_beside_the_engine(tmp_path, monkeypatch, caplog, faster):
    from rtx_backend.run import choices as _choices

    timings = {"inductor": _choices.Timing(executor_ms=2.0, inductor_ms=1.0),
               "executor": _choices.Timing(executor_ms=1.0, inductor_ms=2.0)}
    timed: list[int] = []

    def fake_time_both(executor, inductor, graphs=False):
        executor(), inductor()  # both run on the call's inputs
        timed.append(1)
        return timings[faster]

    monkeypatch.setattr(_choices, "time_both", fake_time_both)
    ort = _count_ort_calls(monkeypatch)
    torch.manual_seed(0)
    model = eval_model(WithEagerOp())  # two regions: each timed on its own (one region: test_rest_fastest.py)
    options = {**BASE, "engine_cache_dir": str(tmp_path), "fastest": True, "torch_executed_ops": ["aten.sigmoid"]}
    x = torch.randn(4, 16)
    compiled = torch.compile(model, backend="trtrtx", options=options)
    with torch.no_grad(), recording() as graphs, caplog.at_level(logging.INFO, logger="rtx_backend"):
        for _ in range(4):
            torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
    assert timed == [1, 1]  # each region timed once, right after the first call's check
    modules = [r for g in graphs for r in g.regions]
    assert len(modules) == 2 and all(m.chosen == ("inductor" if faster == "inductor" else "") for m in modules)
    assert all(m.fastest.scope == "region" for m in modules)
    taken = "1.000" if faster == "inductor" else "2.000"
    assert f"inductor's code for it takes {taken} ms a call and onnxruntime" in caplog.text
    before = ort[0]
    with torch.no_grad():
        compiled(x)
    assert (ort[0] == before) == (faster == "inductor")  # inductor's code runs it: ONNX Runtime does not

    # a new process (Dynamo reset): the decision stored beside the engine is used, nothing is timed
    torch._dynamo.reset()
    monkeypatch.setattr(_choices, "time_both", lambda *a: pytest.fail("timed again"))
    compiled = torch.compile(model, backend="trtrtx", options=options)
    with torch.no_grad(), rtx_backend.recording() as rec:
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
    assert {r.runtime for r in rec.regions} == {"inductor" if faster == "inductor" else "ONNX Runtime"}
    if faster == "inductor":
        assert all("inductor's code for it takes 1.000 ms" in r.why for r in rec.regions)


def test_fastest_choice_of_inductor_is_void_when_its_code_fails(tmp_path, monkeypatch, caplog):
    """A region recorded as faster in inductor's code, whose inductor code then fails: the executor
    runs it, and the recording says so (not "inductor")."""
    from rtx_backend.run import choices as _choices

    monkeypatch.setattr(_choices, "time_both", lambda *a, **k: _choices.Timing(executor_ms=2.0, inductor_ms=1.0))
    torch.manual_seed(0)
    model = eval_model(WithEagerOp())
    options = {**BASE, "engine_cache_dir": str(tmp_path), "fastest": True, "torch_executed_ops": ["aten.sigmoid"]}
    x = torch.randn(4, 16)
    with torch.no_grad():
        for _ in range(3):
            torch.compile(model, backend="trtrtx", options=options)(x)
    torch._dynamo.reset()  # a new process: the decision comes from the record, and inductor's code breaks
    compile_ = torch.compile

    def compile_breaking_inductor(fn, *args, backend="inductor", **kwargs):
        if backend != "inductor":
            return compile_(fn, *args, backend=backend, **kwargs)

        def broken(*a):
            raise RuntimeError("inductor broke on the region")
        return broken

    monkeypatch.setattr(torch, "compile", compile_breaking_inductor)
    compiled = compile_(model, backend="trtrtx", options=options)
    with torch.no_grad(), rtx_backend.recording() as rec, caplog.at_level(logging.WARNING, logger="rtx_backend"):
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
    assert "inductor broke on the region" in caplog.text
    assert rec.regions and {r.runtime for r in rec.regions} == {"ONNX Runtime"}
    assert all(r.fastest is None and "inductor" not in r.why for r in rec.regions)


def test_fastest_times_for_real_and_keeps_correct_results(tmp_path):
    from rtx_backend.run import choices as _choices

    torch.manual_seed(0)
    model = eval_model(WithEagerOp())
    x = torch.randn(4, 16)
    compiled = torch.compile(model, backend="trtrtx", options={
        **BASE, "engine_cache_dir": str(tmp_path), "fastest": True, "torch_executed_ops": ["aten.sigmoid"]})
    with torch.no_grad(), recording() as graphs:
        for _ in range(4):
            torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
    modules = [r for g in graphs for r in g.regions]
    assert len(modules) == 2
    for module in modules:
        stored = _choices.recorded(Options(engine_cache_dir=str(tmp_path)), module.engine_key)
        assert stored is not None and stored.executor_ms > 0 and stored.inductor_ms > 0
        assert module.chosen == ("inductor" if stored.inductor_ms < stored.executor_ms else "")


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", ["disabled", "whole_graph_capture"])
def test_gpu_fastest_times_engine_and_inductor_and_keeps_the_faster(tmp_path, graphs):
    """On the GPU: the engine and inductor's Triton code are timed on the first call (inductor's
    CUDA graphs' warm-up), the decision is stored, and every later call (replays included) is right."""
    from rtx_backend.run import choices as _choices

    torch.manual_seed(0)
    model = eval_model(WithEagerOp(), torch.float16, "cuda")
    compiled = torch.compile(model, backend="trtrtx", options={
        "min_block_size": 1, "runtime": "tensorrt_rtx", "rest": "inductor", "fastest": True,
        "cuda_graph_strategy": graphs, "engine_cache_dir": str(tmp_path), "torch_executed_ops": ["aten.sigmoid"]})
    with torch.no_grad(), recording() as records:
        for _ in range(6):
            x = torch.randn(8, 16, device="cuda", dtype=torch.float16)
            torch.testing.assert_close(compiled(x).clone(), model(x), atol=2e-2, rtol=2e-2)
    regions = [r for g in records for r in g.regions]
    assert regions and all(r.kind == "tensorrt_rtx" for r in regions)
    for r in regions:
        stored = _choices.recorded(Options(engine_cache_dir=str(tmp_path), cuda_graph_strategy=graphs), r.engine_key)
        assert stored is not None and stored.executor_ms > 0 and stored.inductor_ms > 0
        assert r.chosen == ("inductor" if stored.inductor_ms < stored.executor_ms else "")
