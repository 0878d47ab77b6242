"""The ONNX screen (rtx_backend/build/screen.py): the policy table on exported ONNX nodes, TensorRT-RTX's
parser asked what it cannot take, refused ONNX nodes mapped back to FX nodes, re-partitioning."""

from __future__ import annotations

import operator

import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch import nn
from torch.nn import functional as F

import rtx_backend
from rtx_backend.build.screen import fx_node_name, onnx_refusals, parser_refusals, screen_region
from rtx_backend.export.bridge import export_region
from rtx_backend.plan import policy as _policy

from ..helpers import _LAST, compile_and_run, regions
from ..plan.test_policy import GEMM_OPS, lowered, plan, region_ops

TURING = ((7, 5),)
AMPERE = ((8, 6),)


def _model(nodes, inputs, outputs, initializers=(), value_info=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers), value_info=list(value_info))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _matmul(elem: int, declare_input: bool = True) -> onnx.ModelProto:
    a = helper.make_tensor_value_info("a", elem, [4, 8])
    b = helper.make_tensor_value_info("b", elem, [8, 3])
    y = helper.make_tensor_value_info("y", elem, [4, 3])
    relu = helper.make_node("Relu", ["a"], ["r"])
    matmul = helper.make_node("MatMul", ["r", "b"], ["y"])
    info = [helper.make_tensor_value_info("r", elem, [4, 8])] if declare_input else []
    return _model([relu, matmul], [a, b], [y], value_info=info)


def _conv(elem: int, op: str, spatial: int) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", elem, [1, 2, *[4] * spatial])
    y = helper.make_tensor_value_info("y", elem, None)
    w = helper.make_tensor("w", elem, [2, 2, *[3] * spatial], [0.0] * (4 * 3**spatial))
    return _model([helper.make_node(op, ["x", "w"], ["y"])], [x], [y], [w])


@pytest.mark.parametrize(("_name", "model", "targets", "rule"), [
    ("fp32_matmul_turing", _matmul(TensorProto.FLOAT), TURING, "fp32-gemm-turing"),
    ("fp32_matmul_ampere", _matmul(TensorProto.FLOAT), AMPERE, None),
    ("fp16_matmul_turing", _matmul(TensorProto.FLOAT16), TURING, None),
    ("unknown_dtype_fails_closed", _matmul(TensorProto.FLOAT16, declare_input=False), TURING, "fp32-gemm-turing"),
    ("fp16_conv3d", _conv(TensorProto.FLOAT16, "Conv", 3), TURING, "conv3d-turing"),
    ("fp32_conv2d", _conv(TensorProto.FLOAT, "Conv", 2), TURING, None),
    ("fp32_deconv3d", _conv(TensorProto.FLOAT, "ConvTranspose", 3), TURING, "fp32-conv-transpose3d-turing"),
    ("fp16_deconv3d", _conv(TensorProto.FLOAT16, "ConvTranspose", 3), TURING, None),
    ("fp32_conv3d_sm89", _conv(TensorProto.FLOAT, "Conv", 3), ((8, 9),), None),
])
def test_family_rules_on_onnx_nodes(_name, model, targets, rule):
    refusals = onnx_refusals(model, targets)
    assert [r.rule for r in refusals.values()] == ([rule] if rule else [])
    if rule:
        index = next(iter(refusals))
        assert model.graph.node[index].op_type in ("MatMul", "Conv", "ConvTranspose")
        assert refusals[index].target == targets[0]


def _bitwise_model() -> onnx.ModelProto:
    a = helper.make_tensor_value_info("a", TensorProto.INT32, [4])
    y = helper.make_tensor_value_info("y", TensorProto.INT32, [4])
    nodes = [helper.make_node("Abs", ["a"], ["b"]), helper.make_node("BitwiseAnd", ["b", "a"], ["c"]),
             helper.make_node("Neg", ["c"], ["y"])]
    return _model(nodes, [a], [y])


