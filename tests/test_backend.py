"""End to end through torch.compile(backend="trtrtx") on CPU (engines built AOT, run by ONNX Runtime)."""

from __future__ import annotations

import logging
import operator
import subprocess
import sys

import pytest
import torch
from parameterized import parameterized

import rtx_backend
from rtx_backend import _backend as _backend_module
from rtx_backend import _log, _trt
from rtx_backend.build import engine as _engine

from .helpers import _LAST, compile_and_run, regions
from .models import MLP, ConvNet, WithEagerOp, eval_model

SM86 = [(8, 6)]


def test_backend_found_by_name_in_fresh_interpreter():
    code = (
        "import torch, sys\n"
        "assert 'rtx_backend' not in sys.modules\n"
        "from torch._dynamo import list_backends\n"
        "assert 'trtrtx' in list_backends(exclude_tags=()), list_backends(exclude_tags=())\n"
        "m = torch.nn.Linear(4, 4).eval()\n"
        "c = torch.compile(m, backend='trtrtx', options={'min_block_size': 1})\n"
        "x = torch.randn(2, 4)\n"
        "with torch.no_grad(): assert torch.allclose(c(x), m(x), atol=1e-5)\n"
        "print('ok', 'rtx_backend' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok True")


def test_unknown_option_rejected_through_torch_compile():
    model = eval_model(MLP())
    with pytest.raises(Exception) as info:
        compile_and_run(model, torch.randn(2, 16), min_blok_size=2)
    assert isinstance(getattr(info.value, "inner_exception", info.value), rtx_backend.OptionsError)
    assert "min_block_size" in str(info.value)  # the message lists the valid keys


def test_options_reach_the_backend():
    model = eval_model(MLP())
    compile_and_run(model, torch.randn(2, 16), min_block_size=1, target_compute_capabilities=SM86)
    assert rtx_backend.stats()["engine_builds"] == 1
    torch._dynamo.reset()
    rtx_backend.reset_stats()
    compile_and_run(model, torch.randn(2, 16), min_block_size=100, target_compute_capabilities=SM86)
    assert rtx_backend.stats().get("engine_builds", 0) == 0  # every region below min_block_size


@parameterized.expand([("mlp", MLP, (4, 16)), ("convnet", ConvNet, (2, 3, 16, 16))])
def test_matches_eager_with_one_region(_name, cls, shape):
    model = eval_model(cls())
    x = torch.randn(*shape)
    y = compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86)
    torch.testing.assert_close(y, model(x), atol=1e-4, rtol=1e-4)
    built = [r for r in regions() if r.engine is not None]
    assert len(built) == 1
    assert built[0].kind == "onnxruntime"  # no GPU here: the ONNX model runs


def test_torch_executed_op_splits_the_graph():
    model = eval_model(WithEagerOp())
    x = torch.randn(3, 16)
    y = compile_and_run(
        model, x, min_block_size=1, target_compute_capabilities=SM86, torch_executed_ops=["aten.sigmoid"]
    )
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    assert rtx_backend.stats()["engine_builds"] == 2


def test_min_block_size_keeps_small_regions_in_pytorch():
    model = eval_model(WithEagerOp())
    x = torch.randn(3, 16)
    # after the split, the second region (addmm, relu, sub) has 3 compute nodes, the first 4
    y = compile_and_run(
        model, x, min_block_size=4, target_compute_capabilities=SM86, torch_executed_ops=["aten.sigmoid"]
    )
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    assert rtx_backend.stats()["engine_builds"] == 1


@parameterized.expand([("onnxruntime",), ("auto",)])
def test_onnxruntime_path_gives_eager_result(runtime):
    model = eval_model(ConvNet())
    x = torch.randn(2, 3, 16, 16)
    y = compile_and_run(model, x, min_block_size=1, runtime=runtime)
    torch.testing.assert_close(y, model(x), atol=1e-4, rtol=1e-4)
    assert [r.kind for r in regions()] == ["onnxruntime"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
def test_runtime_tensorrt_rtx_raises_without_gpu():
    model = eval_model(MLP())
    with pytest.raises(Exception, match="cannot run here"):
        compile_and_run(model, torch.randn(2, 16), min_block_size=1, runtime="tensorrt_rtx",
                        target_compute_capabilities=SM86)


def test_graph_needing_autograd_runs_in_pytorch(monkeypatch, caplog):
    monkeypatch.setattr(_log, "SAID", _log.Once())
    model = MLP()  # parameters require grad, grad mode on
    x = torch.randn(2, 16)
    compiled = torch.compile(model, backend="trtrtx", options={"min_block_size": 1})
    y = compiled(x)
    y.sum().backward()
    assert model.net[0].weight.grad is not None
    assert "inference graphs only" in caplog.text
    assert rtx_backend.stats().get("engine_builds", 0) == 0


def test_declared_targets_are_set_on_the_builder(monkeypatch):
    seen = []
    original = _engine.configure_targets

    def spy(config, targets):
        original(config, targets)
        seen.append([config.get_compute_capability(i) for i in range(config.num_compute_capabilities)])

    monkeypatch.setattr(_engine, "configure_targets", spy)
    targets = [(7, 5), (8, 6), (8, 9), (12, 0)]
    model = eval_model(ConvNet(), torch.float16)
    compile_and_run(model, torch.randn(2, 3, 16, 16, dtype=torch.float16), min_block_size=1,
                    target_compute_capabilities=targets)
    trt = _trt.trt()
    assert seen == [[trt.ComputeCapability.SM75, trt.ComputeCapability.SM86,
                     trt.ComputeCapability.SM89, trt.ComputeCapability.SM120]]
    engine = regions()[-1].engine
    assert engine is not None and len(engine) > 1000


def test_unknown_target_names_the_supported_ones():
    with pytest.raises(rtx_backend.TargetError, match=r"\(7, 5\).*\(8, 6\)"):
        rtx_backend.Options.from_dict({"target_compute_capabilities": [(9, 0)]})


def test_parser_errors_surface_with_their_message():
    with pytest.raises(rtx_backend.BuildError, match="parser"):
        _engine.build(b"not an onnx model", ((8, 6),), {})


# ---- GPU: the same models through TensorRT-RTX engines -------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize(("cls", "shape"), [(MLP, (4, 16)), (ConvNet, (2, 3, 16, 16))])
def test_gpu_engine_path(cls, shape):
    for dtype, tol in ((torch.float32, 1e-3), (torch.float16, 1e-2)):
        torch._dynamo.reset()
        model = eval_model(cls(), dtype, "cuda")
        x = torch.randn(*shape, device="cuda", dtype=dtype)
        y = compile_and_run(model, x, min_block_size=1, runtime="tensorrt_rtx")
        torch.testing.assert_close(y, model(x), atol=tol, rtol=tol)
        assert regions()[-1].kind == "tensorrt_rtx"
        assert y.device.type == "cuda" and y.dtype == dtype


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_encoder_fast_path_is_lowered(norm_first, activation):
    """eval + no_grad + batch_first takes PyTorch's fused encoder-layer kernel; it is decomposed
    into the layer's ops, so the whole encoder becomes one region instead of staying in PyTorch."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True,
                                             norm_first=norm_first, activation=activation)
    model = eval_model(torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False))
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        expected = model(x)  # the fast path's fused kernel
    y = compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86)
    torch.testing.assert_close(y, expected, atol=1e-4, rtol=1e-4)
    eager_ops = [op for g in _LAST for _, op in g.plan.eager_ops]
    assert not eager_ops, eager_ops
    assert [r.kind for r in regions() if r.engine is not None] == ["onnxruntime"]


class _Plain(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2) + 1


class _MutatesInput(torch.nn.Module):
    def forward(self, x):
        x.mul_(2)
        return torch.relu(x) + 1


class _ReturnsViewOfInput(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1, x.view(-1)


@pytest.mark.parametrize(("cls", "direct"), [(_Plain, True), (_MutatesInput, False), (_ReturnsViewOfInput, False)])
def test_aot_wrappers_are_skipped_only_when_they_have_nothing_to_do(monkeypatch, cls, direct):
    from rtx_backend.lower import lowering as _lowering

    verdicts = []
    judge = _lowering.plain_calling_convention

    def spy(*args):
        verdicts.append(judge(*args))
        return verdicts[-1]

    monkeypatch.setattr(_lowering, "plain_calling_convention", spy)
    torch._dynamo.reset()
    model = cls()
    x = torch.randn(3, 8)
    expected_x = x.clone()
    with torch.no_grad():
        expected = model(expected_x)
        compiled = torch.compile(model, backend="trtrtx", options={"min_block_size": 1})
        for _ in range(2):  # the second call runs what the first compiled
            got_x = x.clone()
            got = compiled(got_x)
            torch.testing.assert_close(got, expected)
            torch.testing.assert_close(got_x, expected_x)  # the input mutation happened, once
    assert verdicts == [direct]
    if cls is _ReturnsViewOfInput:
        assert got[1]._base is got_x  # still a view of the input, as in eager


@pytest.mark.gpu
def test_gpu_transformer_encoder_fp16_runs_on_tensorrt_rtx():
    """On CUDA the encoder's fast path and its attention kernels (flash/efficient) are lowered."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    model = eval_model(torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), device="cuda").half()
    x = torch.randn(2, 16, 64, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        expected = model(x)
    y = compile_and_run(model, x, min_block_size=1, runtime="tensorrt_rtx")
    torch.testing.assert_close(y, expected, atol=2e-2, rtol=2e-2)
    assert [r.kind for r in regions()] == ["tensorrt_rtx"]
    assert not [op for g in _LAST for _, op in g.plan.eager_ops]


class _TransposedBoundary(torch.nn.Module):
    """A region ends in a transpose (its engine returns it contiguous); the PyTorch side then
    undoes the transpose and flattens, which aot_autograd traced as a view of the transposed
    layout."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = torch.relu(self.linear(x)).transpose(1, 2)
        return torch.sigmoid(y).transpose(1, 2).reshape(x.shape[0], -1)


def test_pytorch_side_views_take_engine_outputs_of_any_layout():
    model = eval_model(_TransposedBoundary())
    x = torch.randn(2, 5, 8)
    y = compile_and_run(model, x, min_block_size=1, torch_executed_ops=["aten.sigmoid"],
                        target_compute_capabilities=SM86)
    torch.testing.assert_close(y, model(x))
    assert regions() and all(r.kind == "onnxruntime" for r in regions())  # none fell back to PyTorch



def test_the_compiled_graph_runs_its_generated_code_without_reentering_module_call(monkeypatch):
    """The partitioned graph's code is generated at compile time: a call goes straight into it, not
    through a lazy stub that re-enters GraphModule.__call__ (microseconds on every call). Two
    regions around a PyTorch op: the graph's code runs (a graph of one region is not called, see
    direct_forward)."""
    from rtx_backend._record import recording

    model = eval_model(WithEagerOp())
    x = torch.randn(4, 16)
    torch._dynamo.reset()
    fn = torch.compile(model, backend="trtrtx", options={"runtime": "onnxruntime", "engine_cache_dir": "",
                                                         "min_block_size": 1, "torch_executed_ops": ["aten.sigmoid"]})
    with torch.no_grad(), recording() as graphs:
        fn(x)
    gm = graphs[0].plan.graph_module
    calls: list[int] = []
    original = type(gm).__call__
    monkeypatch.setattr(type(gm), "__call__", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    with torch.no_grad():
        y = fn(x)
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    assert calls == []


# ---- the function handed back to Dynamo --------------------------------------------------------


def _one_region_graph(returned: str) -> torch.fx.GraphModule:
    """A partitioned graph by hand: inputs x, w, y; one region module taking (y, x) that returns
    (y + x, y @ x); the graph returns `returned` of the region's results ("01", "10" or "0")."""
    from rtx_backend.run.executors import TorchExecutor
    from rtx_backend.run.region import RegionModule

    def body(a, b):
        return (a + b, a @ b)

    region_gm = torch.fx.symbolic_trace(body)
    root = torch.nn.Module()
    root.region_0 = RegionModule("region_0", region_gm, None, None, TorchExecutor(region_gm), device=torch.device("cpu"))
    graph = torch.fx.Graph()
    x, _, y = (graph.placeholder(n) for n in ("x", "w", "y"))
    call = graph.call_module("region_0", (y, x))
    items = [graph.call_function(operator.getitem, (call, i)) for i in (0, 1)]
    graph.output(tuple(items[int(i)] for i in returned))
    return torch.fx.GraphModule(root, graph)


@pytest.mark.parametrize(("returned", "direct"), [("01", True), ("10", False), ("0", False)])
def test_a_graph_that_is_one_region_is_called_without_its_graph_code(returned, direct):
    from rtx_backend.run.region import direct_forward

    gm = _one_region_graph(returned)
    fn = direct_forward(gm)
    assert (fn != gm.forward) == direct  # (a bound method compares equal to a fresh one)
    args = (torch.randn(3, 3), torch.randn(3), torch.randn(3, 3))
    expected = gm.forward(*args)
    got = fn(*args)
    assert isinstance(got, tuple) and len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


def test_a_graph_with_pytorch_ops_around_its_region_keeps_its_graph_code():
    model = eval_model(WithEagerOp())
    x = torch.randn(2, 16)
    y = compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86, torch_executed_ops=["aten.sigmoid"])
    torch.testing.assert_close(y, model(x))
    from rtx_backend.run.region import direct_forward

    gm = _LAST[0].plan.graph_module
    assert len(regions()) == 2
    assert direct_forward(gm) == gm.forward


