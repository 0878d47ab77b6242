"""The op `trtrtx::engine(Tensor plan, Tensor onnx, str meta, Tensor[] inputs) -> Tensor[]`, registered
when `rtx_backend` is imported, so that torch.export.load runs a package too.

`plan` is the region's serialized engine and `onnx` its ONNX model, each a uint8 buffer of the
exported program (empty where the package has none); `meta` is JSON: the region's input and
output specs (dynamic dims as expressions of the inputs' symbols, for the fake kernel), its
engine's profile, the targets, the TensorRT-RTX version and the runtime options. The first call
with a given `plan` buffer makes the region's runtime module (package_region.py); later calls
find it by the buffer.
"""

from __future__ import annotations

import ast
import functools
import operator
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .package_region import parse_meta, region_module, region_specs

OP_NAME = "trtrtx::engine"


@torch.library.custom_op(OP_NAME, mutates_args=())
def engine(plan: torch.Tensor, onnx: torch.Tensor, meta: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """One region of a saved package: its engine (or ONNX model) run on `inputs`."""
    region = REGIONS.modules.get(plan)
    if region is None:
        region = REGIONS.make(plan, onnx, meta, inputs[0].device if inputs else torch.device("cpu"))
    return list(region(*inputs))


@engine.register_fake
def _engine_fake(plan: torch.Tensor, onnx: torch.Tensor, meta: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    region = specs(meta)
    sizes: dict[str, Any] = {}
    for spec, tensor in zip(region.inputs, inputs):
        for dim, size in zip(spec.shape, tensor.shape):
            if isinstance(dim, str) and dim.isidentifier():
                sizes.setdefault(dim, size)
    device = inputs[0].device if inputs else torch.device("cpu")
    return [torch.empty([d if isinstance(d, int) else _size(d, sizes) for d in spec.shape], dtype=spec.dtype,
                        device=device) for spec in region.outputs]


class RegionsByBuffer:
    """The region module of each plan buffer the op has run, held as long as the buffer lives:
    the op's first call with a buffer makes it, later calls find it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.modules: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def make(self, plan: torch.Tensor, onnx: torch.Tensor, meta: str, device: torch.device) -> Any:
        with self._lock:
            region = self.modules.get(plan)
            if region is None:
                region = region_module(host_bytes(plan), host_bytes(onnx), parse_meta(meta), device, {})
                self.modules[plan] = region
        return region


REGIONS = RegionsByBuffer()


def host_bytes(t: torch.Tensor) -> bytes:
    return t.detach().to("cpu").contiguous().numpy().tobytes() if t.numel() else b""


@functools.lru_cache(maxsize=256)
def specs(meta: str) -> Any:
    return region_specs(parse_meta(meta))


_OPS: dict[type, Callable[[Any, Any], Any]] = {ast.Add: operator.add, ast.Sub: operator.sub,
                                               ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
                                               ast.Mod: operator.mod}


def _size(expr: str, sizes: Mapping[str, Any]) -> Any:
    """An output dimension from its expression over the inputs' symbols ("s0", "2*s0", "s0*s1",
    "(s0//2)", "Max(1, s0)"): arithmetic only, never eval. A symbol no input carries gets a new
    size of its own (an unbacked symbol)."""

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in sizes:
            return sizes[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("Max", "Min"):
            args = [value(a) for a in node.args]
            pick = torch.sym_max if node.func.id == "Max" else torch.sym_min
            return functools.reduce(pick, args)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "FloorDiv":
            a, b = (value(x) for x in node.args)
            return a // b
        raise ValueError(type(node).__name__)

    try:
        return value(ast.parse(expr, mode="eval").body)
    except (ValueError, SyntaxError, TypeError, RecursionError):
        return torch.library.get_ctx().new_dynamic_size()
