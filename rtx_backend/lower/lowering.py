"""Lowering: Dynamo's FX graph -> an ATen inference graph with weights frozen as constants.

aot_autograd functionalizes the graph and applies the decompositions that the ONNX exporter
would apply (ops the exporter translates directly are kept whole). Parameters and buffers,
which Dynamo passes as graph inputs, become constants so that TensorRT-RTX can fold them into
the engine, as TensorRT does: weights are frozen at compile time.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import _stats, _torch_compat
from ..lower import decompositions as _decompositions
from ..lower import exporter_ops as _exporter_ops
from ..lower.cache_writes import scatter_cache_writes

InferenceCompiler = Callable[[torch.fx.GraphModule, Sequence[Any]], Callable[..., Any]]


# Ops that wrap a real tensor made during tracing (a Python scalar assigned into a slice:
# `mask[a:b] = 1.0` lifts `tensor(1.)`) into the fake world. Fake tensor mode handles them
# itself; decomposed (to alias), the real tensor reaches fake kernels and tracing fails
# ("Please convert all Tensors to FakeTensors first"). The exporter's table has them because it
# traces without fake inputs.
_KEEP_FOR_FAKE_MODE = ("lift", "lift_fresh", "lift_fresh_copy")


@functools.cache
def decompositions() -> dict[Any, Callable[..., Any]]:
    """PyTorch's decompositions, minus those of ops the ONNX exporter translates as they are."""
    table = _torch_compat.exporter("_decomp").create_onnx_friendly_decomposition_table(_exporter_ops.overloads())  # type: ignore[arg-type]
    for name in _KEEP_FOR_FAKE_MODE:
        packet = getattr(torch.ops.aten, name)
        for overload in packet.overloads():
            table.pop(getattr(packet, overload), None)
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
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    compile_inference: InferenceCompiler,
    on_plain: Callable[[], None] | None = None,
) -> Callable[..., Any]:
    """Run aot_autograd for inference and hand the frozen ATen graph to `compile_inference`.

    The result is our compiled graph itself when aot_autograd has nothing to do around it at run
    time (see `plain_calling_convention`; `on_plain` is then called): its runtime wrappers would
    cost every call several microseconds for nothing. Otherwise it is aot_autograd's wrapped
    function.
    """
    weights = {i: t for i, t in enumerate(example_inputs) if is_weight(t)}
    compiled: list[tuple[Callable[..., Any], bool]] = []

    def inference_compiler(aten_gm: torch.fx.GraphModule, args: Sequence[Any]) -> Any:
        # aot_autograd calls us under its fake mode; export and build need real tensors.
        with _torch_compat.unset_fake_temporarily():
            # a static tensor that the graph writes (a static KV cache, marked with
            # mark_static_address as Hugging Face's StaticCache does) is state, not a weight: frozen,
            # every call would look like changed weights
            written = mutated_inputs(aten_gm)
            freeze(aten_gm, {i: t for i, t in weights.items() if i not in written})
            rewritten = scatter_cache_writes(aten_gm, written)
            if rewritten:
                _stats.count("cache_writes_in_place", rewritten)
            views_to_reshapes(aten_gm)
            fn = compile_inference(aten_gm, args)
            compiled.append((fn, plain_calling_convention(aten_gm, len(example_inputs))))
            return _torch_compat.aot_autograd().make_boxed_func(fn)

    wrapped = _torch_compat.aot_autograd().aot_module_simplified(
        gm,
        list(example_inputs),
        fw_compiler=inference_compiler,  # type: ignore[arg-type]
        decompositions=decompositions(),
        keep_inference_input_mutations=True,
    )
    if len(compiled) != 1 or not compiled[0][1]:
        return wrapped  # type: ignore[no-any-return]
    if on_plain is not None:
        on_plain()
    return without_autocast(compiled[0][0])


