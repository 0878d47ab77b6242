"""One compiled graph, several sets of weights (rtx_backend/assemble/shared.py): blocks compiled one by
one (torch.compile of each block of a ModuleList, diffusers' compile_repeated_blocks) share one Dynamo
graph, called with each block's parameters; its regions take the weights as inputs once the calls show
it, and from then on nothing is rebuilt, refitted or run in PyTorch."""

from __future__ import annotations

import logging

import pytest
import torch

import rtx_backend
from rtx_backend._record import recording
from rtx_backend.export.initializers import initializer_specs
from rtx_backend.tools.recording import Recording

CPU = {"min_block_size": 1, "target_compute_capabilities": [(8, 6)]}
# what a steady state must not do again
UPDATES = ("engine_builds", "weight_refits", "weight_rebuilds", "weight_updates_overtaken", "weight_fallbacks",
           "background_builds", "backend_calls", "shared_weight_graphs")


class Block(torch.nn.Module):
    def __init__(self, width: int = 16, scale: torch.nn.Parameter | None = None) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)
        self.scale = scale  # (one parameter every block shares, when given)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return y * self.scale if self.scale is not None else y


def blocks(n: int = 4, shared: bool = False, seed: int = 0) -> torch.nn.ModuleList:
    torch.manual_seed(seed)
    scale = torch.nn.Parameter(torch.full((16,), 1.5)) if shared else None
    return torch.nn.ModuleList(Block(scale=scale) for _ in range(n)).eval()


def forward(model: torch.nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    for block in model:
        x = block(x)
    return x


def eager(model: torch.nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    for block in model:
        x = block.forward(x)  # (not the compiled call)
    return x


def counts() -> dict[str, int]:
    stats = rtx_backend.stats()
    return {k: stats.get(k, 0) for k in UPDATES}


def steady(run, reference, warmup: int = 3, calls: int = 3) -> tuple[dict[str, int], Recording]:
    """Warm up (every result eager's), wait for the engines, then call again: nothing may change.
    Returns the counts of the steady state and what `rtx_backend.recording()` recorded."""
    with recording() as graphs:
        for _ in range(warmup):
            torch.testing.assert_close(run(), reference, rtol=1e-4, atol=1e-4)
        assert rtx_backend.wait_for_updates(120)
        torch.testing.assert_close(run(), reference, rtol=1e-4, atol=1e-4)
    before = counts()
    for _ in range(calls):
        torch.testing.assert_close(run(), reference, rtol=1e-4, atol=1e-4)
    assert rtx_backend.wait_for_updates(60)
    assert counts() == before, (before, counts())
    return before, Recording(graphs)


@pytest.mark.parametrize("update", ["background", "wait"])
def test_blocks_compiled_one_by_one_take_their_weights_as_inputs(update, caplog):
    model = blocks()
    for block in model:
        block.compile(backend="trtrtx", options={**CPU, "weight_update": update})
    with torch.inference_mode():
        x = torch.randn(4, 16)
        reference = eager(model, x)
        with caplog.at_level(logging.INFO, logger="rtx_backend"):
            before, rec = steady(lambda: forward(model, x), reference)
    assert before["backend_calls"] == 1 and before["shared_weight_graphs"] == 1, before
    assert before["engine_builds"] == 2, before  # the first block's frozen engine, and the shared one: not one a block
    assert not (before["weight_fallbacks"] or before["weight_refits"] or before["weight_rebuilds"]), before  # none a block
    assert rec.runtimes == {"ONNX Runtime"}, str(rec)  # the record lists the regions that run the graph now
    said = [r.getMessage() for r in caplog.records if "take them as inputs" in r.getMessage()]
    assert len(said) == 1 and "several blocks" in said[0]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "ONNX Runtime instead" not in
                r.getMessage()]


def test_a_shared_engine_holds_no_block_weights_and_is_found_for_other_values():
    """Its model takes the blocks' weights as inputs (no initializer of theirs); its engine-cache key
    is the graph's, not one block's values: another model of the same blocks loads it."""
    model = blocks(3)
    for block in model:
        block.compile(backend="trtrtx", options=CPU)
    with torch.inference_mode():
        x = torch.randn(4, 16)
        reference = eager(model, x)
        _, rec = steady(lambda: forward(model, x), reference)
    (region,) = [r for g in rec._graphs for r in g.regions]
    assert region.kind == "onnxruntime"
    assert not [n for n in initializer_specs(region.onnx) if "_frozen_" in n]  # no block's weights in it
    assert len(region.onnx.inputs) == 1 + 6  # x, and the weights of the norm and the two linears
    torch._dynamo.reset()
    rtx_backend.reset_stats()
    other = blocks(3, seed=1)
    for block in other:
        block.compile(backend="trtrtx", options=CPU)
    with torch.inference_mode():
        reference = eager(other, x)
        before, _ = steady(lambda: forward(other, x), reference)
    stats = rtx_backend.stats()
    assert before["engine_builds"] == 1 and stats.get("engine_cache_hits", 0) >= 1, stats  # the frozen one is new


def test_a_weight_every_block_shares_stays_frozen_and_checked():
    model = blocks(3, shared=True)
    for block in model:
        block.compile(backend="trtrtx", options={**CPU, "weight_update": "wait"})
    with torch.inference_mode():
        x = torch.randn(4, 16)
        before, _ = steady(lambda: forward(model, x), eager(model, x))
    with torch.no_grad():
        model[0].scale.mul_(0.5)  # in place: every block sees it
    with torch.inference_mode():
        torch.testing.assert_close(forward(model, x), eager(model, x), rtol=1e-4, atol=1e-4)
    after = counts()
    assert after["weight_refits"] == before["weight_refits"] + 1 and after["shared_weight_graphs"] == 1, after


@pytest.mark.parametrize("kept", [False, True])
def test_a_replaced_parameter_is_no_block_swap(kept):
    """`m.weight = nn.Parameter(...)`: the engines catch up and keep frozen weights. The update starts
    in the call that sees it; where the old parameter lives on (`kept`), it could be another block's,
    so it starts with the next call (or a wait for updates), which brings the new one again."""
    from rtx_backend.assemble.updates import UPDATES

    model = blocks(1)
    compiled = torch.compile(model[0], backend="trtrtx", options=CPU)
    x = torch.randn(4, 16)
    old = []
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model[0](x))
        for name in ("up", "down"):
            linear = getattr(model[0], name)
            old.append(linear.weight if kept else None)
            linear.weight = torch.nn.Parameter(torch.randn_like(linear.weight))
            torch.testing.assert_close(compiled(x), model[0](x))  # PyTorch, with the new weight
            assert bool(list(UPDATES.held)) == kept
            if name == "up":
                assert rtx_backend.wait_for_updates(60)
            else:
                for _ in range(3):
                    torch.testing.assert_close(compiled(x), model[0](x), rtol=1e-5, atol=1e-5)
            assert not list(UPDATES.held)
        assert rtx_backend.wait_for_updates(60)
        torch.testing.assert_close(compiled(x), model[0](x), rtol=1e-5, atol=1e-5)
    stats = rtx_backend.stats()
    assert stats.get("weight_refits") == 2 and not stats.get("shared_weight_graphs"), stats