def test_parser_is_asked_which_nodes_it_cannot_take():
    model = _bitwise_model()
    refusals = parser_refusals(model.SerializeToString(), model)
    assert list(refusals) == [1]
    assert refusals[1].rule == "parser-unsupported" and "BitwiseAnd" in refusals[1].message


def test_a_refusal_that_maps_to_no_fx_node_refuses_the_whole_region():
    model = _bitwise_model()  # hand-made: no exporter metadata
    refused = screen_region(model.SerializeToString(), ["abs_1", "bitwise_and", "neg"], AMPERE)
    assert set(refused) == {"abs_1", "bitwise_and", "neg"}
    assert all("maps to no FX node" in r.message for r in refused.values())


def test_onnx_nodes_map_back_to_region_nodes_by_name():
    mlp = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4)).eval().half()
    gm = lowered(mlp, torch.randn(2, 8).half())
    # GELU stays in PyTorch: the second region holds addmm_2 alone, which export names "addmm"
    p = plan(gm, [(8, 6)], torch_executed_ops=["aten.gelu"])
    assert len(p.regions) == 2
    mapped = {}
    for name in p.regions:
        region = getattr(p.graph_module, name)
        fx_names = {n.name for n in region.graph.nodes if n.op == "call_function"}
        proto = onnx.load_from_string(export_region(region).model)
        for node in proto.graph.node:
            if node.op_type == "Gemm":
                mapped[fx_node_name(node)] = fx_names
    assert set(mapped) == {"addmm", "addmm_1", "addmm_2"}
    assert all(name in names for name, names in mapped.items())


class Bitwise(nn.Module):
    """Float math around integer bitwise ops (BitwiseAnd/Or: TensorRT-RTX's parser has neither)."""

    def forward(self, x, i):
        y = torch.sigmoid(x) * 2 + 1
        j = (i & 3) | 4
        return torch.relu(y + j.float()).exp() - 1


@pytest.mark.parametrize("strict", [False, True])
def test_parser_refusals_repartition_the_graph(strict):
    x, i = torch.randn(2, 8), torch.arange(8)
    y = compile_and_run(Bitwise(), x, i, min_block_size=1, target_compute_capabilities=[(8, 6)], strict=strict)
    torch.testing.assert_close(y, Bitwise()(x, i))
    reasons = _LAST[0].plan.reasons
    refused = {name: r for name, r in reasons.items() if r.rule == "parser-unsupported"}
    assert set(refused) == {"bitwise_and", "bitwise_or"}
    assert all("Bitwise" in r.message for r in refused.values())
    built = regions()
    assert built and all(r.engine is not None for r in built)
    assert not region_ops(built) & {torch.ops.aten.bitwise_and.Scalar, torch.ops.aten.bitwise_or.Scalar}


def test_a_gemm_the_table_misses_is_caught_after_export(monkeypatch):
    """Defence in depth: with the ATen table blind to GEMMs, the ONNX screen still keeps them out."""
    monkeypatch.setattr(_policy, "_GEMM", _policy.re.compile(r"^$"))
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh()).eval()
    x = torch.randn(4, 16)
    y = compile_and_run(model, x, min_block_size=1, target_compute_capabilities=list(TURING))
    with torch.no_grad():
        torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    reasons = _LAST[0].plan.reasons
    gemm_reasons = [r for r in reasons.values() if r.rule == "fp32-gemm-turing"]
    assert len(gemm_reasons) == 2 and all("ONNX Gemm" in r.message for r in gemm_reasons)
    built = regions()
    assert built and all(r.engine is not None for r in built)
    assert not region_ops(built) & GEMM_OPS
    assert rtx_backend.stats()["engine_builds"] >= 2


# ---- CUDA's fused attention kernels reach the bridge as the plain op ---------------------------

