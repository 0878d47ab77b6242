"""ONNX screen: judge an exported region as TensorRT-RTX will see it, before building it.

The ATen-level policy (`_policy.RULES`) decides the partition. Two things only show after
export: an op that the exporter turns into a GEMM or a convolution the ATen table did not
classify, and ONNX nodes that TensorRT-RTX's ONNX parser cannot take. The screen applies the
same family rules to the ONNX nodes and asks the parser (`supports_model_v2`,
`supports_operator`) instead of guessing. Each refused ONNX node is mapped back to the FX node
it came from: the exporter records the source line of the region's generated code in the
node's `pkg.torch.onnx.stack_trace`, and that line starts with the FX node's name. The backend
then keeps those FX nodes in PyTorch and partitions again (`RegionRefused`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Iterator

import onnx
import torch

from .. import _trt
from .._errors import RegionRefused
from .._types import Reason, Target
from ..build.engine import Network
from ..export.model import OnnxModel, as_bytes
from ..plan.policy import RULES, NodeFacts, Rule, conv_traits, first_match

log = logging.getLogger("rtx_backend")

ONNX_FAMILIES = {
    "MatMul": "gemm", "Gemm": "gemm", "Einsum": "gemm", "MatMulInteger": "gemm", "QLinearMatMul": "gemm",
    "Attention": "gemm", "Conv": "conv", "ConvInteger": "conv", "QLinearConv": "conv",
    "DeformConv": "conv", "ConvTranspose": "conv_transpose",
}
_P = onnx.TensorProto
_ONNX_DTYPES: dict[int, torch.dtype] = {
    _P.FLOAT: torch.float32, _P.FLOAT16: torch.float16, _P.BFLOAT16: torch.bfloat16,
    _P.DOUBLE: torch.float64, _P.COMPLEX64: torch.complex64, _P.COMPLEX128: torch.complex128,
    _P.BOOL: torch.bool, _P.INT8: torch.int8, _P.UINT8: torch.uint8, _P.INT32: torch.int32,
    _P.INT64: torch.int64, _P.INT16: torch.int16, _P.UINT16: torch.uint16, _P.UINT32: torch.uint32,
    _P.UINT64: torch.uint64,
}
for _name, _torch_name in (("FLOAT8E4M3FN", "float8_e4m3fn"), ("FLOAT8E5M2", "float8_e5m2"),
                           ("FLOAT8E4M3FNUZ", "float8_e4m3fnuz"), ("FLOAT8E5M2FNUZ", "float8_e5m2fnuz"),
                           ("FLOAT4E2M1", "float4_e2m1fn_x2")):
    if hasattr(_P, _name) and hasattr(torch, _torch_name):
        _ONNX_DTYPES[getattr(_P, _name)] = getattr(torch, _torch_name)
_UNKNOWN_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})  # unknown: assume the worst
_STACK_TRACE = "pkg.torch.onnx.stack_trace"
_FRAME = re.compile(r'File "<eval_with_key>[^"]*", line \d+')
_ASSIGNMENT = re.compile(r"^\s*([A-Za-z_]\w*)\s*=")
_FX_NODE_KEY = "pkg.torch.onnx.fx_node"
_FX_NODE = re.compile(r"^%([A-Za-z_]\w*) :")  # how torch.fx formats a node: "%addmm : [num_users=1] = ..."


def check_region(
    model: bytes | OnnxModel,
    fx_names: Collection[str],
    targets: tuple[Target, ...],
    *,
    network: Network | None = None,
) -> None:
    """Raise RegionRefused naming the region's FX nodes that TensorRT-RTX cannot take, if any.
    `network`: the model already parsed for the build (its parser's verdict is reused)."""
    refused = screen_region(model, fx_names, targets, network=network)
    if refused:
        log.info("trtrtx: the ONNX screen keeps %d node(s) in PyTorch: %s", len(refused),
                 "; ".join(f"{k}: {v}" for k, v in refused.items()))
        raise RegionRefused(refused)


def screen_region(
    model: bytes | OnnxModel,
    fx_names: Collection[str],
    targets: tuple[Target, ...],
    *,
    rules: tuple[Rule, ...] = RULES,
    network: Network | None = None,
) -> dict[str, Reason]:
    """FX node name -> Reason for each node of the region (named in `fx_names`) that the ONNX
    screen refuses. A refused ONNX node that maps to none of them refuses the whole region."""
    # the rules read types, shapes and node metadata only: the weightless skeleton has them all
    skeleton = model.skeleton if isinstance(model, OnnxModel) else model
    proto = onnx.load_from_string(skeleton if skeleton is not None else as_bytes(model))
    refusals = onnx_refusals(proto, targets, rules)
    if _trt.available() and not (network is not None and not network.errors):
        for index, reason in parser_refusals(as_bytes(model), proto).items():
            refusals.setdefault(index, reason)
    out: dict[str, Reason] = {}
    unmapped: list[Reason] = []
    for index, reason in sorted(refusals.items()):
        name = fx_node_name(proto.graph.node[index])
        if name is not None and name in fx_names:
            out.setdefault(name, reason)
        else:
            unmapped.append(reason)
    if unmapped:
        first = unmapped[0]
        why = Reason(first.rule, f"{first.message}; the ONNX node maps to no FX node, so the whole "
                     "region stays in PyTorch", first.target)
        for name in fx_names:
            out.setdefault(name, why)
    return out


def onnx_refusals(
    proto: onnx.ModelProto, targets: tuple[Target, ...], rules: tuple[Rule, ...] = RULES
) -> dict[int, Reason]:
    """Top-level ONNX node index -> Reason, for the family rules (GEMM, convolutions) of the table.

    Dtype-only rules were applied to the ATen graph; inside an exported region the exporter's own
    casts are an implementation detail that TensorRT-RTX handles.
    """
    family_rules = tuple(r for r in rules if r.families is not None)
    types = _value_types(proto.graph)
    out: dict[int, Reason] = {}
    for index, node in enumerate(proto.graph.node):
        facts = onnx_facts(node, types)
        if facts.family == "other":
            continue
        match = first_match(facts, targets or (None,), family_rules)
        if match is not None:
            rule, target = match
            dtypes = ", ".join(sorted(str(d).removeprefix("torch.") for d in facts.input_dtypes))
            out[index] = Reason(rule.name, f"{rule.message} (ONNX {node.op_type}, {dtypes})", target)
    return out


def onnx_facts(node: onnx.NodeProto, types: dict[str, tuple[int, int | None]]) -> NodeFacts:
    """What the policy table needs of one ONNX node; unknown dtypes or ranks fail closed."""
    family = ONNX_FAMILIES.get(node.op_type, "other") if node.domain in ("", "ai.onnx") else "other"
    if family == "other":
        return NodeFacts("other", frozenset(), frozenset(), None)
    operands = list(node.input) if node.op_type == "Einsum" else list(node.input[:3 if node.op_type == "Attention" else 2])
    dtypes: set[torch.dtype] = set()
    for name in filter(None, operands):
        elem, _rank = types.get(name, (0, None))
        dtypes |= {_ONNX_DTYPES[elem]} if elem in _ONNX_DTYPES else _UNKNOWN_DTYPES
    rank = None
    if family != "gemm" and len(node.input) > 1:
        weight_rank = types.get(node.input[1], (0, None))[1]
        rank = weight_rank - 2 if weight_rank is not None else None
    traits: frozenset[str] = frozenset()
    if family == "conv_transpose":
        attrs = {a.name: list(a.ints) for a in node.attribute}
        traits = conv_traits(attrs.get("strides", [1]), attrs.get("dilations", [1]))
    return NodeFacts(family, frozenset(dtypes), frozenset(dtypes), rank, traits)


def parser_refusals(model: bytes, proto: onnx.ModelProto) -> dict[int, Reason]:
    """Top-level ONNX node index -> Reason, for what TensorRT-RTX's ONNX parser cannot take."""
    trt = _trt.trt()
    builder = trt.Builder(_trt.logger())
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, _trt.logger())
    out: dict[int, Reason] = {}
    for index, node in enumerate(proto.graph.node):
        for op_type in _op_types(node):
            if not parser.supports_operator(op_type):
                out.setdefault(index, Reason("parser-unsupported", f"TensorRT-RTX's ONNX parser has no {op_type}"))
    if hasattr(parser, "supports_model_v2") and not parser.supports_model_v2(model):
        for i in range(parser.num_errors):
            error = parser.get_error(i)
            if not 0 <= error.node() < len(proto.graph.node):
                # Names no node: the build reports it, and the region falls back as a whole.
                log.debug("trtrtx: TensorRT-RTX's ONNX parser: %s", error.desc())
                continue
            message = f"TensorRT-RTX's ONNX parser rejects {error.node_operator()}: {error.desc()}"
            out.setdefault(error.node(), Reason("parser-unsupported", message))
    return out


def fx_node_name(node: onnx.NodeProto) -> str | None:
    """The FX node of the exported region that an ONNX node came from: from its source line when
    torch.export traced the region (the exported program's nodes have names of their own), else
    the node the exporter translated, which is the region's own (export/program.py keeps names
    and records no stack trace)."""
    props = {p.key: p.value for p in node.metadata_props}
    trace = props.get(_STACK_TRACE, "")
    lines = trace.splitlines()
    for i in range(len(lines) - 2, -1, -1):  # the innermost frame of the region's generated code
        if _FRAME.search(lines[i]):
            match = _ASSIGNMENT.match(lines[i + 1])
            return match.group(1) if match else None
    if trace:
        return None
    match = _FX_NODE.match(props.get(_FX_NODE_KEY, ""))
    return match.group(1) if match else None


def _op_types(node: onnx.NodeProto) -> Iterator[str]:
    """The node's op type and those of its subgraphs (If/Loop/Scan bodies), default domain only."""
    if node.domain in ("", "ai.onnx"):
        yield node.op_type
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for graph in graphs:
            for inner in graph.node:
                yield from _op_types(inner)


def _value_types(graph: onnx.GraphProto) -> dict[str, tuple[int, int | None]]:
    """Value name -> (ONNX elem type, rank or None) from the graph's declared types."""
    out: dict[str, tuple[int, int | None]] = {}
    for value in [*graph.input, *graph.output, *graph.value_info]:
        tensor = value.type.tensor_type
        out[value.name] = (tensor.elem_type, len(tensor.shape.dim) if tensor.HasField("shape") else None)
    for init in graph.initializer:
        out[init.name] = (init.data_type, len(init.dims))
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                    out[node.output[0]] = (attr.t.data_type, len(attr.t.dims))
    return out
