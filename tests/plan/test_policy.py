"""The capability policy (rtx_backend/plan/policy.py): the Turing rules on every op form that reaches
them after lowering, fail-closed metadata, reasons, and TensorRT-RTX 1.7's builder as an oracle
over the model zoo (tests/zoo.py): every region the backend makes must build."""

from __future__ import annotations

import copy
import math
import operator

import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import rtx_backend
from rtx_backend._errors import BuildError
from rtx_backend._options import Options
from rtx_backend._types import Reason
from rtx_backend.build import engine as _engine
from rtx_backend.build.screen import onnx_refusals
from rtx_backend.export.bridge import export_region
from rtx_backend.lower.lowering import lower
from rtx_backend.plan.partition import plan_graph
from rtx_backend.plan.policy import RULES, CapabilitySupport, NodeFacts, op_family

from ..helpers import _LAST, compile_and_run, regions
from ..zoo import ZOO

TURING = [(7, 5)]
AMPERE = [(8, 6)]
TARGET_SETS = ([(7, 5)], [(8, 6)], [(7, 5), (8, 6), (8, 9), (12, 0)])
TURING_RULES = {"fp32-gemm-turing", "conv3d-turing", "fp32-conv-transpose3d-turing", "bf16-turing"}
aten = torch.ops.aten
# Spelled out here, independently of the policy's own classification.
GEMM_OPS = {aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default, aten.addbmm.default,
            aten.mv.default, aten.addmv.default, aten.dot.default,
            aten._scaled_dot_product_flash_attention_for_cpu.default,
            aten._scaled_dot_product_efficient_attention.default,
            aten._scaled_dot_product_flash_attention.default}


def lowered(model, *inputs) -> torch.fx.GraphModule:
    """The frozen ATen graph the backend would judge (lowering only: no policy, no export)."""
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm, example_inputs):
        return lower(gm, example_inputs, lambda aten_gm, _args: graphs.append(aten_gm) or aten_gm.forward)

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend, fullgraph=True)(*inputs)
    assert len(graphs) == 1
    return graphs[0]


def verdicts(gm: torch.fx.GraphModule, targets) -> dict[torch.fx.Node, Reason | None]:
    support = CapabilitySupport(tuple(tuple(t) for t in targets))
    return {n: support.judge(n) for n in gm.graph.nodes if n.op == "call_function"}


def plan(aten_gm: torch.fx.GraphModule, targets, min_block_size: int = 1, **options):
    """Policy + partition on a copy of the graph (partitioning edits it), as the backend plans."""
    gm = torch.fx.GraphModule(aten_gm, copy.deepcopy(aten_gm.graph))
    options.update(target_compute_capabilities=targets, min_block_size=min_block_size)
    return plan_graph(gm, Options.from_dict(options))


def region_ops(plan_or_regions) -> set:
    gms = ([getattr(plan_or_regions.graph_module, r) for r in plan_or_regions.regions]
           if hasattr(plan_or_regions, "regions") else [r.graph_module for r in plan_or_regions])
    return {n.target for gm in gms for n in gm.graph.nodes if n.op == "call_function"}


def region_nodes(p) -> set[str]:
    return {n.name for r in p.regions for n in getattr(p.graph_module, r).graph.nodes if n.op == "call_function"}