def without_autocast(direct: Callable[..., Any]) -> Callable[..., Any]:
    """`direct` run as aot_autograd's wrapper runs a graph: with autocast off (`direct` itself
    when it says it turns autocast off)."""
    if getattr(direct, "autocast_off", False):
        return direct

    def run(*args: Any) -> Any:
        if _torch_compat.is_any_autocast_enabled():
            with _torch_compat.DisableAutocast():
                return direct(*args)
        return direct(*args)

    return run


def plain_calling_convention(aten_gm: torch.fx.GraphModule, n_inputs: int) -> bool:
    """Whether the ATen graph takes Dynamo's inputs as they are and returns fresh outputs, so that
    calling it directly is what aot_autograd's runtime wrappers would do: no input mutations to
    apply, no outputs to regenerate as views, no deduplicated inputs, no RNG or effect tokens."""
    schemas = _torch_compat.aot_schemas()
    OutputType, SubclassCreationMeta = schemas.OutputType, schemas.SubclassCreationMeta
    context = _torch_compat.tracing_context()
    meta = getattr(context, "fw_metadata", None)
    placeholders = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
    return (
        meta is not None
        and len(placeholders) == n_inputs == len(meta.input_info)
        and not any(i.mutates_data or i.mutates_metadata or i.mutates_storage_metadata for i in meta.input_info)
        and all(o.output_type == OutputType.non_alias for o in meta.output_info)
        and meta.num_intermediate_bases == 0
        and not meta.is_rng_op_functionalized
        and not meta.tokens
        and not getattr(meta, "num_graphsafe_rng_states", 0)
        and all(not isinstance(m, SubclassCreationMeta) for m in meta.subclass_inp_meta or ())
    )


_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def views_to_reshapes(gm: torch.fx.GraphModule) -> None:
    """Make the graph's views reshapes: the same values, for inputs of any layout.

    aot_autograd records a reshape as a view wherever the traced layout allows one. Regions
    change layouts: an engine returns its outputs contiguous where the trace had, say, a
    transposed tensor, and a fused kernel replaced in a region lays out its output its own way.
    A view recorded for the traced layout then fails ("view size is not compatible"); a reshape
    is a view where one is possible and a copy where not. The graph is functional (no mutation
    through views), so nothing else changes; in ONNX both are Reshape.
    """
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _VIEWS:
            node.target = torch.ops.aten.reshape.default
            changed = True
    if changed:
        gm.recompile()


def mutated_inputs(gm: torch.fx.GraphModule) -> set[int]:
    """The indices of the graph's inputs that it writes in place (aot_autograd keeps an inference
    graph's input mutations in the graph: copy_, index_copy_ and the like on the placeholder)."""
    written = set()
    for index, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        for user in node.users:
            schema = getattr(user.target, "_schema", None)  # OpOverload's schema (no public accessor)
            if schema is None or not schema.is_mutable:
                continue
            given = dict(zip((a.name for a in schema.arguments), user.args)) | dict(user.kwargs)
            if any(given.get(a.name) is node and a.alias_info is not None and a.alias_info.is_write
                   for a in schema.arguments):
                written.add(index)
    return written


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


# CUDA's fused attention kernels, as PyTorch's dispatcher picks them while tracing: the exporter
# cannot translate them all (its efficient-attention translation fails on the logsumexp output),
# but it translates the op they implement. Positional arguments after (query, key, value).
_FUSED_ATTENTION = {
    torch.ops.aten._scaled_dot_product_efficient_attention.default: ("attn_mask", None, "dropout_p", "is_causal"),
    torch.ops.aten._scaled_dot_product_flash_attention.default: ("dropout_p", "is_causal"),
    torch.ops.aten._scaled_dot_product_cudnn_attention.default: ("attn_mask", None, "dropout_p", "is_causal"),
}


def unfusable(node: torch.fx.Node) -> bool:
    """Whether `node` is a fused attention kernel that unfuse_attention turns into the plain op."""
    return node.op == "call_function" and node.target in _FUSED_ATTENTION and all(
        u.target is operator.getitem and u.args[1] == 0 for u in node.users
    )
