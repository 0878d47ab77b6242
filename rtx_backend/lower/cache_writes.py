"""Cache writes: a language model's per-token write into its static KV cache, in a form the engine
can do in place.

Hugging Face's static cache writes each step's keys and values with `cache.index_copy_(2, pos, kv)`;
aot_autograd makes that `index_put(cache, [None, None, pos], kv)` (or `index_copy`), a new tensor,
followed by `copy_(cache, new)`. Exported as it is, the write is a ScatterND between two transposes
of the whole cache: every token copies every layer's cache twice (in the engine, then back into the
cache). Here such a write of a graph input that the graph writes back becomes
`scatter(cache, 2, pos.reshape(1, 1, S, 1).expand(B, H, S, D), kv)`: the same values, exported as one
ScatterElements on the cache input itself, which the engine build turns into TensorRT-RTX's in-place
cache update (build/cache_writes.py). ONNX Runtime runs the ScatterElements as it is.
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _write(node: torch.fx.Node) -> tuple[Any, Any, Any, Any] | None:
    """(cache, dim, positions, values) of an index_put / index_copy that writes whole rows of one
    dimension, or None."""
    dim: Any
    if node.target is aten.index_put.default:
        cache, indices, values = node.args[:3]
        accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
        if accumulate or not isinstance(indices, (list, tuple)):
            return None
        given = [(d, i) for d, i in enumerate(indices) if i is not None]
        if len(given) != 1:
            return None
        dim, positions = given[0]
    elif node.target is aten.index_copy.default:
        cache, dim, positions, values = node.args[:4]
    else:
        return None
    if not all(isinstance(n, torch.fx.Node) for n in (cache, positions, values)) or not isinstance(dim, int):
        return None
    return cache, dim, positions, values


def _size(graph: torch.fx.Graph, node: torch.fx.Node, value: torch.Tensor) -> list[Any]:
    """The node's size as expand's argument: a symbolic dimension (a prompt's length) read from the
    node by sym_size, not written down as the name of its symbol, which the graph does not define."""
    size: list[Any] = []
    for dim, length in enumerate(value.shape):
        if isinstance(length, torch.SymInt):
            read = graph.call_function(aten.sym_size.int, (node, dim))
            read.meta["val"] = length
            size.append(read)
        else:
            size.append(int(length))
    return size


def scatter_cache_writes(gm: torch.fx.GraphModule, written: set[int]) -> int:
    """Rewrite the writes of written 4-D inputs along dim 2 (see the module's docstring); returns
    how many. The cache must be read by nothing but its write and the copy back."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = {placeholders[i] for i in written if i < len(placeholders)}
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        found = _write(node)
        if found is None:
            continue
        cache, dim, positions, values = found
        c, p, v = _val(cache), _val(positions), _val(values)
        if cache not in inputs or not all(isinstance(t, torch.Tensor) for t in (c, p, v)):
            continue
        if c.dim() != 4 or dim % 4 != 2 or p.dim() != 1 or p.dtype not in (torch.int64, torch.int32):
            continue
        if v.dim() != 4 or v.dtype != c.dtype or list(v.shape[:2]) != list(c.shape[:2]) or v.shape[3] != c.shape[3]:
            continue
        if any(u is not node and u.target is not aten.copy_.default for u in cache.users):
            continue  # the old cache is read too: writing it in place would change what that reads
        with gm.graph.inserting_before(node):
            rows = gm.graph.call_function(aten.reshape.default, (positions, [1, 1, -1, 1]))
            rows.meta["val"] = p.reshape(1, 1, -1, 1)
            index = gm.graph.call_function(aten.expand.default, (rows, _size(gm.graph, values, v)))
            index.meta["val"] = rows.meta["val"].expand(*v.shape)
            scatter = gm.graph.call_function(aten.scatter.src, (cache, 2, index, values))
        scatter.meta.update(node.meta)
        node.replace_all_uses_with(scatter)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count