# ---- the table --------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "family"), [
    ("mm", "gemm"), ("addmm", "gemm"), ("bmm", "gemm"), ("baddbmm", "gemm"), ("addbmm", "gemm"),
    ("mv", "gemm"), ("addmv", "gemm"), ("dot", "gemm"), ("vdot", "gemm"), ("matmul", "gemm"),
    ("linear", "gemm"), ("einsum", "gemm"), ("_euclidean_dist", "gemm"),
    ("_scaled_dot_product_flash_attention_for_cpu", "gemm"), ("_scaled_dot_product_efficient_attention", "gemm"),
    ("_scaled_dot_product_flash_attention", "gemm"), ("_scaled_dot_product_cudnn_attention", "gemm"),
    ("_flash_attention_forward", "gemm"), ("_efficient_attention_forward", "gemm"),
    ("_native_multi_head_attention", "gemm"), ("_transformer_encoder_layer_fwd", "gemm"),
    ("_addmm_activation", "gemm"), ("_scaled_mm", "gemm"), ("chain_matmul", "gemm"), ("linalg_multi_dot", "gemm"),
    ("convolution", "conv"), ("conv3d", "conv"), ("cudnn_convolution", "conv"), ("slow_conv3d_forward", "conv"),
    ("conv_transpose3d", "conv_transpose"), ("cudnn_convolution_transpose", "conv_transpose"),
    ("upsample_bilinear2d", "other"), ("upsample_trilinear3d", "other"), ("upsample_linear1d", "other"),
    ("convert_element_type", "other"), ("linalg_vecdot", "other"), ("relu", "other"), ("sum", "other"),
])
def test_op_family(name, family):
    assert op_family(name) == family


@pytest.mark.parametrize(("facts", "target", "rule"), [
    # (facts, target, expected rule or None)
    (NodeFacts("gemm", frozenset({torch.float32}), frozenset({torch.float32}), None), (7, 5), "fp32-gemm-turing"),
    (NodeFacts("gemm", frozenset({torch.float32}), frozenset({torch.float32}), None), (8, 6), None),
    (NodeFacts("gemm", frozenset({torch.float16}), frozenset({torch.float16, torch.float32}), None), (7, 5), None),
    (NodeFacts("conv", frozenset({torch.float16}), frozenset({torch.float16}), 3), (7, 5), "conv3d-turing"),
    (NodeFacts("conv", frozenset({torch.float32}), frozenset({torch.float32}), 2), (7, 5), None),
    (NodeFacts("conv", frozenset({torch.float32}), frozenset({torch.float32}), None), (7, 5), "conv3d-turing"),
    (NodeFacts("conv", frozenset({torch.float32}), frozenset({torch.float32}), 3), (8, 9), None),
    (NodeFacts("conv_transpose", frozenset({torch.float32}), frozenset({torch.float32}), 3), (7, 5),
     "fp32-conv-transpose3d-turing"),
    (NodeFacts("conv_transpose", frozenset({torch.float16}), frozenset({torch.float16}), 3), (7, 5), None),
    (NodeFacts("other", frozenset({torch.float32}), frozenset({torch.bfloat16}), None), (7, 5), "bf16-turing"),
    (NodeFacts("other", frozenset({torch.bfloat16}), frozenset({torch.bfloat16}), None), (8, 6), None),
    (NodeFacts("other", frozenset({torch.complex64}), frozenset({torch.complex64}), None), (12, 0), "complex"),
    (NodeFacts("other", frozenset({torch.float64}), frozenset({torch.float64}), None), (8, 6), "fp64"),
    (NodeFacts("other", frozenset({torch.float8_e4m3fn}), frozenset({torch.float8_e4m3fn}), None), (8, 6), "fp8"),
    (NodeFacts("other", frozenset({torch.float8_e4m3fn}), frozenset({torch.float8_e4m3fn}), None), (8, 9), None),
    (NodeFacts("other", frozenset({torch.float4_e2m1fn_x2}), frozenset({torch.float4_e2m1fn_x2}), None), (8, 9), "fp4"),
    (NodeFacts("other", frozenset({torch.float4_e2m1fn_x2}), frozenset({torch.float4_e2m1fn_x2}), None), (12, 0), None),
])
def test_rule_table(facts, target, rule):
    from rtx_backend.plan.policy import RULES, first_match

    match = first_match(facts, [target], RULES)
    assert (match[0].name if match else None) == rule
    if match:
        assert match[1] == target


# ---- every op form reaches its rule after lowering ------------------------------------------------

