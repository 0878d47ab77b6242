"""Capability policy: which lowered ATen nodes TensorRT-RTX can serve on every declared target.

One table (`RULES`) keyed by op family, dtype, spatial rank and target compute capability.
It is applied to the lowered ATen graph, so fused and decomposed ops are judged as what they
are. The policy fails closed: a node whose dtype or shape is unknown stays in PyTorch. Every
refusal is recorded as a `Reason` (rule, target, message) for `explain` and the logs.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch.fx import Node
from torch.fx.passes.operator_support import OperatorSupportBase

from ._options import Target

ANY_TARGET: Target = (0, 0)  # key for rules that hold whatever the target


@dataclasses.dataclass(frozen=True)
class Reason:
    """Why a node stays in PyTorch."""

    rule: str
    message: str
    target: Target | None = None

    def __str__(self) -> str:
        where = f" [target SM{self.target[0]}.{self.target[1]}]" if self.target else ""
        return f"{self.rule}: {self.message}{where}"


@dataclasses.dataclass(frozen=True)
class NodeFacts:
    """What the policy needs to know about one ATen node."""

    family: str  # "gemm", "conv", "conv_transpose" or "other"
    compute_dtype: torch.dtype  # dtype of the first tensor input (or the output)
    dtypes: frozenset[torch.dtype]  # every tensor dtype the node reads or writes
    spatial_rank: int | None  # convolutions only


@dataclasses.dataclass(frozen=True)
class Rule:
    """Nodes matching family/dtypes/ranks are refused for targets below `below` (or all)."""

    name: str
    message: str
    families: frozenset[str] | None = None  # None: every family
    dtypes: frozenset[torch.dtype] | None = None  # None: every dtype
    spatial_ranks: frozenset[int] | None = None  # None: every rank
    below: Target | None = None  # refused on targets < below; None: on every target

    def matches(self, facts: NodeFacts, target: Target | None) -> bool:
        if self.below is not None and (target is None or target >= self.below):
            return False
        if self.families is not None and facts.family not in self.families:
            return False
        if self.spatial_ranks is not None and facts.spatial_rank not in self.spatial_ranks:
            return False
        if self.dtypes is None:
            return True
        # Family rules judge the compute dtype (an FP16 GEMM accumulating in FP32 is FP16);
        # dtype-only rules judge every tensor the node touches.
        if self.families is not None:
            return facts.compute_dtype in self.dtypes
        return bool(facts.dtypes & self.dtypes)


def _dtypes(*names: str) -> frozenset[torch.dtype]:
    return frozenset(getattr(torch, n) for n in names if hasattr(torch, n))


FP8 = _dtypes("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
FP4 = _dtypes("float4_e2m1fn_x2")
COMPLEX = _dtypes("complex32", "complex64", "complex128")
TURING_AND_BELOW: Target = (8, 0)

RULES: tuple[Rule, ...] = (
    Rule("complex", "TensorRT-RTX has no complex dtypes", dtypes=COMPLEX),
    Rule("fp64", "TensorRT-RTX has no FP64 tensors", dtypes=_dtypes("float64")),
    Rule("fp8", "FP8 needs SM 8.9 or newer", dtypes=FP8, below=(8, 9)),
    Rule("fp4", "FP4 needs SM 12.0 or newer", dtypes=FP4, below=(12, 0)),
    Rule("bf16-turing", "Turing has no bfloat16", dtypes=_dtypes("bfloat16"), below=TURING_AND_BELOW),
    Rule(
        "fp32-gemm-turing",
        "TensorRT-RTX cannot run FP32 GEMMs on Turing",
        families=frozenset({"gemm"}),
        dtypes=_dtypes("float32"),
        below=TURING_AND_BELOW,
    ),
    Rule(
        "conv3d-turing",
        "TensorRT-RTX cannot run forward 3D convolutions on Turing",
        families=frozenset({"conv"}),
        spatial_ranks=frozenset({3}),
        below=TURING_AND_BELOW,
    ),
)

# Op families by ATen op name (the packet, e.g. "mm"). Anything reaching a matrix multiply is a GEMM.
_GEMM = re.compile(
    r"^(mm|bmm|addmm|addbmm|baddbmm|addmv|matmul|mv|dot|vdot|inner|linear|einsum|tensordot|"
    r"_addmm_activation|_int_mm|_scaled_mm|_weight_int\w*mm\w*|"
    r".*scaled_dot_product.*|.*_attention.*|_native_multi_head_attention|bilinear|_trilinear)$"
)
_CONV = re.compile(r"^(_?convolution|conv[123]d|cudnn_convolution|_conv_depthwise2d|mkldnn_convolution|"
                   r"conv_tbc|_slow_conv2d_forward|slow_conv3d\w*|.*conv_transpose[123]d)$")
CDIST_ROW_THRESHOLD = 25  # above this many rows, cdist's default compute_mode uses a GEMM


def normalize_op_name(item: Any) -> str | None:
    """'aten.relu', 'aten::relu.default', torch.ops.aten.relu -> 'aten::relu[.overload]'."""
    if isinstance(item, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        item = str(item)
    if not isinstance(item, str):
        return None
    text = item.strip().removeprefix("torch.ops.").replace("::", ".")
    parts = text.split(".")
    if len(parts) not in (2, 3) or not all(re.fullmatch(r"\w+", p) for p in parts):
        return None
    name = f"{parts[0]}::{parts[1]}"
    if len(parts) == 3 and parts[2] != "default":
        name += f".{parts[2]}"
    return name


def op_names(target: Any) -> tuple[str, str]:
    """(packet name, overload name) of an OpOverload, e.g. ('aten::add', 'aten::add.Tensor')."""
    schema = target._schema
    overload = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
    return schema.name, overload


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


def _is_cdist_gemm(node: Node, inputs: list[Any]) -> bool:
    """cdist with p=2 computes through a GEMM (compute_mode 1, or 0/None above 25 rows)."""
    p = node.args[2] if len(node.args) > 2 else node.kwargs.get("p", 2.0)
    mode = node.args[3] if len(node.args) > 3 else node.kwargs.get("compute_mode")
    if p != 2:
        return False
    if mode == 1:
        return True
    if mode == 2:
        return False
    rows = [t.shape[-2] for t in inputs[:2] if t.dim() >= 2]
    return any(not isinstance(r, int) or r > CDIST_ROW_THRESHOLD for r in rows)


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
    raw_inputs = _arg_vals(node)
    if any(v is None for v in raw_inputs):
        return Reason("unknown-metadata", "an input's dtype/shape is unknown (fail closed)")
    inputs = _tensor_vals(raw_inputs)
    dtypes = frozenset(t.dtype for t in inputs + outputs)
    compute_dtype = (inputs or outputs)[0].dtype
    name = node.target._schema.name.split("::")[-1]  # type: ignore[union-attr]
    family, rank = "other", None
    if name in ("cdist", "_cdist_forward", "_euclidean_dist"):
        family = "gemm" if name == "_euclidean_dist" or _is_cdist_gemm(node, inputs) else "other"
    elif _GEMM.match(name):
        family = "gemm"
    elif _CONV.match(name):
        transposed = "transpose" in name or (
            name in ("convolution", "_convolution") and len(node.args) > 6 and bool(node.args[6])
        )
        weight = inputs[1] if len(inputs) > 1 else inputs[0]
        rank = weight.dim() - 2
        family = "conv_transpose" if transposed else "conv"
    return NodeFacts(family, compute_dtype, dtypes, rank)


def exporter_registry() -> Any:
    return _registry()


@functools.cache
def _registry() -> Any:
    from torch.onnx._internal.exporter import _registration

    return _registration.ONNXRegistry.from_torchlib()


class CapabilitySupport(OperatorSupportBase):
    """OperatorSupport for the partitioner: the policy table for the given targets.

    `reasons` maps node name -> Reason for every refused node (kept for reports).
    """

    def __init__(
        self,
        targets: tuple[Target, ...],
        torch_executed_ops: frozenset[str] = frozenset(),
        rules: tuple[Rule, ...] = RULES,
        extra_checks: tuple[Callable[[Node], Reason | None], ...] = (),
    ) -> None:
        self.targets = targets
        self.torch_executed_ops = torch_executed_ops
        self.rules = rules
        self.extra_checks = extra_checks
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
        if node.op != "call_function":
            return Reason("not-an-op", f"{node.op} nodes are not lowered")
        if node.target is operator.getitem:
            if _tensor_vals([node.meta.get("val")]):
                return None
            return Reason("unknown-metadata", "getitem of a non-tensor value")
        if not isinstance(node.target, torch._ops.OpOverload):
            return Reason("not-aten", f"{getattr(node.target, '__name__', node.target)} is not an ATen op")
        packet, overload = op_names(node.target)
        if packet in self.torch_executed_ops or overload in self.torch_executed_ops:
            return Reason("torch_executed_ops", f"{overload} is listed in torch_executed_ops")
        if node.target._schema.is_mutable:
            return Reason("mutation", f"{overload} mutates its inputs")
        if not exporter_registry().is_registered(node.target):
            return Reason("not-exportable", f"the ONNX exporter has no translation for {overload}")
        facts = node_facts(node)
        if isinstance(facts, Reason):
            return facts
        for target in self.targets or (None,):
            for rule in self.rules:
                if rule.matches(facts, target):
                    return Reason(rule.name, f"{rule.message} ({overload}, {facts.compute_dtype})", target)
        for check in self.extra_checks:
            reason = check(node)
            if reason is not None:
                return reason
        return None
