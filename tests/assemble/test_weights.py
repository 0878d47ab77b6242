"""Weights that change after compile (rtx_backend/assemble/weights.py): every change is seen before it can be served,
and the regions take the new weights (ONNX Runtime here; TensorRT-RTX's refitter on a GPU)."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch

import rtx_backend
from rtx_backend import OptionsError
from rtx_backend._options import Options
from rtx_backend._record import recording
from rtx_backend.assemble import region as _region
from rtx_backend.assemble.weights import WeightGuard, initializer_specs
from tests.helpers import compile_and_run, regions

# the call that sees a change waits for the update (tests/assemble/test_updates.py: in the background)
CPU = {"min_block_size": 1, "target_compute_capabilities": [(8, 6)], "weight_update": "wait"}


def mlp() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()


class ConvBn(torch.nn.Module):
    """Convolution, BatchNorm (folded by the exporter unless kept), a linear head and a weight used twice."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x))).mean((2, 3))
        return self.head(y) + self.head.weight.sum()


def diff(compiled, model, *inputs) -> float:
    """The largest difference from eager, relative to the output's magnitude (from 1 up)."""
    with torch.no_grad():
        expected = model(*inputs)
        return float((compiled(*inputs) - expected).abs().max() / expected.abs().max().clamp_min(1.0))


def sgd_step(model: torch.nn.Module, x: torch.Tensor) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(x).square().sum()
    loss.backward()
    opt.step()
    opt.zero_grad()


def the_four_rows(model, compiled, x, x2=None) -> list[float]:
    """The issue's table: after compile, an in-place change, a replaced parameter, an SGD step."""
    seen = [diff(compiled, model, x)]
    with torch.no_grad():
        model[0].weight.mul_(2.0)
    seen.append(diff(compiled, model, x))
    model[2].weight = torch.nn.Parameter(torch.randn_like(model[2].weight) * 3)
    seen.append(diff(compiled, model, x))
    sgd_step(model, x)
    seen.append(diff(compiled, model, x))
    if x2 is not None:
        seen.append(diff(compiled, model, x2))
    return seen


@pytest.mark.parametrize("dynamic", [False, True])
def test_the_four_changes_are_served_with_the_new_weights(dynamic, caplog):
    model = mlp()
    x = torch.randn(8, 6)
    compiled = torch.compile(model, backend="trtrtx", options=CPU, dynamic=dynamic)
    with caplog.at_level(logging.INFO, logger="rtx_backend"):
        seen = the_four_rows(model, compiled, x, torch.randn(5, 6) if dynamic else None)
    assert max(seen) < 1e-5, seen
    refits = [r for r in caplog.records if "weights changed" in r.getMessage()]
    assert len(refits) == 3  # one INFO line per change (one region)
    assert all(r.levelno == logging.INFO for r in refits)
    assert rtx_backend.stats().get("weight_refits") == 3


def test_a_fused_optimizer_step_is_seen():
    """Fused optimizers write the parameters without moving their version counters; the
    backend counts their steps (a global post-step hook, fused groups only)."""
    model = mlp()
    x = torch.randn(8, 6)
    compiled = torch.compile(model, backend="trtrtx", options=CPU)
    assert diff(compiled, model, x) < 1e-5
    opt = torch.optim.Adam(model.parameters(), lr=0.1, fused=True)
    model(x).square().sum().backward()
    opt.step()
    assert diff(compiled, model, x) < 1e-5
    assert rtx_backend.stats().get("weight_refits") == 1


def test_frozen_weights_answer_with_the_weights_of_compile_time():
    """weights="frozen" is the behaviour without the check: documented as such, and the check's
    absence is visible (this is what "checked" prevents)."""
    model = mlp()
    x = torch.randn(8, 6)
    compiled = torch.compile(model, backend="trtrtx", options={**CPU, "weights": "frozen"})
    assert diff(compiled, model, x) < 1e-5
    with torch.no_grad():
        model[0].weight.mul_(2.0)
    assert diff(compiled, model, x) > 1e-2
    assert not rtx_backend.stats().get("weight_refits")


