"""A region's float64 computed in float32, for the engine (option truncate_double).

TensorRT-RTX has no FP64 tensors. A region holds float64 nodes only under truncate_double, and
then none at its edges (plan/doubles.py casts them outside); what it computes in float64 is
exported in float32: each float64 dtype argument (`_to_copy(x, dtype=float64)`, `arange(...,
dtype=float64)`) names float32 instead, each float64 constant is a float32 copy, and each value
follows (type promotion gives float32 where it gave float64). The region's PyTorch graph, the
reference of first-call validation, is copied before the bridge edits it and keeps float64.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from .. import _torch_compat
from .._errors import BuildError


def _narrow(value: Any) -> Any:
    """An argument with torch.float64 made torch.float32; the same object where it has none."""
    if value is torch.float64:
        return torch.float32
    if isinstance(value, (list, tuple)):
        items = [_narrow(v) for v in value]
        if any(a is not b for a, b in zip(items, value)):
            return type(value)(items)
    return value


def _fake(value: Any) -> Any:
    """A value (a fake tensor, or a tuple of them) with float64 tensors made float32; the same
    object where it has none."""
    if isinstance(value, torch.Tensor) and value.dtype == torch.float64:
        with _torch_compat.unset_fake_temporarily():  # the value's own fake mode computes it
            return value.to(torch.float32)
    if isinstance(value, (list, tuple)):
        items = [_fake(v) for v in value]
        if any(a is not b for a, b in zip(items, value)):
            return type(value)(items)
    return value


def truncate_doubles(gm: torch.fx.GraphModule) -> int:
    """Make every float64 value of the region `gm` float32 (see the module docstring); returns
    how many nodes changed. Raises BuildError for a float64 region input or output (an engine
    cannot take or give one; the region then runs in PyTorch)."""
    edges = [*gm.graph.find_nodes(op="placeholder"), *gm.graph.output_node().all_input_nodes]
    for node in edges:  # (checked before anything changes)
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dtype == torch.float64:
            raise BuildError(f"region {'input' if node.op == 'placeholder' else 'output'} {node.name} is float64, "
                             "which TensorRT-RTX cannot take or give")
    changed = 0
    for node in list(gm.graph.nodes):
        val = node.meta.get("val")
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "get_attr":
            value = operator.attrgetter(str(node.target))(gm)  # (a dotted path: "sub.weight")
            if isinstance(value, torch.Tensor) and value.dtype == torch.float64:
                name = str(node.target).replace(".", "_") + "_as_float32"
                if not hasattr(gm, name):
                    gm.register_buffer(name, value.float(), persistent=False)
                node.target = name
                node.meta["val"] = _fake(val)
                changed += 1
            continue
        args, kwargs = _narrow(node.args), {k: _narrow(v) for k, v in node.kwargs.items()}
        narrowed = _fake(val)
        if args is not node.args or any(kwargs[k] is not v for k, v in node.kwargs.items()) or narrowed is not val:
            node.args, node.kwargs = args, kwargs
            node.meta["val"] = narrowed
            changed += 1
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed
