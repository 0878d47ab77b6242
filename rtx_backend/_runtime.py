"""Runtime module: what replaces a region in the returned GraphModule.

It holds the region's ONNX model, its engine (when one was built) and its FX graph, and runs
whichever executor was chosen at compile time, returning what the region returned (a tuple).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ._executors import OrtExecutor, TorchExecutor, TrtExecutor
from ._onnx_bridge import OnnxRegion

log = logging.getLogger("rtx_backend")


class RegionModule(torch.nn.Module):
    """One region, run by TensorRT-RTX, ONNX Runtime, or (fallback) PyTorch."""

    def __init__(
        self,
        name: str,
        graph: torch.fx.GraphModule,
        onnx_region: OnnxRegion | None,
        engine: bytes | None,
        executor: TrtExecutor | OrtExecutor | TorchExecutor,
    ) -> None:
        super().__init__()
        self.name = name
        self.graph_module = graph
        self.onnx = onnx_region
        self.engine = engine
        self.executor = executor

    @property
    def kind(self) -> str:
        return self.executor.kind

    def forward(self, *args: Any) -> tuple[torch.Tensor, ...]:
        executor = self.executor
        if isinstance(executor, TorchExecutor):
            return tuple(executor.run_args(args))
        assert self.onnx is not None
        tensors = [args[i] for i in self.onnx.tensor_args]
        return tuple(executor(tensors))

    def extra_repr(self) -> str:
        return f"{self.name}: {self.kind}"