def _fused_attention_graph(target, *extra, mask: bool) -> torch.fx.GraphModule:
    """A region graph as aot_autograd traces SDPA on CUDA: a fused kernel, its first output used."""
    graph = torch.fx.Graph()
    q, k, v = (graph.placeholder(n) for n in "qkv")
    vals = [torch.empty(2, 3, 5, 8)] * 3
    args: list = [q, k, v]
    if mask:
        vals.append(torch.empty(2, 3, 5, 5))
        args.append(graph.placeholder("m"))
    elif target is not torch.ops.aten._scaled_dot_product_flash_attention.default:
        args.append(None)  # efficient attention's attn_bias
    fused = graph.call_function(target, (*args, *extra))
    first = graph.call_function(operator.getitem, (fused, 0))
    graph.output((graph.call_function(torch.ops.aten.mul.Tensor, (first, 2.0)),))
    for node, val in zip(graph.nodes, vals):
        node.meta["val"] = val
    first.meta["val"] = graph.find_nodes(op="output")[0].args[0][0].meta["val"] = torch.empty(2, 3, 5, 8)
    fused.meta["val"] = (first.meta["val"], torch.empty(2, 3, 5))  # (attention, logsumexp), as traced
    return torch.fx.GraphModule(torch.nn.Module(), graph)


@pytest.mark.parametrize(("_name", "target", "extra", "mask"), [
    # compute_log_sumexp=True, as traced when inputs require grad: the exporter's own translation fails
    ("efficient_lse_mask", torch.ops.aten._scaled_dot_product_efficient_attention.default, (True, 0.0, False), True),
    ("efficient_causal", torch.ops.aten._scaled_dot_product_efficient_attention.default, (False, 0.0, True), False),
    ("flash_causal", torch.ops.aten._scaled_dot_product_flash_attention.default, (0.0, True), False),
    # cuDNN's kernel (picked on Hopper): the exporter has no translation; the policy lets it in
    ("cudnn_causal", torch.ops.aten._scaled_dot_product_cudnn_attention.default, (False, 0.0, True, False), False),
])
def test_fused_cuda_attention_exports_as_attention(_name, target, extra, mask):
    import onnxruntime as ort

    gm = _fused_attention_graph(target, *extra, mask=mask)
    fused = next(n for n in gm.graph.nodes if n.target is target)
    assert _policy.CapabilitySupport(AMPERE, ()).judge(fused) is None  # the bridge exports it
    region = export_region(gm)
    assert not [n for n in gm.graph.nodes if n.target is target]
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    inputs = [q, k, v] + ([torch.randn(2, 3, 5, 5)] if mask else [])
    causal = extra[1] if target is torch.ops.aten._scaled_dot_product_flash_attention.default else extra[2]
    expected = 2 * F.scaled_dot_product_attention(
        q, k, v, attn_mask=inputs[3] if mask else None, is_causal=causal)
    session = ort.InferenceSession(region.model, providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {s.name: t.numpy() for s, t in zip(region.inputs, inputs)})
    torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-5, rtol=1e-5)


def test_views_after_a_fused_attention_survive_its_layout():
    """CUDA's kernels return attention as (batch, length, heads, dim) in memory; aot_autograd then
    records transpose + view to merge the heads, a view the plain op's layout does not allow."""
    import onnxruntime as ort

    graph = torch.fx.Graph()
    q, k, v = (graph.placeholder(n) for n in "qkv")
    fused = graph.call_function(torch.ops.aten._scaled_dot_product_efficient_attention.default,
                                (q, k, v, None, False))
    first = graph.call_function(operator.getitem, (fused, 0))
    merged = graph.call_function(torch.ops.aten.transpose.int, (first, 1, 2))
    out = graph.call_function(torch.ops.aten.view.default, (merged, [2, 5, 24]))
    graph.output((out,))
    flash_layout = torch.empty(2, 5, 3, 8).transpose(1, 2)  # (2, 3, 5, 8) with the kernel's strides
    for node, val in zip(graph.nodes, [torch.empty(2, 3, 5, 8)] * 3):
        node.meta["val"] = val
    first.meta["val"] = flash_layout
    merged.meta["val"] = flash_layout.transpose(1, 2)
    out.meta["val"] = torch.empty(2, 5, 24)
    region = export_region(torch.fx.GraphModule(torch.nn.Module(), graph))
    torch.manual_seed(0)
    qkv = [torch.randn(2, 3, 5, 8) for _ in range(3)]
    expected = F.scaled_dot_product_attention(*qkv).transpose(1, 2).reshape(2, 5, 24)
    session = ort.InferenceSession(region.model, providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {s.name: t.numpy() for s, t in zip(region.inputs, qkv)})
    torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-5, rtol=1e-5)


