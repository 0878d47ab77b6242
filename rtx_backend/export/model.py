"""An exported region's ONNX model kept in memory, so that its weights are not copied to build.

Serializing a model copies every weight into the protobuf, and TensorRT-RTX's parser copies
them out again; for a large model (an MLP with 268 MB of FP32 weights) that is seconds of a cold
compile. TensorRT-RTX's parser can instead take a model whose initializers are declared as
external data and be handed each initializer's bytes by pointer (`load_model_proto`,
`load_initializer`, `parse_model_proto`). `OnnxModel` keeps the exporter's in-memory model,
makes that weightless "skeleton" once, and serializes the whole model only when something
needs the bytes (ONNX Runtime, a dump). The engine cache stores the skeleton and the raw weights
side by side (no serialization: writing them holds the GIL only briefly, so a compile running
beside the cache writer is not slowed down) and loads them back as an `OnnxModel` of the same form.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from .. import _host

log = logging.getLogger("rtx_backend")

EXTERNAL_MIN_BYTES = 1024  # smaller initializers stay in the skeleton: not worth a parser call each
PROTOBUF_LIMIT = 2**31 - 1  # protobuf serializes no message larger than this
LOCATION = "trtrtx-in-memory"  # the skeleton's external-data location: no such file is ever read


class OnnxModel:
    """One region's ONNX model as a weightless skeleton plus its large weights: made from the
    exporter's `onnx_ir.Model` (`OnnxModel(model)`), or from stored parts (`OnnxModel(skeleton=...,
    weights=...)`, weights as raw bytes in numpy uint8 arrays)."""

    def __init__(self, model: Any = None, *, skeleton: bytes | None = None,
                 weights: dict[str, Any] | None = None) -> None:
        self._model = model
        self._bytes: bytes | None = None
        self._lock = threading.Lock()
        self.skeleton = skeleton  # None: TensorRT-RTX gets the serialized model
        self.weights: dict[str, Any] = dict(weights or {})  # initializer name -> its data
        if model is None:
            if skeleton is None:
                raise ValueError("an OnnxModel needs a model or a skeleton")
            return
        try:
            self.skeleton, self.weights = split(model)
        except Exception as exc:  # an onnx_ir without ExternalTensor, or an odd initializer
            log.debug("trtrtx: no weightless ONNX model (%s: %s); the parser gets the whole model",
                      type(exc).__name__, exc)

    def serialize(self, *, keep: bool = True) -> bytes:
        """The whole model as ONNX bytes. `keep=False` does not hold on to them. Raises ValueError,
        before copying anything, for a model larger than protobuf serializes (a Llama 1B in FP16:
        serializing its 2.5 GB took 28 s on a small CPU before protobuf refused it)."""
        with self._lock:
            if self._bytes is not None:
                return self._bytes
            size = self.size()
            if size is not None and size > PROTOBUF_LIMIT:
                raise ValueError(f"the ONNX model is {size / 2**30:.1f} GiB, larger than the 2 GiB that protobuf "
                                 "serializes")
            if self._model is not None:
                data: bytes = serialize_model(self._model)
            else:
                assert self.skeleton is not None
                data = fill(self.skeleton, self.weights)
            if keep:
                self._bytes = data
            return data

    def size(self) -> int | None:
        """The bytes of the skeleton and the weights (what serializing the model at least makes);
        None without a skeleton."""
        if self.skeleton is None:
            return None
        return len(self.skeleton) + sum(int(t.nbytes) for t in self.weights.values())

    def parts(self) -> tuple[bytes, list[tuple[str, np.ndarray]]] | None:
        """What the engine cache stores: the skeleton and each weight's bytes (host copies made by
        torch, which lets go of the GIL while it copies); None without a skeleton."""
        if self.skeleton is None:
            return None
        return self.skeleton, [(name, host_buffer(t)) for name, t in self.weights.items()]


def in_memory_initializers(model: OnnxModel) -> tuple[bytes, list[str], list[np.ndarray]] | None:
    """The skeleton, and each external initializer's name and data as an array of its ONNX dtype
    and shape, for a runtime that takes initializers from memory (ONNX Runtime's
    `add_external_initializers`): the whole model is then never serialized, so no copy of its
    weights is made, and a model above protobuf's 2 GiB loads. The arrays view the weights' host
    bytes: whoever uses them keeps them. None without a skeleton, or for a dtype numpy has no
    type for (bfloat16, the float8 types)."""
    import onnx

    if model.skeleton is None:
        return None
    proto = onnx.load_from_string(model.skeleton)
    declared = {i.name: (i.data_type, tuple(i.dims)) for i in proto.graph.initializer
                if i.data_location == onnx.TensorProto.EXTERNAL}
    if set(declared) != set(model.weights):
        return None
    read = {o.name for o in proto.graph.output} | set(_inputs_read(proto.graph))
    names, arrays = [], []
    for name, tensor in model.weights.items():
        if name not in read:  # (ONNX Runtime drops an initializer no node reads, then refuses its data)
            continue
        elem, dims = declared[name]
        if elem in (onnx.TensorProto.BFLOAT16, onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED) \
                or elem > onnx.TensorProto.UINT64:
            return None  # no numpy dtype ONNX Runtime takes (bfloat16, the float8 and 4-bit types)
        names.append(name)
        arrays.append(host_buffer(tensor).view(onnx.helper.tensor_dtype_to_np_dtype(elem)).reshape(dims))
    return model.skeleton, names, arrays


def _inputs_read(graph: Any) -> Iterator[str]:
    """The names the graph's nodes read, those in subgraphs (If/Loop/Scan bodies) too."""
    for node in graph.node:
        yield from node.input
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _inputs_read(sub)


def as_bytes(model: bytes | OnnxModel, *, keep: bool = True) -> bytes:
    """The model's ONNX bytes, whichever form it is in (`keep`: see OnnxModel.serialize)."""
    return model if isinstance(model, bytes) else model.serialize(keep=keep)


def serialize_model(model: Any) -> bytes:
    import onnx_ir as ir

    return ir.serde.serialize_model(model).SerializeToString()  # type: ignore[no-any-return]


def split(model: Any) -> tuple[bytes, dict[str, Any]]:
    """The model serialized with its large top-level initializers declared as external data, and
    those initializers. The model is changed only while it is serialized, on the caller's thread
    (the exporter's, before anyone else sees it)."""
    import onnx_ir as ir

    weights: dict[str, Any] = {}
    for name, value in model.graph.initializers.items():
        tensor = value.const_value
        if tensor is None or tensor.dtype.bitwidth % 8 or tensor.nbytes < EXTERNAL_MIN_BYTES:
            continue  # packed 4-bit types and small tensors stay inline
        weights[name] = tensor
    try:
        for name, tensor in weights.items():
            model.graph.initializers[name].const_value = ir.ExternalTensor(
                LOCATION, 0, tensor.nbytes, tensor.dtype, shape=tensor.shape, name=name, base_dir=""
            )
        skeleton = serialize_model(model)
    finally:
        for name, tensor in weights.items():
            model.graph.initializers[name].const_value = tensor
    return skeleton, weights


def fill(skeleton: bytes, weights: dict[str, Any]) -> bytes:
    """The whole model: the skeleton with each external initializer's bytes put back inline."""
    import onnx

    proto = onnx.load_from_string(skeleton)
    for init in proto.graph.initializer:
        if init.name in weights and init.data_location == onnx.TensorProto.EXTERNAL:
            init.raw_data = host_buffer(weights[init.name]).tobytes()
            del init.external_data[:]
            init.ClearField("data_location")
    return proto.SerializeToString()  # type: ignore[no-any-return]


def host_buffer(tensor: Any) -> np.ndarray:
    """The tensor's bytes in host memory as a flat uint8 array, C-contiguous, as ONNX lays them
    out. `tensor`: an onnx_ir tensor, or such bytes already (a stored weight)."""
    if isinstance(tensor, np.ndarray) and tensor.dtype == np.uint8 and tensor.ndim == 1:
        return tensor
    raw = getattr(tensor, "raw", None)
    if isinstance(raw, torch.Tensor):
        out = _torch_bytes(_host.host_copy(raw))  # a compile copies each weight once (_host.py)
    else:
        array = tensor.numpy()
        try:
            with warnings.catch_warnings():  # a read-only array: the copy, or the parser, only reads it
                warnings.simplefilter("ignore", UserWarning)
                out = _torch_bytes(torch.from_numpy(array).contiguous())  # torch copies transposes faster
        except (TypeError, ValueError):  # dtypes torch cannot view (ml_dtypes), negative strides
            out = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    if out.nbytes != tensor.nbytes:  # not the layout ONNX expects: let onnx_ir lay the bytes out
        out = np.frombuffer(tensor.tobytes(), dtype=np.uint8)
    return out


def _torch_bytes(t: torch.Tensor) -> np.ndarray:
    return t.reshape(-1).view(torch.uint8).numpy()  # a view: the array keeps the tensor alive


def host_bytes(tensor: Any) -> tuple[int, int, Any]:
    """(address, size, owner) of the tensor's host bytes (see host_buffer). Keep `owner` alive as
    long as the pointer is used."""
    owner = host_buffer(tensor)
    return owner.ctypes.data, owner.nbytes, owner