def test_a_region_called_directly_runs_with_autocast_off_and_calls_its_hooks():
    from rtx_backend.run.region import direct_forward

    gm = _one_region_graph("01")
    fn = direct_forward(gm)
    args = (torch.randn(3, 3), torch.randn(3), torch.randn(3, 3))
    expected = gm.forward(*args)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert gm.forward(*args)[1].dtype == torch.bfloat16  # what autocast would do to the region's matmul
        got = fn(*args)
    assert [t.dtype for t in got] == [torch.float32, torch.float32]
    torch.testing.assert_close(got, expected)
    seen = []
    handle = gm.region_0.register_forward_hook(lambda module, inputs, out: seen.append(len(inputs)))
    fn(*args)
    handle.remove()
    fn(*args)
    assert seen == [2]



# ---- torch.compile's mode= --------------------------------------------------------------------

def _options_seen(monkeypatch) -> list:
    seen = []
    real = _backend_module.compile_or_reuse

    def spy(gm, example_inputs, options, *rest):
        seen.append(options)
        return real(gm, example_inputs, options, *rest)

    monkeypatch.setattr(_backend_module, "compile_or_reuse", spy)
    return seen


@pytest.mark.parametrize(("mode", "strategy"), [("reduce-overhead", "whole_graph_capture"), ("default", "disabled")])
def test_mode_maps_onto_tensorrt_rtx_cuda_graphs(monkeypatch, mode, strategy):
    seen = _options_seen(monkeypatch)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    x = torch.randn(2, 8)
    compiled = torch.compile(model, backend="trtrtx", mode=mode)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    assert [o.cuda_graph_strategy for o in seen] == [strategy]


