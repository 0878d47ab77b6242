"""An exported region's ONNX model kept in memory, so that its weights are not copied to build.

Serializing a model copies every weight into the protobuf, and TensorRT-RTX's parser copies
them out again; for a large model (an MLP with 268 MB of FP32 weights) that is seconds of a cold
compile. TensorRT-RTX's parser can instead take a model whose initializers are declared as
external data and be handed each initializer's bytes by pointer (`load_model_proto`,
`load_initializer`, `parse_model_proto`). `OnnxModel` keeps the exporter's in-memory model,
makes that weightless "skeleton" once, and serializes the whole model only when something
needs the bytes (the engine cache's writer thread, ONNX Runtime, a dump).
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any

import numpy as np
import torch

log = logging.getLogger("rtx_backend")

EXTERNAL_MIN_BYTES = 1024  # smaller initializers stay in the skeleton: not worth a parser call each
LOCATION = "trtrtx-in-memory"  # the skeleton's external-data location: no such file is ever read


class OnnxModel:
    """The exporter's `onnx_ir.Model` of one region, its skeleton and its large weights."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self._bytes: bytes | None = None
        self._lock = threading.Lock()
        self.skeleton: bytes | None = None  # None: TensorRT-RTX gets the serialized model
        self.weights: dict[str, Any] = {}  # initializer name -> onnx_ir tensor, for the skeleton's
        try:
            self.skeleton, self.weights = split(model)
        except Exception as exc:  # an onnx_ir without ExternalTensor, or an odd initializer
            log.debug("trtrtx: no weightless ONNX model (%s: %s); the parser gets the whole model",
                      type(exc).__name__, exc)

    def serialize(self, *, keep: bool = True) -> bytes:
        """The whole model as ONNX bytes. `keep=False` does not hold on to them (a cache write)."""
        with self._lock:
            if self._bytes is not None:
                return self._bytes
            data: bytes = serialize_model(self._model)
            if keep:
                self._bytes = data
            return data


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


def host_bytes(tensor: Any) -> tuple[int, int, Any]:
    """(address, size, owner) of the tensor's bytes in host memory, C-contiguous, as ONNX lays
    them out. Keep `owner` alive as long as the pointer is used."""
    raw = getattr(tensor, "raw", None)
    if isinstance(raw, torch.Tensor):
        owner: Any = raw.detach().cpu().contiguous()
    else:
        array = tensor.numpy()
        try:
            with warnings.catch_warnings():  # a read-only array: the copy, or the parser, only reads it
                warnings.simplefilter("ignore", UserWarning)
                owner = torch.from_numpy(array).contiguous()  # torch's copy beats numpy's on transposes
        except (TypeError, ValueError):  # dtypes torch cannot view (ml_dtypes), negative strides
            owner = np.ascontiguousarray(array)
    if isinstance(owner, torch.Tensor):
        address, size = owner.data_ptr(), owner.numel() * owner.element_size()
    else:
        address, size = owner.ctypes.data, owner.nbytes
    if size != tensor.nbytes:  # not the layout ONNX expects: let onnx_ir lay the bytes out
        owner = np.frombuffer(tensor.tobytes(), dtype=np.uint8)
        address, size = owner.ctypes.data, owner.nbytes
    return address, size, owner
