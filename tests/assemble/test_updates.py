"""Weights that change, taken in the background (option weight_update="background", the default;
rtx_backend/assemble/updates.py): PyTorch serves the changed region at once, the engine (ONNX
Runtime here) takes the new weights on the update thread, an update overtaken by a later change is
dropped, and a failed one leaves the region in PyTorch."""

from __future__ import annotations

import logging

import pytest
import torch

import rtx_backend
from rtx_backend import OptionsError
from rtx_backend._options import Options
from rtx_backend._record import recording
from rtx_backend.assemble import weights as _weights
from tests.assemble.test_weights import diff, mlp, the_four_rows
from tests.helpers import hold

CPU = {"min_block_size": 1, "target_compute_capabilities": [(8, 6)]}


@pytest.fixture
def held(monkeypatch):
    """The update thread held before each update until `.set()` (updates then run as usual)."""
    yield from hold(monkeypatch, _weights, "_take")


def compiled_mlp(**options):
    """The model, its input, the compiled model (called once) and its one region (live)."""
    model = mlp()
    x = torch.randn(8, 6)
    compiled = torch.compile(model, backend="trtrtx", options={**CPU, **options})
    with recording() as graphs:
        assert diff(compiled, model, x) < 1e-5
    (region,) = [r for g in graphs for r in g.regions]
    assert region.kind == "onnxruntime"
    return model, x, compiled, region


def test_pytorch_serves_a_change_until_the_engine_has_it(held, caplog):
    model, x, compiled, region = compiled_mlp()
    with torch.no_grad():
        model[0].weight.mul_(2.0)
    with caplog.at_level(logging.INFO, logger="rtx_backend"):
        assert diff(compiled, model, x) == 0.0  # PyTorch, with the new weights: eager's own result
        assert region.kind == "pytorch" and "weights changed" in region.why
        assert not rtx_backend.stats().get("weight_refits")
        assert not rtx_backend.wait_for_updates(timeout=0.2)  # still held
        held.set()
        assert rtx_backend.wait_for_updates(60)
    assert region.kind == "onnxruntime"
    assert diff(compiled, model, x) < 1e-5
    assert rtx_backend.stats().get("weight_refits") == 1
    said = [r.getMessage() for r in caplog.records if "weights changed" in r.getMessage()]
    assert len(said) == 1 and "in the background" in said[0]


def test_an_update_overtaken_by_a_later_change_is_dropped(held):
    model, x, compiled, region = compiled_mlp()
    with torch.no_grad():
        model[0].weight.mul_(2.0)
        assert diff(compiled, model, x) == 0.0
        model[2].bias.add_(1.0)
        assert diff(compiled, model, x) == 0.0
    held.set()
    assert rtx_backend.wait_for_updates(60)
    stats = rtx_backend.stats()
    assert stats.get("weight_refits") == 1 and stats.get("weight_updates_overtaken") == 1, stats
    assert region.kind == "onnxruntime"
    assert diff(compiled, model, x) < 1e-5  # the newest weights, not the first change's


def test_an_engine_put_in_place_is_checked_before_its_first_run(caplog):
    """An update installed between calls: weights changed again before the next call are seen
    before the engine runs (its first run is validated against the live weights)."""
    model, x, compiled, region = compiled_mlp()
    for _ in range(3):  # past the first call: the guard checks after enqueueing from now on
        diff(compiled, model, x)
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        for scale in (2.0, 0.5, 3.0):
            with torch.no_grad():
                model[0].weight.mul_(scale)
            assert diff(compiled, model, x) < 1e-5
            assert rtx_backend.wait_for_updates(60)
            with torch.no_grad():
                model[2].weight.mul_(scale)
            assert diff(compiled, model, x) < 1e-5
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [r.getMessage() for r in caplog.records]
    assert rtx_backend.wait_for_updates(60)
    assert region.kind == "onnxruntime"
    assert not rtx_backend.stats().get("validation_failures")


def test_the_update_starts_after_the_call_that_saw_the_change(monkeypatch):
    """Not beside it: a build on the update thread would take the GIL from that call."""
    from rtx_backend.assemble.updates import UPDATES
    from rtx_backend.run.executors import TorchExecutor

    model, x, compiled, region = compiled_mlp()
    order: list[str] = []
    run, submit = TorchExecutor.run, UPDATES.submit
    monkeypatch.setattr(TorchExecutor, "run", lambda self, *a, **k: order.append("pytorch") or run(self, *a, **k))
    monkeypatch.setattr(UPDATES, "submit", lambda job: order.append("submitted") or submit(job))
    with torch.no_grad():
        model[0].weight.mul_(2.0)
    assert diff(compiled, model, x) == 0.0
    assert order == ["pytorch", "submitted"]
    assert rtx_backend.wait_for_updates(60) and region.kind == "onnxruntime"


@pytest.mark.parametrize("dynamic", [False, True])
def test_the_four_changes_in_the_background(dynamic):
    model = mlp()
    x = torch.randn(8, 6)
    compiled = torch.compile(model, backend="trtrtx", options=CPU, dynamic=dynamic)
    seen = the_four_rows(model, compiled, x, torch.randn(5, 6) if dynamic else None)
    assert max(seen) < 1e-5, seen
    assert rtx_backend.wait_for_updates(60)
    assert diff(compiled, model, x) < 1e-5
    stats = rtx_backend.stats()
    assert stats.get("weight_refits", 0) + stats.get("weight_updates_overtaken", 0) == 3, stats