@pytest.mark.parametrize(("mode", "says"), [
    ("max-autotune", "mode='reduce-overhead'"),
    ("max-autotune-no-cudagraphs", "TensorRT-RTX's builder picks the kernels"),
    ("fastest", "choose one of ['default', 'reduce-overhead']"),
])
def test_modes_that_do_not_map_raise_options_error_saying_what_to_use(mode, says):
    compiled = torch.compile(torch.nn.Linear(4, 4).eval(), backend="trtrtx", mode=mode)
    with pytest.raises(rtx_backend.OptionsError) as info, torch.no_grad():
        compiled(torch.randn(2, 4))
    assert says in str(info.value)


def test_mode_and_options_together_agree_or_raise():
    from rtx_backend._options import options_for_mode

    assert options_for_mode("reduce-overhead", {"min_block_size": 2}).cuda_graph_strategy == "whole_graph_capture"
    assert options_for_mode("reduce-overhead", {"cuda_graph_strategy": "whole_graph_capture"}).min_block_size == 5
    with pytest.raises(rtx_backend.OptionsError, match="drop one"):
        options_for_mode("reduce-overhead", {"cuda_graph_strategy": "disabled"})


# ---- a graph of which nothing is lowered because of the targets says so at WARNING -------------

def test_fp32_model_for_turing_that_lowers_nothing_warns_with_the_fix(monkeypatch, caplog):
    monkeypatch.setattr(_log, "SAID", _log.Once())
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8)).eval()
    compiled = torch.compile(model, backend="trtrtx", options={"target_compute_capabilities": [(7, 5)],
                                                              "engine_cache_dir": ""})
    with caplog.at_level(logging.WARNING, logger="rtx_backend"), torch.no_grad():
        compiled(torch.randn(2, 8))
    (message,) = [r.getMessage() for r in caplog.records if "nothing of this graph runs" in r.getMessage()]
    assert "fp32-gemm-turing kept 2 node(s)" in message and "run the model in FP16" in message