class _CudaVal:
    """A placeholder value that says it lives on CUDA (no CUDA here)."""

    is_cuda = True


@pytest.mark.parametrize(("_name", "cuda", "dynamic", "attention", "math_only"), [
    ("cuda_dynamic_attention", True, True, True, True),
    ("cpu", False, True, True, False),
    ("static", True, False, True, False),
    ("no_attention", True, True, False, False),
])
def test_dynamic_cuda_attention_is_traced_without_kernel_shape_checks(_name, cuda, dynamic, attention, math_only):
    """On CUDA, choosing a fused attention kernel guards the symbolic sizes, and torch.export then
    refuses the dynamic dimensions; the bridge traces such regions with the math backend only."""
    from rtx_backend._types import TensorSpec
    from rtx_backend.export.bridge import _attention_without_shape_checks

    graph = torch.fx.Graph()
    q = graph.placeholder("q")
    q.meta["val"] = _CudaVal() if cuda else torch.empty(2, 3, 5, 8)
    op = torch.ops.aten.scaled_dot_product_attention.default if attention else torch.ops.aten.relu.default
    graph.output((graph.call_function(op, (q, q, q) if attention else (q,)),))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    spec = TensorSpec("input_0", (2, 3, "s0" if dynamic else 5, 8), torch.float16, (2, 3, 5, 8))
    before = torch.backends.cuda.flash_sdp_enabled()
    with _attention_without_shape_checks(gm, [spec]):
        inside = (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled())
    assert inside == ((False, True) if math_only else (before, torch.backends.cuda.math_sdp_enabled()))
    assert torch.backends.cuda.flash_sdp_enabled() == before


class _GuardsNotOne(nn.Module):
    """Like ops that branch on a size being 1 (on CUDA, the encoder's attention): a guard s0 != 1."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.shape[1] != 1 else x


def test_dynamic_dims_export_within_dynamos_range():
    """A dynamic dimension is exported with Dynamo's range for its symbol (from 2: Dynamo
    specializes 0 and 1), so a guard `size != 1` added by an op is no constraint violation (torch
    2.11 on CUDA raised "Constraints violated" for such a guard in the encoder with a 0..inf range)."""
    from rtx_backend._types import TensorSpec
    from rtx_backend.export.bridge import _dynamic_shapes, _export_non_strict

    spec = TensorSpec("input_0", (2, "s0"), torch.float32, (2, 5), ((2, 2), (2, None)))
    shapes = _dynamic_shapes([spec])
    assert shapes is not None
    dim = shapes[0][0][1]
    assert (dim.min, dim.max) == (2, torch.export.Dim("any").max)
    exported = _export_non_strict(_GuardsNotOne(), (torch.randn(2, 5),), shapes[0])  # (shapes: for *tensors)
    torch.testing.assert_close(exported.module()(torch.ones(2, 7)), torch.full((2, 7), 2.0))
    bounded = _dynamic_shapes([TensorSpec("input_0", (2, "s0"), torch.float32, (2, 5), ((2, 2), (3, 64)))])
    assert bounded is not None and (bounded[0][0][1].min, bounded[0][0][1].max) == (3, 64)
