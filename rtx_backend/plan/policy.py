"""Capability policy: which lowered ATen nodes TensorRT-RTX can serve on every declared target.

One table (`RULES`) keyed by op family, dtype, spatial rank and target compute capability.
It is applied to the lowered ATen graph, so fused and decomposed ops are judged as what they
are (a `linear` arrives as `addmm`, an `einsum` as `bmm`, attention as the fused SDPA op). The
same table judges each exported region's ONNX nodes (`build/screen.py`), which catches what only
becomes a GEMM or a convolution on export. The policy fails closed: a node whose dtype or
shape is unknown stays in PyTorch. Every refusal is kept as a `Reason` (rule, target, message)
for `explain` and the logs.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.fx import Node
from torch.fx.passes.operator_support import OperatorSupportBase

from .._types import Reason, Target
from ..lower import exporter_ops as _exporter_ops
from ..lower.lowering import unfusable


@dataclasses.dataclass(frozen=True)
class NodeFacts:
    """What the policy needs to know about one node (ATen, or ONNX in the screen)."""

    family: str  # "gemm", "conv", "conv_transpose" or "other"
    input_dtypes: frozenset[torch.dtype]  # dtypes of the tensors the node reads
    dtypes: frozenset[torch.dtype]  # every tensor dtype the node reads or writes
    spatial_rank: int | None  # convolutions only; None there means unknown
    traits: frozenset[str] = frozenset()  # e.g. "strided", "dilated" (convolutions)


@dataclasses.dataclass(frozen=True)
class Rule:
    """Nodes matching family/dtypes/ranks are refused for targets below `below` (or all)."""

    name: str
    message: str
    families: frozenset[str] | None = None  # None: every family
    dtypes: frozenset[torch.dtype] | None = None  # None: every dtype
    spatial_ranks: frozenset[int] | None = None  # None: every rank
    below: Target | None = None  # refused on targets < below; None: on every target
    traits: frozenset[str] = frozenset()  # the node must have all of them

    def matches(self, facts: NodeFacts, target: Target | None) -> bool:
        if self.below is not None and (target is None or target >= self.below):
            return False
        if not self.traits <= facts.traits:
            return False
        if self.families is not None and facts.family not in self.families:
            return False
        if (self.spatial_ranks is not None and facts.spatial_rank is not None
                and facts.spatial_rank not in self.spatial_ranks):
            return False  # an unknown rank matches: fail closed
        if self.dtypes is None:
            return True
        # Family rules judge the operands (an FP16 GEMM accumulating into FP32 is an FP16 GEMM);
        # dtype-only rules judge every tensor the node touches.
        if self.families is not None:
            return bool(facts.input_dtypes & self.dtypes)
        return bool(facts.dtypes & self.dtypes)


def _dtypes(*names: str) -> frozenset[torch.dtype]:
    return frozenset(getattr(torch, n) for n in names if hasattr(torch, n))


FP8 = _dtypes("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
FP4 = _dtypes("float4_e2m1fn_x2")
COMPLEX = _dtypes("complex32", "complex64", "complex128")
FP32 = _dtypes("float32")
TURING_AND_BELOW: Target = (8, 0)  # rules with below=TURING_AND_BELOW hold for SM 7.5
GEMM, CONV, CONV_TRANSPOSE = frozenset({"gemm"}), frozenset({"conv"}), frozenset({"conv_transpose"})

RULES: tuple[Rule, ...] = (
    Rule("complex", "TensorRT-RTX has no complex dtypes", dtypes=COMPLEX),
    # Under dynamic shapes torch.compile passes a module's Python floats (eps, an attention
    # scale) as 0-d float64 tensors, and the arithmetic on them is float64. TensorRT-RTX cannot
    # compute it exactly; in PyTorch it is a few scalar ops whose results the regions take as inputs.
    Rule("fp64-scalar", "TensorRT-RTX has no FP64 tensors; this is float64 arithmetic on a scalar (typically a "
         "Python float that torch.compile passes as a tensor under dynamic shapes), kept in PyTorch where it "
         "is exact (a few scalar ops per call). To make such floats constants instead, set "
         "torch._dynamo.config.specialize_float = True", dtypes=_dtypes("float64"), traits=frozenset({"scalar"})),
    Rule("fp64", "TensorRT-RTX has no FP64 tensors", dtypes=_dtypes("float64")),
    Rule("fp8", "FP8 needs SM 8.9 or newer", dtypes=FP8, below=(8, 9)),
    Rule("fp4", "FP4 needs SM 12.0 or newer", dtypes=FP4, below=(12, 0)),
    Rule("bf16-turing", "Turing has no bfloat16", dtypes=_dtypes("bfloat16"), below=TURING_AND_BELOW),
    # TensorRT-RTX 1.7's builder refuses these for SM 7.5 ("Cannot compile operation ... for
    # Turing (SM75)"); 1.6 builds FP32 GEMMs with dynamic shapes that return zeros there.
    Rule("fp32-gemm-turing", "TensorRT-RTX cannot run FP32 GEMMs on Turing",
         families=GEMM, dtypes=FP32, below=TURING_AND_BELOW),
    Rule("conv3d-turing", "TensorRT-RTX cannot run forward 3D convolutions on Turing",
         families=CONV, spatial_ranks=frozenset({3}), below=TURING_AND_BELOW),
    Rule("fp32-conv-transpose3d-turing", "TensorRT-RTX cannot run FP32 3D deconvolutions on Turing",
         families=CONV_TRANSPOSE, dtypes=FP32, spatial_ranks=frozenset({3}), below=TURING_AND_BELOW),
    # The builder refuses on every target: "Strided & Dilated Deconv are currently not supported".
    Rule("strided-dilated-conv-transpose", "TensorRT-RTX cannot build transposed convolutions that are "
         "both strided and dilated", families=CONV_TRANSPOSE, traits=frozenset({"strided", "dilated"})),
)

# Op families by ATen op name (the packet, e.g. "mm"). Anything reaching a matrix multiply is a
# GEMM, whatever backend-specific spelling the lowering picked (SDPA is
# _scaled_dot_product_flash_attention_for_cpu on CPU, *_efficient_attention on CUDA, ...).
_GEMM = re.compile(
    r"^(mm|bmm|addmm|addbmm|baddbmm|addmv|mv|dot|vdot|inner|linear|einsum|tensordot|bilinear|_trilinear|"
    r"_euclidean_dist|_transformer_encoder_layer_fwd|fbgemm_linear\w*|\w*_mm(_\w*)?|\w*matmul\w*|"
    r"\w*_addmm\w*|\w*_linear|\w*_dot|\w*_multi_dot|\w*scaled_dot_product\w*|\w*_attention\w*)$"
)
_CONV_TRANSPOSE = re.compile(
    r"^(conv_transpose[123]d|slow_conv_transpose[23]d|(cudnn|miopen|mkldnn)_convolution_transpose)$"
)
_CONV = re.compile(
    r"^(_?convolution|convolution_overrideable|_convolution_mode|conv[123]d|conv_tbc|_conv_depthwise2d|"
    r"conv_depthwise3d|(cudnn|miopen|mkldnn)(_depthwise)?_convolution|_nnpack_spatial_convolution|"
    r"thnn_conv2d|_slow_conv2d_forward|slow_conv3d(_forward)?|slow_conv_dilated[23]d)$"
)
_CONVOLUTION_TRANSPOSED_ARG = 6  # aten.convolution(input, weight, bias, stride, padding, dilation, transposed, ...)


def op_names(target: Any) -> tuple[str, str]:
    """(packet name, overload name) of an OpOverload, e.g. ('aten::add', 'aten::add.Tensor')."""
    schema = target._schema
    overload = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
    return schema.name, overload


def op_family(name: str) -> str:
    """'gemm', 'conv', 'conv_transpose' or 'other' for an ATen op name without namespace."""
    if _GEMM.match(name):
        return "gemm"
    if _CONV_TRANSPOSE.match(name):
        return "conv_transpose"
    if _CONV.match(name):
        return "conv"
    return "other"


def _tensor_vals(values: Iterable[Any]) -> list[Any]:
    out = []
    for value in values:
        if isinstance(value, (list, tuple)):
            out.extend(_tensor_vals(value))
        elif isinstance(value, torch.Tensor):
            out.append(value)
    return out


def _arg_vals(node: Node) -> list[Any]:
    vals = []
    for arg in list(node.args) + list(node.kwargs.values()):
        items = arg if isinstance(arg, (list, tuple)) else [arg]
        for item in items:
            if isinstance(item, Node):
                vals.append(item.meta.get("val"))
    return vals


def _arg(node: Node, index: int, name: str, default: Any) -> Any:
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


def _data_dependent(t: torch.Tensor) -> bool:
    for size in t.shape:
        if isinstance(size, torch.SymInt) and any(
            str(s).startswith("u") for s in size.node.expr.free_symbols
        ):
            return True
    return False


def node_facts(node: Node) -> NodeFacts | Reason:
    """Facts of a call_function node with known tensor metadata, or the reason it has none."""
    outputs = _tensor_vals([node.meta.get("val")])
    if not outputs:
        return Reason("unknown-metadata", "output dtype/shape unknown or not a tensor (fail closed)")
    if any(_data_dependent(t) for t in outputs):
        return Reason("data-dependent-shape", "output shape depends on tensor values")
    if node.target is operator.getitem:  # judged by what it selects; its producer is judged itself
        return NodeFacts("other", frozenset(), frozenset(t.dtype for t in outputs), None)
    raw_inputs = _arg_vals(node)
    if any(v is None for v in raw_inputs):
        return Reason("unknown-metadata", "an input's dtype/shape is unknown (fail closed)")
    inputs = _tensor_vals(raw_inputs)
    input_dtypes = frozenset(t.dtype for t in inputs)
    dtypes = input_dtypes | frozenset(t.dtype for t in outputs)
    name = node.target._schema.name.split("::")[-1]  # type: ignore[union-attr]
    family, rank = op_family(name), None
    if family == "other" and all(t.dim() == 0 for t in (*inputs, *outputs)):
        return NodeFacts(family, input_dtypes, dtypes, rank, frozenset({"scalar"}))
    if family in ("conv", "conv_transpose"):
        if name in ("convolution", "_convolution", "convolution_overrideable") and bool(
            _arg(node, _CONVOLUTION_TRANSPOSED_ARG, "transposed", False)
        ):
            family = "conv_transpose"
        weight = inputs[1] if len(inputs) > 1 else inputs[0]
        rank = weight.dim() - 2 if name != "conv_tbc" else 1
        if family == "conv_transpose":
            return NodeFacts(family, input_dtypes, dtypes, rank, _conv_transpose_traits(node, name))
    return NodeFacts(family, input_dtypes, dtypes, rank)


# (stride, dilation) argument positions of the transposed-convolution ops.
_STRIDE_DILATION = {"convolution": (3, 5), "_convolution": (3, 5), "convolution_overrideable": (3, 5),
                    "conv_transpose1d": (3, 7), "conv_transpose2d": (3, 7), "conv_transpose3d": (3, 7)}


def conv_traits(stride: Any, dilation: Any) -> frozenset[str]:
    """"strided" / "dilated" where any step is above 1; unknown values count as both (fail closed)."""
    traits = set()
    for trait, values in (("strided", stride), ("dilated", dilation)):
        values = values if isinstance(values, (list, tuple)) else [values]
        if any(not isinstance(v, int) or v > 1 for v in values):
            traits.add(trait)
    return frozenset(traits)


def _conv_transpose_traits(node: Node, name: str) -> frozenset[str]:
    if name not in _STRIDE_DILATION:
        return frozenset({"strided", "dilated"})  # an op whose arguments we do not know: fail closed
    stride_at, dilation_at = _STRIDE_DILATION[name]
    return conv_traits(_arg(node, stride_at, "stride", 1), _arg(node, dilation_at, "dilation", 1))


def first_match(
    facts: NodeFacts, targets: Iterable[Target | None], rules: Iterable[Rule]
) -> tuple[Rule, Target | None] | None:
    """The first rule refusing a node with these facts on one of the targets, with that target."""
    rules = tuple(rules)
    for target in targets:
        for rule in rules:
            if rule.matches(facts, target):
                return rule, target
    return None


class CapabilitySupport(OperatorSupportBase):
    """OperatorSupport for the partitioner: the policy table for the given targets.

    `refused` names nodes already known to stay in PyTorch (from the ONNX screen of an earlier
    partition), with their reasons. `reasons` maps node name -> Reason for every refused node.
    """

    def __init__(
        self,
        targets: tuple[Target, ...],
        torch_executed_ops: frozenset[str] = frozenset(),
        rules: tuple[Rule, ...] = RULES,
        refused: Mapping[str, Reason] | None = None,
    ) -> None:
        self.targets = targets
        self.torch_executed_ops = torch_executed_ops
        self.rules = rules
        self.refused = dict(refused or {})
        self.reasons: dict[str, Reason] = {}

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: Node) -> bool:
        reason = self.judge(node)
        if reason is None:
            self.reasons.pop(node.name, None)
            return True
        self.reasons[node.name] = reason
        return False

    def judge(self, node: Node) -> Reason | None:
        """None if TensorRT-RTX can serve the node on every target, else why not."""
        if node.name in self.refused:
            return self.refused[node.name]
        if node.op != "call_function":
            return Reason("not-an-op", f"{node.op} nodes are not lowered")
        if node.target is operator.getitem:
            overload = "getitem"
        elif not isinstance(node.target, torch._ops.OpOverload):
            return Reason("not-aten", f"{getattr(node.target, '__name__', node.target)} is not an ATen op")
        else:
            packet, overload = op_names(node.target)
            if packet in self.torch_executed_ops or overload in self.torch_executed_ops:
                return Reason("torch_executed_ops", f"{overload} is listed in torch_executed_ops")
            if node.target._schema.is_mutable:
                return Reason("mutation", f"{overload} mutates its inputs")
            if not _exporter_ops.is_translated(node.target) and not unfusable(node):
                return Reason("not-exportable", f"the ONNX exporter has no translation for {overload}")
        facts = node_facts(node)
        if isinstance(facts, Reason):
            return facts
        match = first_match(facts, self.targets or (None,), self.rules)
        if match is not None:
            rule, target = match
            dtypes = ", ".join(sorted(str(d).removeprefix("torch.") for d in facts.dtypes))
            return Reason(rule.name, f"{rule.message} ({overload}, {dtypes})", target)
        return None