def test_a_tiny_flux_transformer_compiled_by_repeated_blocks():
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=(4, 6, 6)).eval()
    with torch.inference_mode():
        inputs = {"hidden_states": torch.randn(1, 16, 16), "encoder_hidden_states": torch.randn(1, 8, 32),
                  "pooled_projections": torch.randn(1, 32), "timestep": torch.tensor([0.5]),
                  "img_ids": torch.randn(16, 3), "txt_ids": torch.zeros(8, 3), "return_dict": False}
        reference = model(**inputs)[0]
        model.compile_repeated_blocks(backend="trtrtx", options={"target_compute_capabilities": [(8, 6)]})
        before, rec = steady(lambda: model(**inputs)[0], reference)
    graphs = before["backend_calls"]
    assert before["shared_weight_graphs"] == graphs and before["engine_builds"] == 2 * graphs, before
    assert not (before["weight_fallbacks"] or before["weight_refits"] or before["weight_rebuilds"]), before
    assert rec.runtimes == {"ONNX Runtime"}, str(rec)


@pytest.mark.gpu
def test_gpu_blocks_compiled_one_by_one_run_one_engine_with_their_weights_as_inputs():
    """On TensorRT-RTX: the engine that takes the blocks' weights as inputs builds (the parser takes
    them as network inputs) and serves every block, FP16, with nothing rebuilt in the steady state."""
    model = blocks().to("cuda", torch.float16)
    for block in model:
        block.compile(backend="trtrtx", options={"min_block_size": 1, "runtime": "tensorrt_rtx"})
    with torch.inference_mode():
        x = torch.randn(4, 16, device="cuda", dtype=torch.float16)
        reference = eager(model, x)
        with recording() as graphs:
            for _ in range(3):
                forward(model, x)
            assert rtx_backend.wait_for_updates(120)
            torch.testing.assert_close(forward(model, x), reference, rtol=2e-2, atol=2e-2)
        before = counts()
        for _ in range(3):
            torch.testing.assert_close(forward(model, x), reference, rtol=2e-2, atol=2e-2)
        assert rtx_backend.wait_for_updates(60)
    assert counts() == before, (before, counts())
    assert before["shared_weight_graphs"] == 1, before
    assert Recording(graphs).runtimes == {"TensorRT-RTX"}, str(Recording(graphs))