# ---- a word where something the user would not expect happens -----------------------------------

@pytest.mark.parametrize(("options", "rule", "fix"), [
    ({"min_block_size": 50}, "min_block_size", "lower min_block_size"),
    ({"min_block_size": 1, "torch_executed_ops": ["aten.addmm", "aten.relu", "aten.gelu"]}, "torch_executed_ops",
     "remove the op from torch_executed_ops"),
])
def test_a_graph_that_gives_no_region_warns_with_the_rule_and_the_fix(monkeypatch, caplog, options, rule, fix):
    monkeypatch.setattr(_log, "SAID", _log.Once())
    model = eval_model(MLP())
    compiled = torch.compile(model, backend="trtrtx", options={**options, "engine_cache_dir": ""})
    with caplog.at_level(logging.WARNING, logger="rtx_backend"), torch.no_grad():
        compiled(torch.randn(2, 16))
    said = [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "nothing of this graph runs" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert f"{rule} kept" in said[0] and fix in said[0] and "\n" not in said[0]


def test_graphs_not_lowered_under_grad_are_in_the_recording_and_said_once(monkeypatch, caplog):
    monkeypatch.setattr(_log, "SAID", _log.Once())
    model = MLP()  # parameters require grad, grad mode on
    compiled = torch.compile(model, backend="trtrtx", options={"min_block_size": 1, "engine_cache_dir": ""})
    with rtx_backend.recording() as rec:
        compiled(torch.randn(2, 16))
        compiled(torch.randn(3, 16))  # a second graph (a recompile for the new batch size)
    first, second = rec.graphs
    assert "autograd" in first.not_lowered and first.regions == () and second.not_lowered == first.not_lowered
    assert str(rec).count("not lowered") == 2 and "autograd" in str(rec)
    assert rec.to_dict()["graphs"][0]["not_lowered"] == first.not_lowered
    assert sum("inference graphs only" in r.getMessage() for r in caplog.records) == 1  # one line, not one a graph


def test_a_dtype_change_that_recompiles_says_so_once_per_change(caplog):
    model = eval_model(MLP())
    compiled = torch.compile(model, backend="trtrtx", options={"min_block_size": 1, "engine_cache_dir": ""})
    x = torch.randn(2, 16)
    with caplog.at_level(logging.WARNING, logger="rtx_backend"), torch.no_grad():
        compiled(x)
        compiled(torch.randn(3, 16))  # a shape change: a recompile, but not for a dtype
        assert not [r for r in caplog.records if "changed dtype" in r.getMessage()], caplog.text
        model.half()
        y = compiled(x.half())
        compiled(x.half())  # compiled already: nothing more to say
    said = [r.getMessage() for r in caplog.records if "changed dtype" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert "now float16, before float32" in said[0] and "model.half()" in said[0]
    assert y.dtype == torch.float16


def test_warning_lines_carry_one_line_of_a_long_error():
    error = RuntimeError("export failed\n\n## Report\n" + "detail " * 200 + "\nline 4\n" * 50)
    line = _log.one_line(error)
    assert "\n" not in line and line.startswith("RuntimeError: export failed / ## Report / detail detail")
    assert len(line) <= 320 and line.endswith("...") and "line 4" not in line
    assert _log.one_line(RuntimeError("a\nb\nc\nd")) == "RuntimeError: a / b / c"
    assert _log.one_line(ValueError()) == "ValueError: (no message)"
