"""A region's ONNX model and its initializers: what a weight that changed after the compile
replaces (assemble/weights.py). Each weight stays an initializer under its own name
(`export_region(keep_weights=True)`), in the model's skeleton or among its external weights
(`OnnxModel`), so a new value replaces it by name, with the same dims and data type.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .._types import OnnxRegion
from .model import OnnxModel

# torch dtype -> ONNX TensorProto data type, for the initializers a weight can replace
_ONNX_DTYPES = {
    torch.float32: 1, torch.uint8: 2, torch.int8: 3, torch.int16: 5, torch.int32: 6, torch.int64: 7,
    torch.bool: 9, torch.float16: 10, torch.float64: 11, torch.bfloat16: 16,
}


def spec(tensor: torch.Tensor) -> tuple[tuple[int, ...], int] | None:
    """A tensor's (dims, ONNX data type), as `initializer_specs` gives an initializer's; None for
    a dtype no initializer takes."""
    dtype = _ONNX_DTYPES.get(tensor.dtype)
    return (tuple(tensor.shape), dtype) if dtype is not None else None


def initializer_specs(region: OnnxRegion) -> dict[str, tuple[tuple[int, ...], int]]:
    """Each initializer's (dims, ONNX data type), read from the model (its skeleton, when it
    has one: the large weights are declared there too)."""
    import onnx

    source = region.source
    data = source.skeleton if isinstance(source, OnnxModel) and source.skeleton is not None else region.model
    proto = onnx.load_from_string(data)
    return {i.name: (tuple(int(d) for d in i.dims), int(i.data_type)) for i in proto.graph.initializer}


def initializer_value(region: OnnxRegion, name: str) -> torch.Tensor | None:
    """An initializer's value as a tensor (None where the model has no such initializer)."""
    import onnx
    from onnx import numpy_helper

    for init in onnx.load_from_string(region.model).graph.initializer:
        if init.name == name:
            return torch.from_numpy(numpy_helper.to_array(init).copy())
    return None


def with_weights(region: OnnxRegion, values: dict[str, torch.Tensor]) -> OnnxRegion:
    """The region's model with these initializers' values replaced (same names, shapes, dtypes)."""
    import onnx

    source = region.source
    if isinstance(source, OnnxModel) and source.skeleton is not None:
        weights = dict(source.weights)
        inline = {}
        for name, tensor in values.items():
            if name in weights:
                weights[name] = host_bytes(tensor)
            else:
                inline[name] = tensor
        skeleton = _replace_inline(source.skeleton, inline) if inline else source.skeleton
        return dataclasses.replace(region, source=OnnxModel(skeleton=skeleton, weights=weights))
    proto = onnx.load_from_string(region.model)
    _set_initializers(proto, values)
    return dataclasses.replace(region, source=proto.SerializeToString())


def _replace_inline(model: bytes, values: dict[str, torch.Tensor]) -> bytes:
    import onnx

    proto = onnx.load_from_string(model)
    _set_initializers(proto, values)
    return proto.SerializeToString()  # type: ignore[no-any-return]


_TYPED_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")


def _set_initializers(proto: Any, values: dict[str, torch.Tensor]) -> None:
    for init in proto.graph.initializer:
        tensor = values.get(init.name)
        if tensor is None:
            continue
        for field in _TYPED_FIELDS:
            init.ClearField(field)
        init.raw_data = host_bytes(tensor).tobytes()


def host_bytes(tensor: torch.Tensor) -> Any:
    """The tensor's elements in host memory, C-contiguous, as a flat uint8 numpy array (ONNX's
    raw layout; the stored form of an OnnxModel's weights)."""
    host = tensor.detach().to("cpu", copy=True).contiguous()  # a snapshot: the weight may change again
    return host.reshape(-1).view(torch.uint8).numpy()
