"""Option truncate_double (rtx_backend/plan/doubles.py, export/doubles.py): float64 nodes join
the regions, computed in float32 inside them and cast at their edges; without it rule fp64 keeps
them in PyTorch. Checked against eager PyTorch, and first-call validation against float64."""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch

import rtx_backend

from ..helpers import _LAST, compile_and_run, regions

AMPERE = [(8, 6)]


class Rotary(torch.nn.Module):
    """Rotary tables computed in float64 (as diffusers' Flux computes them) on a projection;
    a float64 buffer, a float64 input and float64 outputs too, so that float64 crosses the region's edges."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(8, 8)
        self.register_buffer("scale", torch.tensor([1.5, 2.0, 0.5, 1.0], dtype=torch.float64))

    def forward(self, x, pos, offset):
        inv = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8))
        freqs = torch.outer(pos.double(), inv) * self.scale
        cos, sin = freqs.cos().float(), freqs.sin().float()
        y = self.proj(x)
        a, b = y[..., ::2], y[..., 1::2]
        out = torch.cat([a * cos - b * sin, a * sin + b * cos], -1)
        return out, freqs + offset, (out.double() * offset.mean()).sum()


def _inputs():
    return torch.randn(5, 8), torch.arange(5).float() * 7, torch.randn(5, 4, dtype=torch.float64)


def _check(outputs, expected):
    for got, want in zip(outputs, expected):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_float64_nodes_join_the_region_computed_in_float32_with_float64_kept_at_its_edges():
    model = Rotary().eval()
    args = _inputs()
    out = compile_and_run(model, *args, truncate_double=True, min_block_size=1, target_compute_capabilities=AMPERE)
    with torch.no_grad():
        _check(out, model(*args))
    (region,) = regions()
    assert region.engine is not None and _LAST[0].plan.eager_ops == []
    assert {s.dtype for s in (*region.onnx.inputs, *region.onnx.outputs)} == {torch.float32}
    # the casts at the edges are PyTorch's, outside the region; its own graph keeps float64 inside
    parent = _LAST[0].plan.graph_module
    casts = [n for n in parent.graph.nodes if n.target is torch.ops.aten._to_copy.default]
    assert sorted(str(n.kwargs["dtype"]) for n in casts) == ["torch.float32", "torch.float64", "torch.float64"]
    inside = {n.meta["val"].dtype for n in region.graph_module.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)}
    assert torch.float64 in inside
    stats = rtx_backend.stats()
    assert stats["validations"] == 1 and "validation_failures" not in stats, stats


def test_without_the_option_rule_fp64_keeps_float64_in_pytorch():
    model = Rotary().eval()
    args = _inputs()
    out = compile_and_run(model, *args, min_block_size=1)
    with torch.no_grad():
        _check(out, model(*args))
    reasons = _LAST[0].plan.reasons
    assert {r.rule for r in reasons.values()} == {"fp64"} and len(reasons) >= 10
    assert all(s.dtype != torch.float64 for r in regions() for s in (*r.onnx.inputs, *r.onnx.outputs))


def test_the_region_is_validated_against_float64():
    """A float64 computation that float32 cannot reproduce: first-call validation compares the
    engine with PyTorch's float64, finds them apart, and PyTorch runs the region."""

    def lost(x):
        big = x.double() * 1e9
        return ((big + 1.0 - big) * x.double()).float() + x

    x = torch.randn(64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(logging.getLogger("rtx_backend"), "propagate", False)  # (the ERROR is expected)
        out = compile_and_run(lost, x, truncate_double=True, min_block_size=1)
    torch.testing.assert_close(out, lost(x))
    assert rtx_backend.stats().get("validation_failures") == 1
    assert [r.kind for r in regions()] == ["pytorch"]


@pytest.mark.skipif(importlib.util.find_spec("diffusers") is None, reason="diffusers is not installed")
def test_a_flux_transformer_is_one_region():
    """diffusers' FluxTransformer2DModel computes its rotary tables in float64: without the
    option those nodes stay in PyTorch and split the graph; with it the model is one region."""
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    flux = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=False, axes_dims_rope=(4, 6, 6)).eval()

    def model(hidden, text, pooled, timestep, image_ids, text_ids):
        return flux(hidden_states=hidden, encoder_hidden_states=text, pooled_projections=pooled, timestep=timestep,
                    img_ids=image_ids, txt_ids=text_ids, return_dict=False)[0]

    args = (torch.randn(1, 16, 16), torch.randn(1, 8, 32), torch.randn(1, 32), torch.tensor([0.5]),
            torch.randn(16, 3) * 10, torch.zeros(8, 3))
    report = rtx_backend.explain(model, *args)
    assert {r.rule: r.nodes for r in report.rules}.get("fp64", 0) > 10, report
    torch._dynamo.reset()
    out = compile_and_run(model, *args, truncate_double=True)
    with torch.no_grad():
        torch.testing.assert_close(out, model(*args), atol=1e-4, rtol=1e-4)
    assert len(regions()) == 1 and _LAST[0].plan.eager_ops == []
    assert "validation_failures" not in rtx_backend.stats()