def _w(*s):
    return torch.randn(*s)


GEMM_FORMS = {
    "mm": (lambda a, b: a @ b, ((4, 8), (8, 3))),
    "bmm": (torch.bmm, ((2, 4, 8), (2, 8, 3))),
    "addmm": (lambda a, b, c: torch.addmm(c, a, b), ((4, 8), (8, 3), (3,))),
    "matmul_3d_2d": (torch.matmul, ((2, 4, 8), (8, 3))),
    "matmul_broadcast": (torch.matmul, ((2, 3, 4, 8), (3, 8, 5))),
    "mv": (torch.mv, ((4, 8), (8,))),
    "dot": (torch.dot, ((8,), (8,))),
    "inner": (torch.inner, ((4, 8), (5, 8))),
    "linear": (F.linear, ((4, 8), (3, 8), (3,))),
    "linear_3d_no_bias": (F.linear, ((2, 4, 8), (3, 8))),
    "baddbmm": (torch.baddbmm, ((2, 4, 3), (2, 4, 8), (2, 8, 3))),
    "addbmm": (torch.addbmm, ((4, 3), (2, 4, 8), (2, 8, 3))),
    "addmv": (torch.addmv, ((4,), (4, 8), (8,))),
    "einsum_bmm": (lambda a, b: torch.einsum("bij,bjk->bik", a, b), ((2, 4, 8), (2, 8, 3))),
    "einsum_contract": (lambda a, b: torch.einsum("ij,ij->i", a, b), ((4, 8), (4, 8))),
    "tensordot": (lambda a, b: torch.tensordot(a, b, dims=([1], [0])), ((4, 8), (8, 3))),
    "sdpa": (F.scaled_dot_product_attention, ((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8))),
    "sdpa_causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                    ((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8))),
    "sdpa_mask": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                  ((1, 2, 4, 8), (1, 2, 6, 8), (1, 2, 6, 8), (4, 6))),
    "cdist_p2_many_rows": (torch.cdist, ((30, 8), (20, 8))),
    "cdist_p2_mm_mode": (lambda a, b: torch.cdist(a, b, compute_mode="use_mm_for_euclid_dist"), ((5, 8), (4, 8))),
    "cdist_p2_batched": (torch.cdist, ((2, 26, 8), (2, 3, 8))),
}


@pytest.mark.parametrize("name", sorted(GEMM_FORMS))
def test_every_gemm_form_is_refused_in_fp32_on_turing(name):
    fn, shapes = GEMM_FORMS[name]
    for dtype in (torch.float32, torch.float16):
        gm = lowered(fn, *[_w(*s).to(dtype) for s in shapes])
        gemms = [n for n in gm.graph.nodes if n.target in GEMM_OPS]
        assert gemms, f"{name} lowered to no GEMM: {gm.graph}"
        for targets in (TURING, AMPERE):
            judged = verdicts(gm, targets)
            refused = dtype == torch.float32 and targets == TURING
            for node in gemms:
                reason = judged[node]
                if refused:
                    assert reason is not None and reason.rule == "fp32-gemm-turing", (name, node, reason)
                    assert reason.target == (7, 5)
                else:
                    assert reason is None, (name, dtype, targets, node, reason)