def test_conv_batchnorm_weights_stay_initializers_and_refit():
    """BatchNorm statistics, load_state_dict and a weight used twice (a folded sum of it)."""
    model = ConvBn().eval()
    x = torch.randn(2, 3, 8, 8)
    out = compile_and_run(model, x, **CPU)
    assert (out - model(x)).abs().max() < 1e-5
    region = regions()[0]
    assert region.kind == "onnxruntime"
    specs = initializer_specs(region.onnx)
    frozen = [n for n in specs if "_frozen_" in n]
    assert len(frozen) == 8  # conv (2), bn (4), head (2), by name: the BatchNorm was not folded into the conv
    for name, tensor in region.graph_module.named_buffers():
        assert specs["gm." + name][0] == tuple(tensor.shape)
    compiled = torch.compile(model, backend="trtrtx", options=CPU)
    with torch.no_grad():
        compiled(x)
        model.bn.running_var.mul_(3.0)
        model.bn.running_mean.add_(0.5)
        assert diff(compiled, model, x) < 1e-5
        state = {k: v * 1.5 if v.is_floating_point() else v for k, v in model.state_dict().items()}
        model.load_state_dict(state)
        assert diff(compiled, model, x) < 1e-5


def test_weights_that_do_not_change_cost_no_refit(caplog):
    model = mlp()
    x = torch.randn(8, 6)
    compiled = torch.compile(model, backend="trtrtx", options=CPU)
    with caplog.at_level(logging.INFO, logger="rtx_backend"):
        for _ in range(5):
            diff(compiled, model, x)
    assert not rtx_backend.stats().get("weight_refits")
    assert not [r for r in caplog.records if "weights changed" in r.getMessage()]


def test_a_graph_cache_hit_checks_its_weights_too():
    model = mlp()
    x = torch.randn(8, 6)
    assert diff(torch.compile(model, backend="trtrtx", options=CPU), model, x) < 1e-5
    rtx_backend.cache.store.flush()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="trtrtx", options=CPU)
    assert diff(compiled, model, x) < 1e-5
    assert rtx_backend.stats().get("graph_cache_hits") == 1
    with torch.no_grad():
        model[2].bias.add_(1.0)
    assert diff(compiled, model, x) < 1e-5
    assert rtx_backend.stats().get("weight_refits") == 1


def test_a_region_whose_model_lacks_a_weight_is_exported_and_built_again(monkeypatch, caplog):
    from rtx_backend.assemble import weights as _weights

    model = mlp()
    x = torch.randn(8, 6)
    compiled = torch.compile(model, backend="trtrtx", options=CPU)
    diff(compiled, model, x)
    monkeypatch.setattr(_weights, "initializer_specs", lambda region: {})  # as if the exporter had folded them
    with torch.no_grad():
        model[0].weight.mul_(-1.0)
    with caplog.at_level(logging.INFO, logger="rtx_backend"):
        assert diff(compiled, model, x) < 1e-5
    assert rtx_backend.stats().get("weight_rebuilds") == 1
    assert any("exported and built again" in r.getMessage() for r in caplog.records)


def test_a_region_that_cannot_take_new_weights_runs_in_pytorch(monkeypatch, caplog):
    from rtx_backend.assemble import weights as _weights

    model = mlp()
    x = torch.randn(8, 6)
    compiled = torch.compile(model, backend="trtrtx", options=CPU)
    diff(compiled, model, x)

    def broken(region):
        raise RuntimeError("no session today")

    monkeypatch.setattr(_weights, "OrtExecutor", broken)
    with torch.no_grad():
        model[2].bias.add_(1.0)
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        assert diff(compiled, model, x) < 1e-6
    assert any("runs in PyTorch from now on" in r.getMessage() for r in caplog.records)
    with torch.no_grad():
        model[2].bias.add_(1.0)  # PyTorch reads the live weights: still right, nothing to refit
    assert diff(compiled, model, x) < 1e-6
    assert rtx_backend.stats().get("weight_fallbacks") == 1


def test_a_weight_replaced_by_an_inference_tensor(caplog):
    """Inference tensors count no versions: a replacement by one is seen, and calls go on."""
    model = mlp().requires_grad_(False)
    x = torch.randn(8, 6)
    fn, inputs = captured_guard(model, x, CPU)
    index = next(i for i, t in enumerate(inputs) if t is model[2].weight)
    with torch.inference_mode():
        new = torch.randn_like(model[2].weight)
    args = list(inputs)
    args[index] = new
    with caplog.at_level(logging.WARNING, logger="rtx_backend"), torch.inference_mode():
        model[2].weight = torch.nn.Parameter(new, requires_grad=False)
        for _ in range(2):
            assert torch.allclose(fn(*args)[0], model(x), atol=1e-5)
    assert any("inference tensors" in r.getMessage() for r in caplog.records)
    assert rtx_backend.stats().get("weight_refits") == 1