def test_a_failed_update_leaves_the_region_in_pytorch(monkeypatch, caplog):
    model, x, compiled, region = compiled_mlp()

    def fails(*args, **kwargs):
        raise RuntimeError("no engine today")

    monkeypatch.setattr(_weights, "_take", fails)
    with caplog.at_level(logging.WARNING, logger="rtx_backend"), torch.no_grad():
        model[0].weight.mul_(2.0)
        assert diff(compiled, model, x) == 0.0
        assert rtx_backend.wait_for_updates(60)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "no engine today" in warned[0] and "runs in PyTorch" in warned[0]
    assert region.kind == "pytorch" and "no engine today" in region.why
    with torch.no_grad():
        model[2].bias.add_(1.0)
        assert diff(compiled, model, x) == 0.0  # and goes on serving the live weights
    assert rtx_backend.stats().get("weight_fallbacks") == 1


@pytest.mark.parametrize("options", [{"weight_update": "wait"}, {"strict": True}])
def test_wait_and_strict_take_the_weights_in_the_call(options, held):
    held.set()  # (held: a background update would wait; these never submit one)
    model, x, compiled, region = compiled_mlp(**options)
    with torch.no_grad():
        model[0].weight.mul_(2.0)
    assert diff(compiled, model, x) < 1e-5
    assert rtx_backend.stats().get("weight_refits") == 1  # before any wait
    assert region.kind == "onnxruntime"


def test_the_option_is_validated():
    assert Options().weight_update == "background"
    assert Options.from_dict({"weight_update": "Wait"}).weight_update == "wait"
    with pytest.raises(OptionsError, match="background"):
        Options.from_dict({"weight_update": "later"})


def test_waiting_with_nothing_pending_returns_at_once():
    assert rtx_backend.wait_for_updates(timeout=0)


@pytest.mark.gpu
@pytest.mark.parametrize("native", [False, True])
def test_gpu_pytorch_serves_while_the_engine_is_brought_up_to_date(native, held):
    from tests.assemble.test_weights import gpu_options

    model = mlp().cuda()
    x = torch.randn(8, 6, device="cuda")
    compiled = torch.compile(model, backend="trtrtx", options=gpu_options(native, "checked", "background"))
    with recording() as graphs:
        for _ in range(3):  # past the first call's validation and TensorRT-RTX's own capture
            assert diff(compiled, model, x) < 1e-3
    (region,) = [r for g in graphs for r in g.regions]
    assert region.kind == "tensorrt_rtx"
    with torch.no_grad():
        model[0].weight.mul_(2.0)
    assert diff(compiled, model, x) < 1e-6  # PyTorch, with the new weights
    assert region.kind == "pytorch"
    held.set()
    assert rtx_backend.wait_for_updates(120)
    assert region.kind == "tensorrt_rtx"
    for _ in range(3):
        assert diff(compiled, model, x) < 1e-3  # the engine, with the new weights
    stats = rtx_backend.stats()
    assert stats.get("weight_rebuilds") == 1 and not stats.get("validation_failures"), stats


def tiny_unet():
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model = diffusers.UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=1, cross_attention_dim=32, attention_head_dim=8, sample_size=16,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        norm_num_groups=16).eval()
    inputs = (torch.randn(1, 4, 16, 16), torch.tensor([10]), torch.randn(1, 8, 32))
    return model, inputs


@pytest.mark.parametrize("how", ["whole", "repeated_blocks"])
@pytest.mark.parametrize("assign", [False, True])
def test_a_fine_tune_loaded_into_a_compiled_unet(how, assign):
    """A fine-tune's state dict loaded into a compiled diffusers UNet (copied in place, or assigned):
    the next call answers with it, and the engines catch up in the background."""
    model, inputs = tiny_unet()
    options = {"target_compute_capabilities": [(8, 6)]}
    if how == "whole":
        compiled = torch.compile(model, backend="trtrtx", options=options)
    else:
        model.compile_repeated_blocks(backend="trtrtx", options=options)
        compiled = model
    with recording() as graphs, torch.inference_mode():
        for _ in range(3):  # (blocks compiled one by one: their graphs take the weights as inputs by then)
            torch.testing.assert_close(compiled(*inputs).sample, model(*inputs).sample, rtol=1e-4, atol=1e-4)
        assert rtx_backend.wait_for_updates(60)
    with torch.no_grad():
        tuned = {k: v * 1.1 + 0.01 if v.is_floating_point() else v for k, v in model.state_dict().items()}
        model.load_state_dict(tuned, assign=assign)
    with torch.inference_mode():
        expected = model(*inputs).sample
        torch.testing.assert_close(compiled(*inputs).sample, expected, rtol=1e-4, atol=1e-4)
        assert rtx_backend.wait_for_updates(60)
        torch.testing.assert_close(compiled(*inputs).sample, expected, rtol=1e-4, atol=1e-4)
    stats = rtx_backend.stats()
    assert stats.get("weight_refits", 0) >= 1 and not stats.get("weight_fallbacks"), stats
    kinds = {r.kind for g in graphs for r in g.regions}
    assert kinds == {"onnxruntime"}, kinds