@pytest.mark.parametrize(("_name", "fn", "shape"), [
    ("p2_few_rows", lambda a, b: torch.cdist(a, b), (5, 8)),
    ("p2_no_mm_mode", lambda a, b: torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist"), (30, 8)),
    ("p1", lambda a, b: torch.cdist(a, b, p=1.0), (30, 8)),
    ("p3", lambda a, b: torch.cdist(a, b, p=3.0), (30, 8)),
    ("pinf", lambda a, b: torch.cdist(a, b, p=float("inf")), (30, 8)),
])
def test_cdist_without_gemm_stays_on_tensorrt_rtx(_name, fn, shape):
    a, b = torch.randn(*shape), torch.randn(shape[0] - 1, shape[1])
    gm = lowered(fn, a, b)
    judged = verdicts(gm, TURING)
    assert not any(n.target in GEMM_OPS for n in judged)
    assert all(r is None for r in judged.values()), judged  # decomposed: exportable, elementwise
    torch.testing.assert_close(gm(a, b)[0], fn(a, b), atol=1e-4, rtol=1e-4)


class Conv3d(nn.Module):
    def __init__(self, padding_mode="zeros", explicit_pad=None, transposed=False, dims=3):
        super().__init__()
        conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dims]
        self.conv = (nn.ConvTranspose3d(2, 3, 3) if transposed
                     else conv(2, 3, 3, padding=1 if explicit_pad is None else 0, padding_mode=padding_mode))
        self.explicit_pad = explicit_pad

    def forward(self, x):
        if self.explicit_pad:
            x = F.pad(x, (1, 1) * (x.dim() - 2), mode=self.explicit_pad)
        return self.conv(x)


@pytest.mark.parametrize(("_name", "kwargs", "dims", "fp32_rule", "fp16_rule"), [
    ("conv3d", dict(), 3, "conv3d-turing", "conv3d-turing"),
    ("reflect", dict(padding_mode="reflect"), 3, "conv3d-turing", "conv3d-turing"),
    ("replicate", dict(padding_mode="replicate"), 3, "conv3d-turing", "conv3d-turing"),
    ("circular", dict(padding_mode="circular"), 3, "conv3d-turing", "conv3d-turing"),
    ("f_pad_constant", dict(explicit_pad="constant"), 3, "conv3d-turing", "conv3d-turing"),
    ("f_pad_reflect", dict(explicit_pad="reflect"), 3, "conv3d-turing", "conv3d-turing"),
    ("conv_transpose3d", dict(transposed=True), 3, "fp32-conv-transpose3d-turing", None),
    ("conv2d", dict(dims=2), 2, None, None),
    ("conv2d_reflect", dict(dims=2, padding_mode="reflect"), 2, None, None),
    ("conv1d", dict(dims=1), 1, None, None),
])
def test_convolutions_on_turing(_name, kwargs, dims, fp32_rule, fp16_rule):
    model = Conv3d(**kwargs).eval()
    for dtype, rule in ((torch.float32, fp32_rule), (torch.float16, fp16_rule)):
        x = torch.randn(1, 2, *[5] * dims, dtype=dtype)
        gm = lowered(model.to(dtype), x)
        convs = {n: r for n, r in verdicts(gm, TURING).items() if n.target == aten.convolution.default}
        assert len(convs) == 1
        reason = next(iter(convs.values()))
        assert (reason.rule if reason else None) == rule, (dtype, reason)
        others = [r for n, r in verdicts(gm, TURING).items() if n not in convs and r is not None]
        assert not others  # the padding itself stays on TensorRT-RTX
        assert not any(verdicts(gm, AMPERE).values())


class Deconvs(nn.Module):
    """A strided and dilated transposed convolution between ones TensorRT-RTX builds."""

    def __init__(self, dims: int = 2) -> None:
        super().__init__()
        deconv = nn.ConvTranspose2d if dims == 2 else nn.ConvTranspose1d
        self.strided = deconv(2, 3, 3, stride=2)
        self.dilated = deconv(3, 3, 3, dilation=2)
        self.both = deconv(3, 3, 3, stride=2, dilation=2)
        self.plain = deconv(3, 2, 3)

    def forward(self, x):
        return self.plain(torch.relu(self.both(torch.relu(self.dilated(self.strided(x))))))


