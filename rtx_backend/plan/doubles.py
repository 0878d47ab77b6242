"""Float64 at the edges of the regions, with option truncate_double: cast in PyTorch, outside.

TensorRT-RTX has no FP64 tensors, so an engine can neither take nor give one. With
truncate_double the policy lets float64 nodes into regions, and this pass, run on the
partitioned graph, keeps float64 off each region's inputs and outputs: a float64 value that
enters a region is cast to float32 in PyTorch before the region and back to float64 first thing
inside it; one that leaves a region is cast to float32 last thing inside it and back to float64
in PyTorch after it. The region's graph keeps its float64 body: PyTorch runs it as the model
wrote it, which is the reference first-call validation checks the engine against; the bridge
computes that body in float32 for the engine (export/doubles.py). What PyTorch runs outside
the regions keeps float64.
"""

from __future__ import annotations

import operator

import torch

from .. import _torch_compat

aten = torch.ops.aten


def _is_double(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dtype == torch.float64


def _cast(graph: torch.fx.Graph, node: torch.fx.Node, dtype: torch.dtype) -> torch.fx.Node:
    """A `_to_copy(node, dtype=dtype)` node, with its value (call under the graph's insert point)."""
    cast = graph.call_function(aten._to_copy.default, (node,), {"dtype": dtype})
    cast.meta["val"] = _retyped(node.meta["val"], dtype)
    return cast


def _retyped(val: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    with _torch_compat.unset_fake_temporarily():  # the value's own fake mode computes it
        return val.to(dtype)


def _redirect(node: torch.fx.Node, cast: torch.fx.Node) -> None:
    """Every use of `node` but `cast` (the cast of it) made a use of `cast`."""
    node.replace_all_uses_with(cast, delete_user_cb=lambda user: user is not cast)


def float32_boundaries(gm: torch.fx.GraphModule, regions: list[str]) -> int:
    """Cast every float64 input and output of the named region submodules of `gm` at the
    region's edge (see the module docstring); returns how many values were cast."""
    count = 0
    for call in list(gm.graph.nodes):
        if call.op != "call_module" or call.target not in regions:
            continue
        region = gm.get_submodule(str(call.target))
        assert isinstance(region, torch.fx.GraphModule)
        count += _inputs(gm, call, region) + _outputs(gm, call, region)
        region.graph.lint()
        region.recompile()
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


def _inputs(gm: torch.fx.GraphModule, call: torch.fx.Node, region: torch.fx.GraphModule) -> int:
    placeholders = list(region.graph.find_nodes(op="placeholder"))
    count = 0
    for index, placeholder in enumerate(placeholders):
        arg = call.args[index]
        if not (_is_double(placeholder) and isinstance(arg, torch.fx.Node)):
            continue
        with gm.graph.inserting_before(call):
            narrowed = _cast(gm.graph, arg, torch.float32)
        call.update_arg(index, narrowed)
        placeholder.meta["val"] = narrowed.meta["val"]
        with region.graph.inserting_after(placeholder):  # (a region's placeholders need not come first)
            widened = _cast(region.graph, placeholder, torch.float64)
        _redirect(placeholder, widened)
        count += 1
    return count


def _outputs(gm: torch.fx.GraphModule, call: torch.fx.Node, region: torch.fx.GraphModule) -> int:
    output = region.graph.output_node()
    results = list(output.args[0])  # type: ignore[arg-type]  # (the partitioner returns a tuple)
    doubles = [k for k, r in enumerate(results) if isinstance(r, torch.fx.Node) and _is_double(r)]
    with region.graph.inserting_before(output):
        for k in doubles:
            results[k] = _cast(region.graph, results[k], torch.float32)
    output.args = (tuple(results),)
    for user in list(call.users):
        if user.target is not operator.getitem or user.args[1] not in doubles:
            continue
        user.meta["val"] = results[user.args[1]].meta["val"]  # type: ignore[index]
        with gm.graph.inserting_after(user):
            widened = _cast(gm.graph, user, torch.float64)
        _redirect(user, widened)
    return len(doubles)
