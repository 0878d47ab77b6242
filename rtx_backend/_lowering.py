"""Lowering: Dynamo's FX graph -> an ATen inference graph with weights frozen as constants.

aot_autograd functionalizes the graph and applies the decompositions that the ONNX exporter
would apply (ops the exporter translates directly are kept whole). Parameters and buffers,
which Dynamo passes as graph inputs, become constants so that TensorRT-RTX can fold them into
the engine, as TensorRT does: weights are frozen at compile time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func
from torch._subclasses.fake_tensor import unset_fake_temporarily

from . import _decompositions, _exporter_ops

InferenceCompiler = Callable[[torch.fx.GraphModule, Sequence[Any]], Callable[..., Any]]


@functools.cache
def decompositions() -> dict[Any, Callable[..., Any]]:
    """PyTorch's decompositions, minus those of ops the ONNX exporter translates as they are."""
    from torch.onnx._internal.exporter import _decomp

    table = _decomp.create_onnx_friendly_decomposition_table(_exporter_ops.overloads())  # type: ignore[arg-type]
    table.update(_decompositions.TABLE)
    return table


def needs_autograd(example_inputs: Sequence[Any]) -> bool:
    """True when the graph would record autograd history (grad mode on, an input needs grad)."""
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs
    )


def is_weight(value: Any) -> bool:
    """Parameters and buffers that Dynamo lifted into graph inputs."""
    return isinstance(value, torch.nn.Parameter) or (
        isinstance(value, torch.Tensor) and hasattr(value, "_dynamo_static_input_type")
    )


def lower(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], compile_inference: InferenceCompiler
) -> Callable[..., Any]:
    """Run aot_autograd for inference and hand the frozen ATen graph to `compile_inference`."""
    weights = {i: t for i, t in enumerate(example_inputs) if is_weight(t)}

    def inference_compiler(aten_gm: torch.fx.GraphModule, args: Sequence[Any]) -> Any:
        # aot_autograd calls us under its fake mode; export and build need real tensors.
        with unset_fake_temporarily():
            freeze(aten_gm, weights)
            return make_boxed_func(compile_inference(aten_gm, args))

    return aot_module_simplified(  # type: ignore[no-any-return]
        gm,
        list(example_inputs),
        fw_compiler=inference_compiler,  # type: ignore[arg-type]
        decompositions=decompositions(),
        keep_inference_input_mutations=True,
    )


def freeze(gm: torch.fx.GraphModule, weights: dict[int, torch.Tensor]) -> None:
    """Replace the uses of weight placeholders by constants (the placeholders stay, unused)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for index, tensor in weights.items():
        if index >= len(placeholders):
            continue
        node = placeholders[index]
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.shape != tensor.shape or val.dtype != tensor.dtype:
            continue  # aot_autograd reordered or deduplicated inputs: keep it an input
        name = f"_frozen_{index}"
        gm.register_buffer(name, tensor.detach(), persistent=False)
        with gm.graph.inserting_after(placeholders[-1]):
            const = gm.graph.get_attr(name)
        const.meta["val"] = val
        node.replace_all_uses_with(const)
    gm.graph.lint()
    gm.recompile()