def test_an_engine_stored_under_new_weights_is_found_by_a_fine_tuned_copy():
    """The key a refitted engine is stored under (_store) is the key a compile of the fine-tuned
    model computes: that compile loads the engine instead of building one."""
    from rtx_backend.assemble import weights as _weights
    from rtx_backend.cache import store

    model = mlp()
    x = torch.randn(8, 6)
    compile_and_run(model, x, **CPU)
    (region,) = regions()
    old_key = region.engine_key
    assert old_key is not None and region.engine is not None
    with torch.no_grad():
        model[0].weight.mul_(2.0)  # (the compiled model is not called: no refit runs)
    values = {"gm." + name: t for name, t in region.graph_module.named_buffers()}
    key = _weights._store(region, _weights.with_weights(region.onnx, values), region.engine, Options.from_dict(CPU))
    assert key is not None and key.name != old_key.name
    store.flush()
    torch._dynamo.reset()
    rtx_backend.reset_stats()
    tuned = mlp()
    tuned.load_state_dict(model.state_dict())
    out = compile_and_run(tuned, x, **CPU)
    stats = rtx_backend.stats()
    assert stats.get("engine_cache_hits") == 1 and not stats.get("engine_builds"), stats
    assert regions()[0].engine_key.name == key.name
    assert (out - tuned(x)).abs().max() < 1e-5  # the stored model has the new weights


