"""The ONNX bridge: what it rewrites in a region before export so that TensorRT-RTX parses it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import rtx_backend

from .helpers import compile_and_run, regions

AMPERE = {"target_compute_capabilities": [(8, 6)], "min_block_size": 1}


class GroupedAttention(torch.nn.Module):
    """Grouped-query attention: 8 query heads share 2 key/value heads (groups of 4)."""

    def __init__(self, causal: bool, masked: bool) -> None:
        super().__init__()
        self.causal, self.masked = causal, masked

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        mask = None
        if self.masked:
            mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        return F.scaled_dot_product_attention(q * 2, k, v, attn_mask=mask, is_causal=self.causal, enable_gqa=True)


def _qkv(dtype):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, h, 16, 32, generator=g).to(dtype) for h in (8, 2, 2))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(("causal", "masked"), [(True, False), (False, True), (False, False)])
def test_grouped_query_attention_gets_an_engine(dtype, causal, masked):
    """TensorRT-RTX's parser used to reject the exported MatMul (8 against 2 heads); the screen
    then kept the attention in PyTorch while explain said it lowered."""
    model = GroupedAttention(causal, masked).eval()
    q, k, v = _qkv(dtype)
    out = compile_and_run(model, q, k, v, **AMPERE)
    stats = rtx_backend.stats()
    assert stats.get("engine_builds") == 1, stats
    (region,) = regions()
    assert region.engine is not None and region.kind == "onnxruntime"
    assert "validation_failures" not in stats
    tol = 2e-2 if dtype == torch.float16 else 1e-4
    torch.testing.assert_close(out, model(q, k, v), atol=tol, rtol=tol)
    report = rtx_backend.explain(model, q, k, v, options=AMPERE)
    assert len(report.regions) == 1 and not report.eager_nodes


def test_grouped_query_attention_with_a_dynamic_batch():
    model = GroupedAttention(True, False).eval()
    q, k, v = _qkv(torch.float16)
    compiled = torch.compile(model, backend="trtrtx", options=AMPERE, dynamic=True)
    with torch.no_grad():
        for b in (2, 3):
            args = tuple(t.repeat(2, 1, 1, 1)[:b] for t in (q, k, v))
            torch.testing.assert_close(compiled(*args), model(*args), atol=2e-2, rtol=2e-2)
    stats = rtx_backend.stats()
    assert stats.get("engine_builds", 0) >= 1 and "validation_failures" not in stats, stats


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_gpu_grouped_query_attention_runs_on_tensorrt_rtx(causal):
    """On CUDA the lowering picks a fused attention kernel; unfused for export, it is expanded too."""
    model = GroupedAttention(causal, False).eval()
    q, k, v = (t.cuda() for t in _qkv(torch.float16))
    out = compile_and_run(model, q, k, v, min_block_size=1)
    assert [r.kind for r in regions()] == ["tensorrt_rtx"]
    assert "validation_failures" not in rtx_backend.stats()
    torch.testing.assert_close(out, model(q, k, v), atol=2e-2, rtol=2e-2)
