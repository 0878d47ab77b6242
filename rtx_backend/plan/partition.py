"""Partition: split the ATen graph into TensorRT-RTX regions and the PyTorch rest.

Uses torch.fx's CapabilityBasedPartitioner with the capability policy as its OperatorSupport;
regions with fewer than `min_block_size` compute nodes stay in PyTorch (and say so).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable

import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner, Partition
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from .. import _targets
from .._options import Options
from .._types import Reason
from ..plan.doubles import float32_boundaries
from ..plan.policy import RULES, CapabilitySupport

REGION_PREFIX = "trtrtx_region_"
# Nodes that cost nothing in PyTorch, so they do not count towards min_block_size.
_FREE_OPS = {operator.getitem, torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default,
             torch.ops.aten.t.default, torch.ops.aten.permute.default, torch.ops.aten.expand.default,
             torch.ops.aten.reshape.default, torch.ops.aten.unsqueeze.default,
             torch.ops.aten.squeeze.dim, torch.ops.aten.alias.default}


@dataclasses.dataclass
class PartitionPlan:
    """The fused graph, its region submodule names, and why every other node stays in PyTorch."""

    graph_module: torch.fx.GraphModule
    regions: list[str]
    reasons: dict[str, Reason]
    eager_ops: list[tuple[str, str]]  # (node name, op) of every compute node left in PyTorch


def compute_nodes(nodes: Iterable[torch.fx.Node]) -> int:
    return sum(1 for n in nodes if n.op == "call_function" and n.target not in _FREE_OPS)


def partition(
    gm: torch.fx.GraphModule, support: CapabilitySupport, min_block_size: int
) -> PartitionPlan:
    _one_constant_per_use(gm)
    partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
    proposed: list[Partition] = partitioner.propose_partitions()
    for part in proposed:
        for node in _drop_weight_only_outputs(part):
            support.reasons[node.name] = Reason(
                "weights-only", "computed from weights alone for an op left in PyTorch"
            )
    proposed = [p for p in proposed if p.nodes]
    _adopt_constants(proposed)
    kept = []
    for part in proposed:
        count = compute_nodes(part.nodes)
        if count >= min_block_size and count > 0:
            kept.append(part)
            continue
        for node in part.nodes:
            support.reasons[node.name] = Reason(
                "min_block_size",
                f"its region has {count} compute node(s), fewer than min_block_size={min_block_size}",
            )
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    kept.sort(key=lambda p: min(order[n] for n in p.nodes))
    fused = fuse_by_partitions(
        gm, [dict.fromkeys(p.nodes) for p in kept], prefix=REGION_PREFIX, always_return_tuple=True
    )
    regions = [n.target for n in fused.graph.nodes if n.op == "call_module" and str(n.target).startswith(REGION_PREFIX)]
    eager = [
        (n.name, str(n.target))
        for n in fused.graph.nodes
        if n.op == "call_function" and n.target is not operator.getitem
    ]
    reasons = {name: support.reasons[name] for name, _ in eager if name in support.reasons}
    return PartitionPlan(fused, [str(r) for r in regions], reasons, eager)



def _one_constant_per_use(gm: torch.fx.GraphModule) -> None:
    """Give every user of a constant (get_attr) its own node, so each region can own its weights."""
    for node in list(gm.graph.nodes):
        if node.op != "get_attr" or len(node.users) <= 1:
            continue
        for user in list(node.users)[1:]:
            with gm.graph.inserting_before(user):
                twin = gm.graph.get_attr(node.target)
            twin.meta = dict(node.meta)
            user.replace_input_with(node, twin)


def _drop_weight_only_outputs(part: Partition) -> list[torch.fx.Node]:
    """Remove nodes computed from constants alone (e.g. a weight's transpose) that feed no other
    node of the region: in the region they would only turn a weight into an engine output."""
    weight_only: set[torch.fx.Node] = set()
    changed = True
    while changed:
        changed = False
        for node in list(part.nodes):
            inputs = node.all_input_nodes
            if inputs and all(i.op == "get_attr" or i in weight_only for i in inputs):
                if node not in weight_only:
                    weight_only.add(node)
                    changed = True
    dropped: list[torch.fx.Node] = []
    changed = True
    while changed:
        changed = False
        for node in [n for n in part.nodes if n in weight_only]:
            if not any(u in part.nodes for u in node.users):
                part.remove_node(node)
                dropped.append(node)
                changed = True
    return dropped


def _adopt_constants(partitions: list[Partition]) -> None:
    """Move each constant into its user's region: weights become engine constants, not inputs."""
    for part in partitions:
        for node in list(part.nodes):
            for arg in node.all_input_nodes:
                if arg.op == "get_attr" and len(arg.users) == 1:
                    part.add_node(arg)


def plan_graph(
    aten_gm: torch.fx.GraphModule, options: Options, refused: dict[str, Reason] | None = None
) -> PartitionPlan:
    """Policy and partition (no build): shared by compilation and `explain`. `refused`: nodes
    the ONNX screen keeps in PyTorch (see compile_regions). With truncate_double, float64 nodes
    join regions, cast to float32 at the regions' edges (plan/doubles.py)."""
    rules = tuple(r for r in RULES if r.name != "fp64") if options.truncate_double else RULES
    support = CapabilitySupport(_targets.policy_targets(options), options.torch_executed_ops, rules, refused)
    plan = partition(aten_gm, support, options.min_block_size)
    if options.truncate_double:
        float32_boundaries(plan.graph_module, plan.regions)
    return plan
