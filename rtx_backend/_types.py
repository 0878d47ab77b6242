"""The records that the stages pass on: what a region's inputs are, what its ONNX model is, what
an engine and its profile are, why a node stays in PyTorch, which GPU is meant.

They live here, below every stage, so that the engine cache, the executors, the profiles and the
dump read a region's description without importing the exporter that made it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # (the exporter's in-memory model; only its serialize() is used here)
    from .export.model import OnnxModel

Target = tuple[int, int]  # a compute capability, (major, minor)
Profile = dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]  # input name -> min/opt/max
EngineData = bytes | memoryview  # a serialized engine: read from a file, or the builder's own memory


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Shape (ints for static dims, symbol names for dynamic ones) and dtype of an engine I/O."""

    name: str
    shape: tuple[int | str, ...]
    dtype: torch.dtype
    hint: tuple[int, ...]  # the example's sizes
    bounds: tuple[tuple[int, int | None], ...] = ()  # per dim: Dynamo's (lower, upper or None)

    @property
    def dynamic(self) -> bool:
        return any(isinstance(d, str) for d in self.shape)


@dataclasses.dataclass(frozen=True)
class OnnxRegion:
    """A region as ONNX: the model (bytes, or the exporter's in-memory model) and how region
    arguments map to model inputs."""

    source: bytes | OnnxModel
    tensor_args: tuple[int, ...]  # which region arguments are the model's inputs, in order
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def dynamic(self) -> bool:
        return any(s.dynamic for s in self.inputs)

    @property
    def model(self) -> bytes:
        """The ONNX model's bytes (serialized on first use for an in-memory model)."""
        source = self.source
        return source if isinstance(source, bytes) else source.serialize()


@dataclasses.dataclass(frozen=True)
class Reason:
    """Why a node stays in PyTorch."""

    rule: str
    message: str
    target: Target | None = None

    def __str__(self) -> str:
        where = f" [target SM{self.target[0]}.{self.target[1]}]" if self.target else ""
        return f"{self.rule}: {self.message}{where}"
