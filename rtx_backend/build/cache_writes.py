"""In-place cache writes: a one-row write into a KV cache input becomes TensorRT-RTX's KVCacheUpdate.

Lowering exports a language model's per-token cache write as ScatterElements on the cache input
itself (lower/cache_writes.py). TensorRT-RTX's parser maps ONNX's TensorScatter to its KVCacheUpdate
layer, which writes into the cache input's own memory: the engine's output is the cache (TensorRT-RTX
reports it aliased to the input, and the executor binds both to the same tensor), so no token copies
a cache. The rewrite is made on the model handed to the parser only; ONNX Runtime runs the
ScatterElements.

A ScatterElements is rewritten only where that is provably the same computation:
- its data is a graph input of rank 4 that no other node reads, and its output is a graph output;
- it writes along axis 2, one row: its indices are `Expand(Reshape(P, [1, 1, -1, 1]), [B, H, 1, D])`
  with a constant shape whose batch, heads and width are the cache's, so every element of a batch row
  goes to the same position P[0] (what KVCacheUpdate's one write index per batch row means).
A write of several rows is left alone: nothing proves its positions follow each other.
"""

from __future__ import annotations

from typing import Any

import numpy as np

OP = "ScatterElements"


def supported() -> bool:
    """Whether the installed TensorRT-RTX tells the runtime which outputs share an input's memory
    (`ICudaEngine.get_aliased_input_tensor`): without it an in-place engine cannot be run right."""
    from .. import _trt

    return _trt.available() and hasattr(_trt.trt().ICudaEngine, "get_aliased_input_tensor")


def _constant(graph: Any, name: str, made_by: dict[str, Any]) -> np.ndarray | None:
    import onnx

    for init in graph.initializer:
        if init.name == name:
            if init.data_location == onnx.TensorProto.EXTERNAL:
                return None
            return onnx.numpy_helper.to_array(init)
    node = made_by.get(name)
    if node is not None and node.op_type == "Constant":
        for attr in node.attribute:
            if attr.name == "value":
                return onnx.numpy_helper.to_array(attr.t)
    return None


def _dims(value: Any) -> list[int | None]:
    return [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]


def rewrite(proto: Any) -> dict[str, str]:
    """Rewrite the model's one-row cache writes in place (see the module's docstring); returns
    {cache output name: cache input name} for those rewritten."""
    import onnx

    graph = proto.graph
    made_by = {out: node for node in graph.node for out in node.output}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    inputs = {v.name: v for v in graph.input}
    outputs = {v.name for v in graph.output}
    aliases: dict[str, str] = {}
    for node in list(graph.node):
        if node.op_type != OP or node.domain not in ("", "ai.onnx") or len(node.input) != 3:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        data, indices, updates = node.input
        cache = inputs.get(data)
        if cache is None or node.output[0] not in outputs or readers.get(data) != 1:
            continue
        if attrs.get("axis") not in (2, -2) or attrs.get("reduction", b"none") not in (b"none", "none"):
            continue
        dims = _dims(cache)
        if len(dims) != 4 or None in dims:
            continue
        expand = made_by.get(indices)
        if expand is None or expand.op_type != "Expand":
            continue
        shape = _constant(graph, expand.input[1], made_by)
        if shape is None or shape.tolist() != [dims[0], dims[1], 1, dims[3]]:
            continue
        reshape = made_by.get(expand.input[0])
        if reshape is None or reshape.op_type != "Reshape":
            continue
        target = _constant(graph, reshape.input[1], made_by)
        if target is None or target.tolist() not in ([1, 1, -1, 1], [1, 1, 1, 1]):
            continue
        positions = reshape.input[0]  # one element: the row written, the same for every batch row
        stem = f"trtrtx_cache_write_{len(aliases)}"
        batch = onnx.helper.make_tensor(f"{stem}_batch", onnx.TensorProto.INT64, [1], [int(dims[0] or 0)])
        flat = onnx.helper.make_tensor(f"{stem}_flat", onnx.TensorProto.INT64, [1], [1])
        graph.initializer.extend([batch, flat])
        new = [
            onnx.helper.make_node("Reshape", [positions, flat.name], [f"{stem}_row"], name=f"{stem}_row"),
            onnx.helper.make_node("Cast", [f"{stem}_row"], [f"{stem}_row64"], name=f"{stem}_cast",
                                  to=onnx.TensorProto.INT64),
            onnx.helper.make_node("Expand", [f"{stem}_row64", batch.name], [f"{stem}_at"], name=f"{stem}_at"),
            onnx.helper.make_node("TensorScatter", [data, updates, f"{stem}_at"], list(node.output),
                                  name=stem, axis=-2, mode="linear"),
        ]
        index = list(graph.node).index(node)
        del graph.node[index]
        for offset, made in enumerate(new):
            graph.node.insert(index + offset, made)
        aliases[node.output[0]] = data
    return aliases


def in_place(model: bytes | Any) -> tuple[bytes | Any, dict[str, str]]:
    """`model` (ONNX bytes, or an OnnxModel) with its one-row cache writes made in place, and the
    aliases made; the model itself where there are none."""
    import onnx

    from ..export.model import OnnxModel

    data = model.skeleton if isinstance(model, OnnxModel) else model
    if not isinstance(data, bytes) or OP.encode() not in data:
        return model, {}
    proto = onnx.load_from_string(data)
    aliases = rewrite(proto)
    if not aliases:
        return model, {}
    # (TensorScatter is ONNX opset 24; TensorRT-RTX's parser takes it at the model's opset, which
    # stays as it is so that no other op is read differently)
    rewritten = proto.SerializeToString()
    if isinstance(model, OnnxModel):
        return OnnxModel(skeleton=rewritten, weights=model.weights), aliases
    return rewritten, aliases
