"""A partitioned graph whose frozen weights become inputs again: for a graph that several sets of
weights share (assemble/shared.py), so that its regions take the call's weights as engine inputs.

Lowering froze each weight as a constant `_frozen_<i>` read by get_attr nodes (Dynamo input i,
whose placeholder stays in the graph, unused). Here, for the shared inputs:

- the rest of the partitioned graph reads placeholder i again, as it does with rest="inductor"
  (rest._unfreeze);
- each region that read such a constant gets a placeholder of its own for it, after its others,
  and its call in the partitioned graph passes placeholder i there: exported, the weight is an
  ONNX graph input, not an initializer, and the engine is keyed by the region's code and input
  specs, not by one set's values (cache/engines.graph_digest).

The regions are the caller's to compile: `weights_as_inputs` gives their new graphs.
"""

from __future__ import annotations

import copy
from collections.abc import Collection

import torch

from ..cache.engines import fetch_attr
from ..export.bridge import FROZEN
from ..run.region import RegionModule


def frozen_index(target: str) -> int | None:
    """The Dynamo input index of a constant named by lowering's freeze; None for other constants."""
    match = FROZEN.search(target)
    return int(match.group(1)) if match else None


def frozen_uses(gm: torch.fx.GraphModule) -> set[int]:
    """The Dynamo inputs whose frozen constants `gm`'s own graph reads."""
    return {i for n in gm.graph.find_nodes(op="get_attr") if (i := frozen_index(str(n.target))) is not None}


def weights_as_inputs(
    gm: torch.fx.GraphModule, shared: Collection[int]
) -> tuple[torch.fx.GraphModule, dict[str, torch.fx.GraphModule]]:
    """A copy of the partitioned graph `gm` that reads the inputs `shared` instead of their frozen
    constants, and the new graph of each region that read one (by its attribute name in `gm`),
    which takes them as its last inputs. Regions that read none stay the same modules."""
    graph = copy.deepcopy(gm.graph)
    placeholders = list(graph.find_nodes(op="placeholder"))
    regions: dict[str, torch.fx.GraphModule] = {}
    for node in list(graph.nodes):
        if node.op == "get_attr":
            index = frozen_index(str(node.target))
            if index in shared and index is not None and index < len(placeholders):
                node.replace_all_uses_with(placeholders[index])
                graph.erase_node(node)
        elif node.op == "call_module":
            module = gm.get_submodule(str(node.target))
            if not isinstance(module, RegionModule):
                continue
            made = region_with_inputs(module.graph_module, shared)
            if made is None:
                continue
            region_gm, indices = made
            node.args = (*node.args, *(placeholders[i] for i in indices))
            regions[str(node.target)] = region_gm
    graph.lint()
    return torch.fx.GraphModule(gm, graph), regions


def region_with_inputs(
    region_gm: torch.fx.GraphModule, shared: Collection[int]
) -> tuple[torch.fx.GraphModule, list[int]] | None:
    """The region's graph with each frozen constant of the inputs `shared` made a placeholder
    (after the region's own, in the order of first use), and those inputs' indices; None where the
    region reads none of them. The new graph holds no reference to the constants it no longer reads."""
    graph = copy.deepcopy(region_gm.graph)
    placeholders = list(graph.find_nodes(op="placeholder"))
    first = next((n for n in graph.nodes if n.op != "placeholder"), None)
    if first is not None:
        for node in placeholders:  # in order, before every other node (a fused region interleaves them)
            first.prepend(node)
    last = placeholders[-1] if placeholders else None
    made: dict[int, torch.fx.Node] = {}
    for node in list(graph.find_nodes(op="get_attr")):
        index = frozen_index(str(node.target))
        if index is None or index not in shared:
            continue
        if index not in made:
            value = node.meta.get("val")
            if not isinstance(value, torch.Tensor):
                value = fetch_attr(region_gm, str(node.target))
            if last is not None:
                with graph.inserting_after(last):
                    placeholder = graph.placeholder(f"weight_{index}")
            else:
                with graph.inserting_before(next(iter(graph.nodes))):
                    placeholder = graph.placeholder(f"weight_{index}")
            placeholder.meta["val"] = value
            made[index] = last = placeholder
        node.replace_all_uses_with(made[index])
        graph.erase_node(node)
    if not made:
        return None
    graph.lint()
    return torch.fx.GraphModule(region_gm, graph), list(made)