def captured_guard(model, x, options):
    """The backend's result for Dynamo's graph of `model`, called directly (Dynamo's own guards
    would recompile for a weight of another shape before the backend saw it)."""
    seen: dict[str, object] = {}

    def backend(gm, example_inputs, **kw):
        fn = rtx_backend.trtrtx(gm, example_inputs, options=options)
        seen.update(fn=fn, inputs=list(example_inputs))
        return fn

    with torch.no_grad():
        torch.compile(model, backend=backend)(x)
    return seen["fn"], seen["inputs"]


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(6, 6)
        self.register_buffer("scale", torch.full((6,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) * self.scale


@pytest.mark.parametrize("replacement", ["shape", "dtype"])
def test_a_weight_of_another_shape_or_dtype_runs_in_pytorch_with_a_warning(replacement, caplog):
    model = Scaled().eval()
    x = torch.randn(8, 6)
    fn, inputs = captured_guard(model, x, CPU)
    assert isinstance(fn, WeightGuard)
    index = next(i for i, t in enumerate(inputs) if t is model.scale)
    args = list(inputs)
    other = torch.randn(6, dtype=torch.float64) if replacement == "dtype" else torch.randn(1)  # (broadcasts)
    args[index] = other
    expected = fn.eager(*args)  # Dynamo's graph, in PyTorch, with the replaced weight
    with caplog.at_level(logging.WARNING, logger="rtx_backend"), torch.no_grad():
        out = fn(*args)
    assert torch.equal(out[0], expected[0])
    assert any("another shape, dtype or device" in r.getMessage() for r in caplog.records)
    assert rtx_backend.stats().get("weight_fallbacks") == 1


@pytest.mark.parametrize("update", ["wait", "background"])
def test_weights_changing_while_other_threads_call(update, caplog):
    """Not our race to win, but no crash, and once the changes stop the answers are right (in the
    background: once the updates are done, the engine's again)."""
    model = mlp()
    x = torch.randn(8, 6)
    compiled = torch.compile(model, backend="trtrtx", options={**CPU, "weight_update": update})
    diff(compiled, model, x)
    errors: list[BaseException] = []
    stop = threading.Event()

    def call() -> None:
        while not stop.is_set():
            try:
                with torch.no_grad():
                    compiled(x)
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        for _ in range(10):
            with torch.no_grad():
                model[0].weight.add_(0.01)
            time.sleep(0.01)
        stop.set()
        for t in threads:
            t.join()
        assert rtx_backend.wait_for_updates(60)
    assert not errors
    assert diff(compiled, model, x) < 1e-5
    assert diff(compiled, model, x) < 1e-5  # (the engine's first run after the last update: validated)
    # a first-call check that raced a change is tried again, not taken for a wrong engine
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not rtx_backend.stats().get("validation_failures")


def test_a_first_call_check_that_races_a_weight_change_checks_again(monkeypatch, caplog):
    """Another thread changes a weight while the new session runs: PyTorch's result (the new
    weights) is returned, the session is checked again on its next call, and kept."""
    from rtx_backend.run.executors import OrtExecutor

    model = mlp()
    x = torch.randn(8, 6)
    compiled = torch.compile(model, backend="trtrtx", options=CPU)
    with recording() as graphs:
        assert diff(compiled, model, x) < 1e-5
    (region,) = [r for g in graphs for r in g.regions]
    run, raced, before = OrtExecutor.run, [], region.executor

    def racing(self, *args, **kwargs):
        out = run(self, *args, **kwargs)
        if self is not before and not raced:  # the new session's first run: a change lands meanwhile
            raced.append(True)
            with torch.no_grad():
                model[2].bias.add_(1.0)
        return out

    with torch.no_grad():
        model[0].weight.mul_(2.0)
    monkeypatch.setattr(OrtExecutor, "run", racing)
    with caplog.at_level(logging.INFO, logger="rtx_backend"), torch.no_grad():
        out = compiled(x)
        assert raced and torch.allclose(out, model(x), atol=1e-5)  # PyTorch's, with the change made during it
        assert region.kind == "onnxruntime"
        assert diff(compiled, model, x) < 1e-5  # the next call sees that change and updates again
    assert any("changed during its first call" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert region.kind == "onnxruntime" and not rtx_backend.stats().get("validation_failures")


def test_the_option_is_validated():
    assert Options.from_dict({"weights": "Frozen"}).weights == "frozen"
    assert Options().weights == "checked"
    assert Options.from_dict({"weights": "refit"}).weights == "refit"
    with pytest.raises(OptionsError, match="checked"):
        Options.from_dict({"weights": "refitted"})
    keys = [str(Options(weights=w).cache_key_fields()) for w in ("checked", "refit", "frozen")]
    assert len(set(keys)) == 3  # (the engines of the three differ: refittable, or the weights folded)


# ---- on a GPU: TensorRT-RTX's refitter -------------------------------------------------------------


def refittable_here() -> bool:
    """Whether TensorRT-RTX builds refittable engines on this GPU (1.6 on an SM 9.0 GPU, which it
    does not list, fails every refittable build in Myelin): where it does not, a weight change
    builds the engine again, and that is what these tests then check."""
    from rtx_backend.assemble.region import REFITS

    return None not in REFITS.refused


def updated(stats: dict, count: int, weights: str = "refit") -> None:
    """`count` weight updates happened: with weights="refit", refits where this GPU builds
    refittable engines; else rebuilds."""
    if weights == "refit" and refittable_here():
        assert stats.get("weight_refits") == count and not stats.get("weight_rebuilds"), stats
    else:
        assert stats.get("weight_rebuilds") == count and not stats.get("weight_refits"), stats


def needs_refittable_engines() -> None:
    if not refittable_here():
        pytest.skip("TensorRT-RTX builds no refittable engine on this GPU (see the INFO line of the build); "
                    "weight changes rebuild, which the other GPU tests check")


def gpu_options(native: bool, weights: str = "refit", update: str = "wait") -> dict:
    return {"min_block_size": 1, "runtime": "tensorrt_rtx", "weights": weights, "weight_update": update,
            "cuda_graph_strategy": "whole_graph_capture" if native else "disabled"}


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["checked", "refit"])
@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("dynamic", [False, True])
def test_gpu_the_four_changes_update_the_engine(weights, native, dynamic, caplog):
    model = mlp().cuda()
    x = torch.randn(8, 6, device="cuda")
    compiled = torch.compile(model, backend="trtrtx", options=gpu_options(native, weights), dynamic=dynamic)
    with torch.no_grad():
        for _ in range(3):  # past the first call's validation and TensorRT-RTX's own capture
            compiled(x)
    with caplog.at_level(logging.INFO, logger="rtx_backend"):
        seen = the_four_rows(model, compiled, x, torch.randn(5, 6, device="cuda") if dynamic else None)
    assert max(seen) < 1e-3, seen  # TensorRT-RTX's FP32 GEMMs: TF32-level differences at most
    updated(rtx_backend.stats(), 3, weights)
    said = "engine refitted" if weights == "refit" and refittable_here() else "engine built again"
    assert sum(said in r.getMessage() for r in caplog.records) == 3


@pytest.mark.gpu
def test_gpu_conv_batchnorm_refit():
    model = ConvBn().eval().cuda()
    x = torch.randn(2, 3, 16, 16, device="cuda")
    compiled = torch.compile(model, backend="trtrtx", options=gpu_options(False))
    with torch.no_grad():
        compiled(x)
        model.bn.running_var.mul_(3.0)
        model.conv.weight.mul_(-1.0)
        assert diff(compiled, model, x) < 1e-3
    updated(rtx_backend.stats(), 1)


@pytest.mark.gpu
def test_gpu_a_refitted_engine_is_cached_under_its_new_weights():
    """A fine-tuned copy of the model compiled afresh finds the refitted engine: no build."""
    model = mlp().cuda()
    x = torch.randn(8, 6, device="cuda")
    compiled = torch.compile(model, backend="trtrtx", options=gpu_options(False))
    with torch.no_grad():
        compiled(x)
        model[0].weight.mul_(2.0)
        compiled(x)
    needs_refittable_engines()
    rtx_backend.cache.store.flush()
    torch._dynamo.reset()
    rtx_backend.reset_stats()
    tuned = mlp().cuda()
    tuned.load_state_dict(model.state_dict())
    compiled = torch.compile(tuned, backend="trtrtx", options=gpu_options(False))
    assert diff(compiled, tuned, x) < 1e-3
    stats = rtx_backend.stats()
    assert not stats.get("engine_builds"), stats
    assert stats.get("engine_cache_hits") == 1, stats


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["checked", "refit"])
def test_gpu_an_engine_that_is_not_refittable_is_rebuilt(weights, monkeypatch, caplog):
    """weights="checked" (the default) builds no refittable engine: a change builds it again; so
    does weights="refit" where the build of a refittable engine is turned off."""
    monkeypatch.setattr(_region, "REFITS", _region.Refits(builds=weights == "checked"))
    built: list[bool] = []
    build = _region.build

    def watched(*args, refittable=False, **kwargs):
        built.append(refittable)
        return build(*args, refittable=refittable, **kwargs)

    monkeypatch.setattr(_region, "build", watched)
    model = mlp().cuda()
    x = torch.randn(8, 6, device="cuda")
    compiled = torch.compile(model, backend="trtrtx", options=gpu_options(False, weights))
    with torch.no_grad():
        compiled(x)
        model[0].weight.mul_(2.0)
    with caplog.at_level(logging.INFO, logger="rtx_backend"):
        assert diff(compiled, model, x) < 1e-3
    assert rtx_backend.stats().get("weight_rebuilds") == 1
    assert any("not refittable" in r.getMessage() for r in caplog.records)
    assert built == [False, False]


def warm_up(compiled, x, calls: int = 3) -> None:
    """Calls on a side stream, as torch.cuda.graph asks before a capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(calls):
            compiled(x)
    torch.cuda.current_stream().wait_stream(side)


@pytest.mark.gpu
@pytest.mark.parametrize("native", [False, True])
def test_gpu_a_torch_cuda_graph_captured_after_the_refit_replays_the_new_weights(native):
    model = mlp().cuda()
    x = torch.randn(8, 6, device="cuda")
    compiled = torch.compile(model, backend="trtrtx", options=gpu_options(native))
    with recording() as graphs:
        warm_up(compiled, x)
        with torch.no_grad():
            model[0].weight.mul_(2.0)
        warm_up(compiled, x, 1)  # the refit, outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            out = compiled(x)
    graph.replay()
    torch.cuda.synchronize()
    (region,) = graphs[0].regions
    assert region.kind == "tensorrt_rtx"
    assert not region.capture_fallback_said  # the graph recorded the refitted (or rebuilt) engine
    updated(rtx_backend.stats(), 1)
    assert diff(lambda _: out, model, x) < 1e-3


@pytest.mark.gpu
def test_gpu_weights_changed_right_before_a_capture_are_served_by_pytorch_in_it(caplog):
    model = mlp().cuda()
    x = torch.randn(8, 6, device="cuda")
    compiled = torch.compile(model, backend="trtrtx", options=gpu_options(False))
    warm_up(compiled, x)
    with torch.no_grad():
        model[0].weight.mul_(2.0)
    graph = torch.cuda.CUDAGraph()
    with caplog.at_level(logging.WARNING, logger="rtx_backend"), torch.no_grad(), torch.cuda.graph(graph):
        out = compiled(x)
    graph.replay()
    torch.cuda.synchronize()
    assert diff(lambda _: out, model, x) < 1e-3
    assert any("before a CUDA graph capture" in r.getMessage() for r in caplog.records)
    assert diff(compiled, model, x) < 1e-3  # and the next call outside the capture refits
    updated(rtx_backend.stats(), 1)


def test_a_refittable_build_that_fails_is_not_tried_again_for_the_same_targets(monkeypatch, caplog):
    """TensorRT-RTX on a GPU off its list fails every refittable build: the builds after the first
    failure go straight to an engine that is not refittable (a failed build costs seconds)."""
    from rtx_backend._errors import BuildError
    from rtx_backend.build.engine import BuiltEngine

    tried: list[bool] = []

    def fake_build(model, targets, profile, *, monitor=None, refittable=False, threads=None):
        tried.append(refittable)
        if refittable:
            raise BuildError("Myelin: target_sm '90' does not have arch kind assigned")
        return BuiltEngine(memoryview(b"engine"), targets, profile, 0.0)

    monkeypatch.setattr(_region, "build", fake_build)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_region, "REFITS", _region.Refits())
    options = Options.from_dict({"target_compute_capabilities": [(8, 6)], "weights": "refit", "progress": False})
    with caplog.at_level(logging.INFO, logger="rtx_backend"):
        for _ in range(3):
            assert bytes(_region.build_for(b"onnx", options, {})) == b"engine"
    assert tried == [True, False, False, False]
    assert sum("builds no refittable engine" in r.getMessage() for r in caplog.records) == 1
    for weights in ("frozen", "checked"):  # never refittable
        tried.clear()
        _region.build_for(b"onnx", Options.from_dict({"target_compute_capabilities": [(8, 6)], "weights": weights,
                                                      "progress": False}), {})
        assert tried == [False]


# ---- the check while the GPU runs: enqueue first, check after ------------------------------------

def _guard(fn, weights):
    args = [torch.zeros(2), *weights]
    return WeightGuard(fn, [], args, list(range(1, len(args))), lambda *a: ("eager",), Options(), dict), args


def test_a_graph_that_leaves_its_weights_alone_is_checked_after_it_is_enqueued():
    w = torch.nn.Parameter(torch.ones(3))
    calls: list[int] = []

    def graph(*args):
        calls.append(args[1]._version)
        return ("out",)

    guard, args = _guard(graph, [w])
    assert guard.overlap is None
    assert guard(*args) == ("out",) and guard.overlap is True  # the first call showed it moves no version
    assert guard(*args) == ("out",) and calls == [0, 0]
    with torch.no_grad():
        w.mul_(2)  # seen after the enqueue: that run is dropped, the call runs again with the new weights
    assert guard(*args) == ("out",)
    assert calls == [0, 0, 1, 1]
    assert guard.versions == (1,)
    assert guard(*args) == ("out",) and calls == [0, 0, 1, 1, 1]  # once again, no rerun


def test_a_graph_that_moves_its_own_weights_is_checked_before_it_runs():
    buffer = torch.zeros(3)

    def graph(*args):
        with torch.no_grad():
            args[1].add_(1)  # as BatchNorm's running statistics in training mode
        return ("out",)

    guard, args = _guard(graph, [buffer])
    guard(*args)
    assert guard.overlap is False
    guard(*args)
    assert buffer.tolist() == [2.0, 2.0, 2.0]  # one update per call: never run twice


def test_a_run_that_fails_on_a_changed_weight_runs_again_after_the_refresh():
    w = torch.nn.Parameter(torch.ones(3))
    state = {"fail": False}

    def graph(*args):
        if state["fail"]:
            state["fail"] = False
            raise RuntimeError("the old graph cannot take the new weight")
        return ("out",)

    guard, args = _guard(graph, [w])
    guard(*args)
    with torch.no_grad():
        w.add_(1)
    state["fail"] = True
    assert guard(*args) == ("out",)
    state["fail"] = True  # unchanged weights: the graph's own error reaches the caller
    with pytest.raises(RuntimeError, match="cannot take"):
        guard(*args)
