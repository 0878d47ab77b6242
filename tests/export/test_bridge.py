"""The ONNX bridge: what it rewrites in a region before export so that TensorRT-RTX parses it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import rtx_backend

from ..helpers import compile_and_run, regions

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


class SelfAttention(torch.nn.Module):
    """torchvision's ViT attention: nn.MultiheadAttention, batch first, query = key = value."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.attention = torch.nn.MultiheadAttention(64, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attention(x, x, x, need_weights=False)[0]


def _ops(dump_dir) -> set[str]:
    import onnx

    (path,) = dump_dir.glob("*.onnx")
    return {n.op_type for n in onnx.load(str(path)).graph.node}


@pytest.mark.parametrize("dynamic", [False, True])
def test_multihead_attention_in_projection_is_one_gemm_not_a_copy_of_the_weight_per_row(tmp_path, dynamic):
    """nn.MultiheadAttention's in-projection of the sequence-first query decomposes into a bmm
    against the weight expanded over the sequence; exported as it is, TensorRT-RTX materialises
    that copy (the ViT-B engine 22x slower than written with scaled_dot_product_attention). The
    bridge makes it one GEMM."""
    # weights that require no grad: then `linear` decomposes into the broadcast bmm
    model = SelfAttention().eval().half().requires_grad_(False)
    x = torch.randn(2, 10, 64).half()
    compiled = torch.compile(model, backend="trtrtx", dynamic=dynamic,
                             options={**AMPERE, "dump_onnx_dir": str(tmp_path)})
    with torch.no_grad():
        out = compiled(x)
        reference = model.float()(x.float())
        model.half()
        if dynamic:
            y = torch.randn(3, 7, 64).half()
            torch.testing.assert_close(compiled(y).float(), model.float()(y.float()), atol=2e-2, rtol=2e-2)
    stats = rtx_backend.stats()
    assert stats.get("weight_broadcasts_unfolded", 0) >= 1 and "validation_failures" not in stats, stats
    if not dynamic:  # the rewrite keeps every node's value: the region needs no second trace
        assert stats.get("exports_untraced") and not stats.get("exports_traced"), stats
    assert "Expand" not in _ops(tmp_path)
    torch.testing.assert_close(out.float(), reference, atol=2e-2, rtol=2e-2)


def test_a_bmm_against_a_weight_broadcast_over_the_batch_becomes_mm():
    from rtx_backend.export.bridge import unbroadcast_weight_matmuls

    w = torch.randn(8, 5)

    def f(x):
        return torch.ops.aten.bmm.default(x, torch.ops.aten.expand.default(w, [4, 8, 5]))

    gm = torch.fx.experimental.proxy_tensor.make_fx(f)(torch.randn(4, 3, 8))
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(torch.randn(4, 3, 8))
    unbroadcast_weight_matmuls(gm)
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.mm.default in targets and torch.ops.aten.bmm.default not in targets
    x = torch.randn(4, 3, 8)
    torch.testing.assert_close(gm(x), x @ w)


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