@pytest.mark.parametrize("dims", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_strided_and_dilated_transposed_convolutions_stay_in_pytorch(dims, dtype):
    """TensorRT-RTX's builder refuses them on every target ("Strided & Dilated Deconv are
    currently not supported"), which used to fail the whole region's build."""
    model = Deconvs(dims).eval().to(dtype)
    x = torch.randn(1, 2, *[6] * dims, dtype=dtype)
    gm = lowered(model, x)
    for targets in TARGET_SETS:
        refused = {n: r for n, r in verdicts(gm, targets).items() if r is not None}
        deconvs = [n for n in gm.graph.nodes if n.target == aten.convolution.default]
        assert len(deconvs) == 4
        (node,) = refused  # only the strided and dilated one, on every target
        assert node is deconvs[2] and refused[node].rule == "strided-dilated-conv-transpose"
        assert "strided and dilated" in refused[node].message
        p = plan(gm, targets)
        for name in p.regions:  # the others build, for every declared target
            _engine.build(export_region(getattr(p.graph_module, name)).model, tuple(map(tuple, targets)), {})


def test_the_onnx_screen_refuses_strided_and_dilated_deconvolutions():
    gm = lowered(Deconvs().eval(), torch.randn(1, 2, 6, 6))
    gm.graph.eliminate_dead_code()
    model = onnx.load_from_string(export_region(copy.deepcopy(gm)).model)
    refused = onnx_refusals(model, ((8, 6),))
    kinds = {model.graph.node[i].op_type: r.rule for i, r in refused.items()}
    assert kinds == {"ConvTranspose": "strided-dilated-conv-transpose"} and len(refused) == 1


class FloatAttributes(nn.Module):
    """GPT-2's pattern: a Python float attribute (an attention scale) in arithmetic."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = 0.25
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(x) * math.sqrt(self.scale * 2.0))


def test_float64_scalar_arithmetic_says_why_it_stays_in_pytorch():
    """Under dynamic shapes the float arrives as a 0-d float64 tensor: its arithmetic stays in
    PyTorch (exact), with a reason that says so and how to avoid it."""
    model, x = FloatAttributes().eval(), torch.randn(3, 8)
    options = {"target_compute_capabilities": [(8, 6)], "min_block_size": 1}
    report = rtx_backend.explain(model, x, options=options, dynamic=True)
    assert report.eager_nodes and len(report.regions) == 1
    for node in report.eager_nodes:
        assert node.rule == "fp64-scalar", node
        assert "specialize_float" in node.message
    with torch._dynamo.config.patch(specialize_float=True):
        report = rtx_backend.explain(model, x, options=options, dynamic=True)
    assert not report.eager_nodes and len(report.regions) == 1
    facts = NodeFacts("other", frozenset({torch.float64}), frozenset({torch.float64}), None)
    # a float64 tensor that is not a scalar: plain "fp64"
    assert [r.name for r in RULES if r.matches(facts, (8, 6))] == ["fp64"]


def test_bf16_anywhere_is_refused_on_turing_only():
    class Mixed(nn.Module):
        def forward(self, x):
            y = torch.relu(x) * 2  # FP32 in, FP32 out: fine on Turing
            z = y.to(torch.bfloat16).sin().to(torch.float32)  # every node touching bf16: refused
            return z + 1

    gm = lowered(Mixed(), torch.randn(4, 4))
    for targets, expect_refused in ((TURING, True), (AMPERE, False)):
        judged = {n.name: r for n, r in verdicts(gm, targets).items()}
        touching = {n.name for n in gm.graph.nodes if n.op == "call_function" and torch.bfloat16 in {
            v.meta["val"].dtype for v in [n, *n.all_input_nodes] if isinstance(v.meta.get("val"), torch.Tensor)}}
        assert len(touching) >= 3
        for name, reason in judged.items():
            refused = expect_refused and name in touching
            assert (reason is not None and reason.rule == "bf16-turing") == refused, (name, reason)


def test_getitem_of_bf16_is_refused_on_turing():
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    q = torch.randn(1, 2, 4, 8, dtype=torch.bfloat16)
    gm = lowered(fn, q, q, q)
    getitems = [n for n in gm.graph.nodes if n.target is operator.getitem]
    assert getitems
    support = CapabilitySupport(((7, 5),))
    assert all(support.judge(n).rule == "bf16-turing" for n in getitems)
    assert all(CapabilitySupport(((8, 6),)).judge(n) is None for n in getitems)


def test_unknown_metadata_fails_closed():
    gm = lowered(lambda x: torch.relu(x) + 1, torch.randn(3))
    node = next(n for n in gm.graph.nodes if n.target == aten.relu.default)
    support = CapabilitySupport(((8, 6),))
    assert support.judge(node) is None
    del node.meta["val"]
    assert support.judge(node).rule == "unknown-metadata"
    add = next(n for n in gm.graph.nodes if n.target == aten.add.Tensor)
    assert support.judge(add).rule == "unknown-metadata"  # its input's dtype is now unknown


def test_refused_nodes_carry_their_reason_into_the_plan():
    gm = lowered(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval(), torch.randn(2, 8))
    p = plan(gm, TURING)
    addmms = [name for name, op in p.eager_ops if "addmm" in op]
    assert len(addmms) == 2
    for name in addmms:
        assert p.reasons[name].rule == "fp32-gemm-turing" and p.reasons[name].target == (7, 5)
        assert "SM7.5" in str(p.reasons[name])
    refused = Reason("parser-unsupported", "test")
    relu = next(n.name for n in gm.graph.nodes if n.target == aten.relu.default)
    support = CapabilitySupport(((8, 6),), refused={relu: refused})
    assert support.judge(next(n for n in gm.graph.nodes if n.name == relu)) is refused


def test_targets_come_from_the_option_not_the_machine():
    gm = lowered(nn.Linear(8, 8).eval(), torch.randn(2, 8))
    assert plan(gm, TURING).regions == []
    assert len(plan(gm, AMPERE).regions) == 1
    assert plan(gm, [(8, 6), (7, 5)]).regions == []  # every declared target must run it


# ---- end to end with target_compute_capabilities=[(7, 5)] (the tests) ------------------

class Op(nn.Module):
    def __init__(self, fn, *params):
        super().__init__()
        self.fn = fn
        self.params = nn.ParameterList([nn.Parameter(p, requires_grad=False) for p in params])

    def forward(self, *xs):
        return self.fn(*xs, *self.params)


def _mlp(dtype=torch.float32):
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval().to(dtype)


def _convnet(dtype=torch.float32):
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3)).eval().to(dtype)


REFUSED_ON_TURING = {
    # name: (model, inputs, every compute node is refused -> zero regions)
    "mm": (lambda: Op(lambda x, w: x @ w, torch.randn(16, 8)), lambda: (torch.randn(4, 16),), True),
    "addmm": (lambda: Op(lambda x, w, b: torch.addmm(b, x, w), torch.randn(16, 8), torch.randn(8)),
              lambda: (torch.randn(4, 16),), True),
    "linear": (lambda: nn.Linear(16, 8).eval(), lambda: (torch.randn(4, 16),), True),
    "sdpa": (lambda: Op(F.scaled_dot_product_attention), lambda: tuple(torch.randn(1, 2, 5, 8) for _ in range(3)),
             True),
    "einsum": (lambda: Op(lambda a, b: torch.einsum("bij,bkj->bik", a, b)),
               lambda: (torch.randn(2, 5, 8), torch.randn(2, 6, 8)), True),
    "cdist_p2": (lambda: Op(lambda a, b: torch.cdist(a, b) * 2), lambda: (torch.randn(30, 8), torch.randn(27, 8)),
                 False),
    "conv3d": (lambda: nn.Conv3d(2, 3, 3).eval(), lambda: (torch.randn(1, 2, 5, 5, 5),), True),
    "padded_conv3d": (lambda: nn.Conv3d(2, 3, 3, padding=1, padding_mode="replicate").eval(),
                      lambda: (torch.randn(1, 2, 5, 5, 5),), False),
    "conv3d_after_f_pad": (lambda: nn.Sequential(nn.ReflectionPad3d(1), nn.Conv3d(2, 3, 3)).eval(),
                           lambda: (torch.randn(1, 2, 4, 4, 4),), False),
    "bf16_mlp": (lambda: _mlp(torch.bfloat16), lambda: (torch.randn(4, 16, dtype=torch.bfloat16),), True),
    "bf16_convnet": (lambda: _convnet(torch.bfloat16), lambda: (torch.randn(2, 3, 8, 8, dtype=torch.bfloat16),),
                     True),
    "bf16_elementwise": (lambda: Op(lambda x: (x.sigmoid() * 3).tanh() + x.exp()),
                         lambda: (torch.randn(4, 16, dtype=torch.bfloat16),), True),
}


@pytest.mark.parametrize("name", sorted(REFUSED_ON_TURING))
def test_turing_runs_fp32_gemm_conv3d_and_bf16_in_pytorch(name):
    make_model, make_inputs, nothing_left = REFUSED_ON_TURING[name]
    torch.manual_seed(0)
    model, inputs = make_model(), make_inputs()
    y = compile_and_run(model, *inputs, min_block_size=1, target_compute_capabilities=TURING)
    with torch.no_grad():
        expected = model(*inputs)
    tol = 2e-2 if expected.dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(y, expected, atol=tol, rtol=tol)
    assert y.abs().sum() > 0
    ops = region_ops(regions())
    assert not ops & GEMM_OPS
    if "conv3d" in name:
        assert aten.convolution.default not in ops
    assert all(r.engine is not None for r in regions())  # whatever is left builds for SM 7.5
    if nothing_left:
        assert regions() == []


def _cdist(p, rows):
    return (lambda: Op(lambda a, b: torch.cdist(a, b, p=p) + 1),
            lambda: (torch.randn(rows, 8), torch.randn(rows - 1, 8)), {aten.sub.Tensor})


KEPT_ON_TURING = {
    # name: (model, inputs, ops that must be inside a built region)
    "fp16_mm": (lambda: Op(lambda x, w: torch.relu(x @ w), torch.randn(16, 8).half()),
                lambda: (torch.randn(4, 16).half(),), {aten.mm.default}),
    "fp16_linear": (lambda: _mlp(torch.float16), lambda: (torch.randn(4, 16).half(),), {aten.addmm.default}),
    "conv2d": (_convnet, lambda: (torch.randn(2, 3, 8, 8),), {aten.convolution.default}),
    "fp16_conv_transpose3d": (lambda: nn.Sequential(nn.ConvTranspose3d(2, 3, 2, stride=2), nn.ReLU()).eval().half(),
                              lambda: (torch.randn(1, 2, 3, 3, 3).half(),), {aten.convolution.default}),
    "cdist_p1": _cdist(1.0, 30),
    "cdist_p2_few_rows": _cdist(2.0, 20),
}


@pytest.mark.parametrize("name", sorted(KEPT_ON_TURING))
def test_turing_keeps_what_it_can_run(name):
    make_model, make_inputs, ops = KEPT_ON_TURING[name]
    torch.manual_seed(0)
    model, inputs = make_model(), make_inputs()
    y = compile_and_run(model, *inputs, min_block_size=1, target_compute_capabilities=TURING)
    with torch.no_grad():
        expected = model(*inputs)
    tol = 1e-2 if expected.dtype == torch.float16 else 1e-4
    torch.testing.assert_close(y, expected, atol=tol, rtol=tol)
    assert y.abs().sum() > 0
    built = [r for r in regions() if r.engine is not None]
    assert built and all(r.kind == "onnxruntime" for r in built)  # no GPU here: ONNX Runtime runs them
    assert ops <= region_ops(built)


# ---- the builder as oracle over the zoo ---------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("entry", ZOO, ids=[e.name for e in ZOO])
def test_zoo_regions_build_for_every_target_set(entry, dtype):
    """A region that TensorRT-RTX 1.7's builder rejects for a declared target is a policy bug."""
    torch.manual_seed(0)
    model = entry.model().eval().to(dtype)
    aten_gm = lowered(model, *entry.inputs(dtype))
    exports: dict[tuple[str, ...], bytes | None] = {}  # one export per distinct region
    plans = {}
    for targets in TARGET_SETS:
        p = plans[str(targets)] = plan(aten_gm, targets)
        assert {name for name, _op in p.eager_ops} <= set(p.reasons)  # every node left in PyTorch says why
        turing_reasons = {r.rule for r in p.reasons.values()} & TURING_RULES
        assert bool(turing_reasons) == ((7, 5) in targets and dtype in entry.turing_refuses), p.reasons
        for name in p.regions:
            region = getattr(p.graph_module, name)
            key = tuple(n.name for n in region.graph.nodes)
            if key not in exports:
                try:
                    exports[key] = export_region(region).model
                except BuildError:
                    exports[key] = None  # an export failure is the bridge's (the region runs in PyTorch)
            model_bytes = exports[key]
            if model_bytes is None:
                continue
            missed = onnx_refusals(onnx.load_from_string(model_bytes), tuple(map(tuple, targets)))
            assert not missed, f"the ATen table missed what the ONNX screen caught: {missed}"
            _engine.build(model_bytes, tuple(map(tuple, targets)), {})  # raises BuildError: a policy bug
    assert any(v is not None for v in exports.values()), "nothing of the model was built"
    if dtype in entry.turing_refuses:  # without a Turing target, what Turing refused stays in regions
        refused_on_turing = {n for n, r in plans[str(TURING)].reasons.items() if r.rule in TURING_RULES}
        assert refused_on_turing <= region_nodes(plans[str(AMPERE)])


# ---- GPU: the lowering on CUDA picks other SDPA kernels; they are GEMMs too ---------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_gpu_sdpa_and_conv3d_lowered_on_cuda_are_judged(dtype):
    q = torch.randn(1, 2, 64, 32, device="cuda", dtype=dtype)
    gm = lowered(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2, q, q, q)
    judged = verdicts(gm, TURING)
    attention = [n for n in judged if "attention" in str(n.target)]
    assert attention, gm.graph
    for node in attention:
        assert op_family(node.target._schema.name.split("::")[-1]) == "gemm", node.target
        if dtype == torch.float32:
            assert judged[node] is not None, node.target
    conv = nn.Conv3d(2, 3, 3).eval().to("cuda", dtype)
    gm = lowered(conv, torch.randn(1, 2, 5, 5, 5, device="cuda", dtype=dtype))
    assert {r.rule for r in verdicts(gm, TURING).values() if r} == {"conv3d-turing"}


@pytest.mark.gpu
@pytest.mark.parametrize("entry", [e for e in ZOO if e.name in ("mlp", "self_attention", "conv3d")],
                         ids=lambda e: e.name)
def test_gpu_fp32_models_run_on_tensorrt_rtx_without_a_turing_target(entry):
    """No declared target: the policy judges for this GPU, so FP32 GEMMs and 3D convolutions stay."""
    torch.manual_seed(0)
    model = entry.model().eval().cuda()
    inputs = [x.cuda() for x in entry.inputs(torch.float32)]
    y = compile_and_run(model, *inputs, min_block_size=1, runtime="tensorrt_rtx")
    with torch.no_grad():
        torch.testing.assert_close(y, model(*inputs), atol=1e-2, rtol=1e-2)  # TF32 in the engine
    assert y.abs().sum() > 0
    built = [r for r in regions() if r.engine is not None]
    assert built and all(r.kind == "tensorrt_rtx" for r in built)
    assert not any(r.rule in TURING_RULES for g in _LAST for r in g.plan.reasons.values())
