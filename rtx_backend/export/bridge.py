"""ONNX bridge: one region (an ATen FX GraphModule) -> one ONNX model, via torch.onnx (dynamo).

Symbolic sizes that enter a region as SymInt inputs are recomputed inside the region from the
tensor inputs' dimensions, so the ONNX model takes tensors only and its dynamic dimensions are
named dim_params. Inputs and outputs get stable names: input_0.., output_0..

Long because the rewrites of the region graph that the export needs (symbolic sizes from the
inputs, fused attention made plain, broadcast weight matmuls as one GEMM) sit next to the
exporter call they prepare, and each is only meaningful for it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import logging
import operator
import re
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from .. import _stats, _torch_compat
from .._errors import BuildError
from .._log import say_once
from .._types import OnnxRegion, TensorSpec
from ..export.doubles import truncate_doubles
from ..export.model import OnnxModel
from ..export.optimize import optimize as optimize_program
from ..export.program import direct_program
from ..export.rewrite import transposes_into_gemm
from ..lower.lowering import _FUSED_ATTENTION, unfusable, views_to_reshapes

log = logging.getLogger("rtx_backend")

EXPORTED_AS = "gm."  # a region constant `c` is the model's initializer "gm.c" (the export wrapper's attribute)
FROZEN = re.compile(r"(?:^|\.)_frozen_(\d+)$")  # a constant lowering froze from Dynamo input i (_lowering.freeze)


def _spec(name: str, val: torch.Tensor) -> TensorSpec:
    shape: list[int | str] = []
    hint: list[int] = []
    bounds: list[tuple[int, int | None]] = []
    for size in val.shape:
        if isinstance(size, torch.SymInt) and not size.node.expr.is_number:
            node = size.node
            shape.append(str(node.expr).replace(" ", ""))
            hint.append(_example_size(size))
            rng = node.shape_env.bound_sympy(node.expr)
            upper = int(rng.upper) if rng.upper.is_Integer else None  # int_oo is not an Integer
            bounds.append((int(rng.lower) if rng.lower.is_Integer else 0, upper))
        else:
            shape.append(int(size))
            hint.append(int(size))
            bounds.append((int(size), int(size)))
    return TensorSpec(name, tuple(shape), val.dtype, tuple(hint), tuple(bounds))


def _example_size(size: torch.SymInt) -> int:
    """The size of `size` in the export example: Dynamo's hint, with every symbol at least 2.

    torch.export specializes a dimension whose example is 0 or 1, so a symbol whose hint is
    below 2 (backed_size_oblivious, unbacked sizes) is evaluated at 2. Symbols, not sizes, are
    bumped, so that related dimensions (s0, s0*s1, s0//2) stay consistent across inputs.
    """
    expr = size.node.expr
    env = size.node.shape_env
    hints = _torch_compat.shape_env_hints(env)
    values = {}
    for sym in expr.free_symbols:
        hint = hints.get(sym)
        upper = env.var_to_range[sym].upper if sym in env.var_to_range else None
        value = max(int(hint) if hint is not None and hint.is_Integer else 2, 2)
        if upper is not None and upper.is_Integer and int(upper) < value:
            value = int(upper)
        values[sym] = value
    return int(expr.xreplace(values))


def _placeholders(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def input_specs(gm: torch.fx.GraphModule) -> tuple[TensorSpec, ...]:
    """The specs export_region gives the model inputs, without exporting or editing `gm`.

    The engine cache needs them (for the profile, part of its key) before deciding to export.
    """
    vals = [n.meta.get("val") for n in _placeholders(gm)]
    tensors = [v for v in vals if isinstance(v, torch.Tensor)]
    return tuple(_spec(f"input_{k}", v) for k, v in enumerate(tensors))


def tensors_only(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """Rewrite SymInt inputs of `gm` as sizes of its tensor inputs; returns the tensor arg indices.

    A SymInt input becomes aten.sym_size of a tensor input that has it as a dimension, or, for
    an expression of such dimensions (s0*s1, s0//2, 2*s0+1), that expression computed from
    sym_size nodes (sympy's Python reference interpreter, which traces through FX proxies).
    The SymInt placeholders stay (unused) so the region keeps its calling signature.
    """
    sympy_interp, PythonReferenceAnalysis = _torch_compat.sympy_interp()

    placeholders = _placeholders(gm)
    tensor_args = tuple(i for i, n in enumerate(placeholders) if isinstance(n.meta.get("val"), torch.Tensor))
    sources: dict[Any, tuple[torch.fx.Node, int]] = {}  # sympy expr -> (tensor input, dim)
    for i in tensor_args:
        node = placeholders[i]
        for dim, size in enumerate(node.meta["val"].shape):
            if isinstance(size, torch.SymInt):
                sources.setdefault(size.node.expr, (node, dim))
    tracer = torch.fx.proxy.GraphAppendingTracer(gm.graph)

    def size_of(expr: Any) -> torch.fx.Proxy:
        src, dim = sources[expr]
        return torch.fx.Proxy(gm.graph.call_function(torch.ops.aten.sym_size.int, (src, dim)), tracer)

    first_op = _placeholders_first(gm)
    for i, node in enumerate(placeholders):
        val = node.meta.get("val")
        if i in tensor_args or not node.users:
            continue
        if isinstance(val, int) or (isinstance(val, torch.SymInt) and val.node.expr.is_number):
            _replace_with_constant(node, int(val))
            continue
        if not isinstance(val, torch.SymInt):
            raise BuildError(f"region input {node.name} is a {type(val).__name__}, not a tensor or size")
        expr = val.node.expr
        missing = sorted(str(s) for s in expr.free_symbols if s not in sources)
        if expr not in sources and missing:
            raise BuildError(
                f"symbolic size {expr} of {node.name} needs {', '.join(missing)}, which is not a "
                "dimension of any region input"
            )
        with gm.graph.inserting_before(first_op):  # keeps the new nodes in creation order
            if expr in sources:
                value = size_of(expr)
            else:
                env = {s: size_of(s) for s in expr.free_symbols}
                try:
                    value = sympy_interp(PythonReferenceAnalysis, env, expr)
                except Exception as exc:  # a sympy function without a Python counterpart
                    raise BuildError(f"symbolic size {expr} of {node.name} cannot be computed: {exc}") from exc
        if not isinstance(value, torch.fx.Proxy):
            raise BuildError(f"symbolic size {expr} of {node.name} could not be rebuilt in the region")
        value.node.meta["val"] = val
        node.replace_all_uses_with(value.node)
    gm.graph.lint()
    gm.recompile()
    return tensor_args


def _placeholders_first(gm: torch.fx.GraphModule) -> torch.fx.Node:
    """Move the placeholders (kept in order) before every other node; returns the first other node.

    Fused regions interleave placeholders with computations; sizes rebuilt from the inputs must
    come before any use, so they go right after the inputs.
    """
    for node in _placeholders(gm):
        first = next(n for n in gm.graph.nodes if n.op != "placeholder" or n is node)
        if first is not node:
            first.prepend(node)
    return next(n for n in gm.graph.nodes if n.op != "placeholder")


def _replace_with_constant(node: torch.fx.Node, value: int) -> None:
    """Pass a size that Dynamo specialized as a literal to every user of `node`."""
    for user in list(node.users):
        user.args = torch.fx.node.map_arg(user.args, lambda a: value if a is node else a)  # type: ignore[arg-type,return-value]
        user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a: value if a is node else a)  # type: ignore[arg-type,return-value]


def _example(spec: TensorSpec, device: torch.device | str = "cpu") -> torch.Tensor:
    if spec.dtype.is_floating_point:
        return torch.randn(spec.hint, device=device).to(spec.dtype)
    if spec.dtype == torch.bool:
        return torch.ones(spec.hint, dtype=torch.bool, device=device)
    return torch.ones(spec.hint, dtype=spec.dtype, device=device)


def _dynamic_shapes(specs: Sequence[TensorSpec]) -> tuple[tuple[dict[int, Any], ...]] | None:
    if not any(s.dynamic for s in specs):
        return None
    dims: dict[str, Any] = {}
    out = []
    for spec in specs:
        per_input = {}
        for axis, size in enumerate(spec.shape):
            if isinstance(size, str):
                if size.isidentifier():
                    # Dynamo's range for the symbol (usually from 2: it specializes 0 and 1), so
                    # that a guard the region's ops add within it (size != 1) is no violation
                    lo, hi = spec.bounds[axis] if axis < len(spec.bounds) else (0, None)
                    bounds = {"min": lo} if hi is None else {"min": lo, "max": hi}
                    per_input[axis] = dims.setdefault(size, torch.export.Dim(size, **bounds))
                else:
                    per_input[axis] = torch.export.Dim.DYNAMIC
        out.append(per_input)
    return (tuple(out),)


class _Wrapper(torch.nn.Module):
    """Presents only the tensor arguments to the exporter."""

    def __init__(self, gm: torch.fx.GraphModule, tensor_args: tuple[int, ...], n_args: int) -> None:
        super().__init__()
        self.gm = gm
        self.tensor_args = tensor_args
        self.n_args = n_args

    def forward(self, *tensors: torch.Tensor) -> Any:
        args: list[Any] = [None] * self.n_args
        for i, t in zip(self.tensor_args, tensors):
            args[i] = t
        return tuple(self.gm(*args))


def unfuse_attention(gm: torch.fx.GraphModule) -> None:
    """Replace fused attention kernels whose only used output is the attention itself by
    aten.scaled_dot_product_attention (same inputs, same result), which the exporter translates.

    The fused kernels return their output in their own memory layout, and aot_autograd recorded
    the views after them for that layout; the plain op's output is laid out differently, so the
    region's views become reshapes (see views_to_reshapes)."""
    unfused = False
    for node in list(gm.graph.nodes):
        if not unfusable(node):
            continue
        names = _FUSED_ATTENTION[node.target]
        kwargs = {k: v for k, v in zip(names, node.args[3:]) if k is not None}
        if "scale" in node.kwargs:
            kwargs["scale"] = node.kwargs["scale"]
        with gm.graph.inserting_before(node):
            plain = gm.graph.call_function(torch.ops.aten.scaled_dot_product_attention.default, node.args[:3], kwargs)
        for user in list(node.users):
            plain.meta["val"] = user.meta.get("val")
            user.replace_all_uses_with(plain)
            gm.graph.erase_node(user)
        gm.graph.erase_node(node)
        unfused = True
    if unfused:
        views_to_reshapes(gm)
    gm.graph.lint()
    gm.recompile()


_ATTENTION = (
    torch.ops.aten.scaled_dot_product_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
)


def expand_grouped_attention(gm: torch.fx.GraphModule) -> None:
    """Give grouped-query attention (fewer key/value heads than query heads: enable_gqa=True,
    Llama's num_key_value_heads) as many key/value heads as query heads, each repeated for its
    group, as PyTorch computes it.

    The exporter translates attention as MatMuls of query and key as they are, which TensorRT-RTX's
    parser rejects when the head counts differ ("broadcast dimensions must be conformable"). The
    repeat is an unsqueeze, expand and flatten (what Hugging Face's repeat_kv does), which
    export and parse everywhere."""
    aten = torch.ops.aten
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _ATTENTION:
            continue
        q, k, v = (a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in node.args[:3])
        if not all(isinstance(t, torch.Tensor) and t.dim() >= 3 for t in (q, k, v)):
            continue
        assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)
        heads, kv_heads = _hint(q.shape[-3]), _hint(k.shape[-3])
        if heads is None or kv_heads is None or heads == kv_heads or heads % kv_heads:
            continue
        rank = k.dim()
        repeated = []
        with gm.graph.inserting_before(node):
            group: Any = heads // kv_heads
            if not (isinstance(q.shape[-3], int) and isinstance(k.shape[-3], int)):  # head counts symbolic
                sizes = [gm.graph.call_function(aten.sym_size.int, (a, rank - 3)) for a in node.args[:2]]
                group = gm.graph.call_function(operator.floordiv, tuple(sizes))
            for arg in node.args[1:3]:
                x = gm.graph.call_function(aten.unsqueeze.default, (arg, rank - 2))
                x = gm.graph.call_function(aten.expand.default, (x, [-1] * (rank - 2) + [group, -1, -1]))
                repeated.append(gm.graph.call_function(aten.flatten.using_ints, (x, rank - 3, rank - 2)))
        node.args = (node.args[0], *repeated, *node.args[3:])
        node.kwargs = {k: v for k, v in node.kwargs.items() if k != "enable_gqa"}
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()


_RESHAPES = (torch.ops.aten.view.default, torch.ops.aten.reshape.default, torch.ops.aten._unsafe_view.default)


def unbroadcast_weight_matmuls(gm: torch.fx.GraphModule) -> None:
    """Turn a batched matmul against a 2-D weight broadcast over the batch into one GEMM.

    `linear` on a 3-D input that is not contiguous (nn.MultiheadAttention's in-projection of the
    sequence-first query) decomposes into `bmm(x, expand(W.t(), [B, K, N]))`: the weight copied B
    times. Exported as it is, TensorRT-RTX materialises that copy (a replicate kernel of the whole
    weight per batch row: 27 of the 31 ms of a 12-layer ViT-B engine on an H200, against 1.4 ms
    for the same model written with scaled_dot_product_attention). The same values come from
    `mm(reshape(x, [B*M, K]), W.t())` reshaped to [B, M, N], which is a plain GEMM."""
    aten = torch.ops.aten
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.bmm.default:
            continue
        x, w = node.args[:2]
        weight = _broadcast_source(w)
        out = node.meta.get("val")
        if weight is None or not isinstance(x, torch.fx.Node) or not isinstance(out, torch.Tensor):
            continue
        k = weight.meta["val"].shape[0]
        with gm.graph.inserting_before(node):
            sizes = [gm.graph.call_function(aten.sym_size.int, (x, d)) if not isinstance(out.shape[d], int)
                     else out.shape[d] for d in range(2)]
            flat = gm.graph.call_function(aten.reshape.default, (x, [-1, k]))
            product = gm.graph.call_function(aten.mm.default, (flat, weight))
            folded = gm.graph.call_function(aten.reshape.default, (product, [*sizes, out.shape[2]]))
        folded.meta["val"] = out  # what later passes read of the replaced node
        _values(flat, product, x, weight, k)
        node.replace_all_uses_with(folded)
        gm.graph.erase_node(node)
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
        _stats.count("weight_broadcasts_unfolded")


def _values(flat: torch.fx.Node, product: torch.fx.Node, x: torch.fx.Node, weight: torch.fx.Node, k: int) -> None:
    """The fake values of the new reshape and GEMM, as every node of the region has one (a static
    region then needs no trace to be exported: export/program.py); left out where they cannot be
    computed (torch.export then traces the region)."""
    xv, wv = x.meta.get("val"), weight.meta.get("val")
    if not (isinstance(xv, torch.Tensor) and isinstance(wv, torch.Tensor)):
        return
    try:
        with _torch_compat.unset_fake_temporarily():  # the values' own fake mode computes them
            flat_val = xv.reshape(-1, k)
            product_val = torch.mm(flat_val, wv)
    except Exception as exc:
        log.debug("trtrtx: no values for the unfolded GEMM (%s)", _first_line(exc))
        return
    flat.meta["val"], product.meta["val"] = flat_val, product_val


def _broadcast_source(node: Any) -> torch.fx.Node | None:
    """The 2-D tensor that `node` (views of an expand over a new leading dim) broadcasts, if it is one."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in _RESHAPES:
        node = node.args[0]
    if not (isinstance(node, torch.fx.Node) and node.op == "call_function"
            and node.target is torch.ops.aten.expand.default):
        return None
    source = node.args[0]
    val = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    expanded = node.meta.get("val")
    if not (isinstance(val, torch.Tensor) and isinstance(expanded, torch.Tensor)):
        return None
    if val.dim() != 2 or expanded.dim() != 3 or tuple(expanded.shape[1:]) != tuple(val.shape):
        return None
    return source if isinstance(source, torch.fx.Node) else None


def _hint(size: Any) -> int | None:
    """A size's value, or the value traced for a symbolic one (None if it has none)."""
    if isinstance(size, int):
        return size
    hint = getattr(getattr(size, "node", None), "hint", None)
    return int(hint) if hint is not None else None


def export_region(gm: torch.fx.GraphModule, *, optimize: bool = True, keep_weights: bool = False) -> OnnxRegion:
    """Export one region to ONNX; raises BuildError with the exporter's message on failure.
    `keep_weights`: each frozen weight stays an initializer of its own, by name and as it is in
    PyTorch (the optimizer folds nothing into it), so that new weights can replace it: see
    assemble/weights.py."""
    tensor_args = tensors_only(gm)
    truncate_doubles(gm)  # (float64 reaches a region only with truncate_double)
    unfuse_attention(gm)
    expand_grouped_attention(gm)
    unbroadcast_weight_matmuls(gm)
    placeholders = _placeholders(gm)
    inputs = tuple(_spec(f"input_{k}", placeholders[i].meta["val"]) for k, i in enumerate(tensor_args))
    output_node = next(n for n in gm.graph.nodes if n.op == "output")
    out_vals = [a.meta.get("val") for a in output_node.args[0]]
    if not all(isinstance(v, torch.Tensor) for v in out_vals):
        raise BuildError("a region output is not a tensor")
    outputs = tuple(_spec(f"output_{k}", v) for k, v in enumerate(out_vals))
    wrapper = _Wrapper(gm, tensor_args, len(placeholders))
    # examples live where the region's weights live (a CUDA model exports with CUDA examples)
    args = tuple(_example(s, placeholders[i].meta["val"].device) for s, i in zip(inputs, tensor_args))

    def export() -> Any:
        with _outside_dynamo(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            exported = _direct(gm)  # (None for a dynamic region: torch.export traces it)
            # Non-strict torch.export only: the exporter's next strategy, strict export, runs Dynamo,
            # which waits for the compile lock that the user's compile (our caller) holds: a deadlock.
            try:
                if exported is None:
                    _stats.count("exports_traced")
                    with _attention_without_shape_checks(gm, inputs):
                        exported = _export_non_strict(wrapper, args, _dynamic_shapes(inputs))
            except Exception as exc:
                raise BuildError(f"torch.export failed: {_first_line(exc)}") from exc
            return _to_onnx(exported, args, [s.name for s in inputs], [s.name for s in outputs], optimize,
                            keep_weights)

    try:
        # A thread of its own: the exporter starts from clean thread-local state (no Dynamo eval-frame
        # callback, tracing context or fake mode of the user's compile), and an export that fails
        # half-way cannot leave its modes behind in the thread that goes on running the model.
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="trtrtx-export") as pool:
            program = pool.submit(export).result()
    except BuildError:
        raise
    except Exception as exc:
        raise BuildError(f"ONNX export failed: {_first_line(exc)}") from exc
    if program is None:
        raise BuildError("ONNX export returned nothing")
    return OnnxRegion(OnnxModel(program.model), tensor_args, inputs, outputs)


def _to_onnx(
    exported: Any, args: tuple[torch.Tensor, ...], input_names: list[str], output_names: list[str], optimize: bool,
    keep_weights: bool = False,
) -> Any:
    """torch.onnx.export of the exported program, through lower/registry.py (which skips the registry
    rebuild of every public call) where this torch's private exporter API allows; weight
    transposes are folded into Gemm flags before the exporter's optimizer runs (export/rewrite.py),
    which runs with its multi-node rewrite rules anchored (export/optimize.py).

    With `keep_weights`, the frozen weights are graph inputs while the optimizer runs: it folds
    constants only, so a BatchNormalization stays one (TensorRT-RTX fuses it into the convolution
    itself, and its refitter redoes that fusion from new weights), and each weight reaches the
    parser under its own name with its own values."""
    program = _translate(exported, args, input_names, output_names)
    folded = transposes_into_gemm(program.model)
    if folded:
        _stats.count("weight_transposes_folded", folded)
    if optimize:
        graph = program.model.graph
        kept = [v for n, v in graph.initializers.items() if FROZEN.search(n)] if keep_weights else []
        graph.inputs.extend(kept)
        try:
            optimize_program(program)
        finally:
            for value in kept:
                if value in graph.inputs:
                    graph.inputs.remove(value)
    return program


def _translate(exported: Any, args: tuple[torch.Tensor, ...], input_names: list[str], output_names: list[str]) -> Any:
    """The exported program in ONNX, not optimized."""
    try:
        from ..lower import registry as _registry
    except (ImportError, AttributeError) as exc:  # the exporter's private modules moved
        say_once(f"trtrtx: the exporter's private modules are not importable ({exc}); using torch.onnx.export",
                 logging.DEBUG, key="export: no private exporter")
    else:
        program = _registry.translate(
            exported, args, input_names=input_names, output_names=output_names, optimize=False
        )
        if program is not None:
            return program
    return torch.onnx.export(
        exported,
        args,
        dynamo=True,
        input_names=input_names,
        output_names=output_names,
        optimize=False,
        verbose=False,
        report=False,
    )



def _direct(gm: torch.fx.GraphModule) -> Any:
    """The static region as an ExportedProgram without tracing it again (export/program.py), or
    None: torch.export then traces it, as it does when this fails."""
    try:
        program = direct_program(gm, EXPORTED_AS)
    except Exception as exc:  # a graph this does not read: torch.export's trace reads it
        log.debug("trtrtx: the region is traced by torch.export (%s)", _first_line(exc))
        program = None
    if program is not None:
        _stats.count("exports_untraced")
    return program


def _export_non_strict(module: torch.nn.Module, args: tuple[torch.Tensor, ...], dynamic_shapes: Any) -> Any:
    """torch.export, non-strict, as the ONNX exporter's first strategy does it: size-oblivious
    0/1 dimensions, and one retry with torch.export's suggested fixes to the dynamic shapes
    (a dimension that the graph pins to another, or to a constant)."""
    config = _torch_compat.fx_experimental_config()
    patch = (
        config.patch(backed_size_oblivious=True)  # type: ignore[attr-defined]
        if hasattr(config, "backed_size_oblivious") else contextlib.nullcontext()
    )
    with patch:
        try:
            return torch.export.export(module, args, dynamic_shapes=dynamic_shapes, strict=False)
        except _torch_compat.dynamo_exc().UserError as exc:
            try:
                refined = torch.export.dynamic_shapes.refine_dynamic_shapes_from_suggested_fixes(exc.msg, dynamic_shapes)
            except Exception:
                raise exc from None
            return torch.export.export(module, args, dynamic_shapes=refined, strict=False)


def _attention_without_shape_checks(gm: torch.fx.GraphModule, inputs: Sequence[TensorSpec]) -> Any:
    """For a dynamic region with attention on CUDA: trace under the math attention backend.

    On CUDA, tracing scaled_dot_product_attention asks which fused kernel fits the shapes, and
    those checks put guards on the symbolic sizes (torch.export: "Constraints violated"). The
    node recorded is scaled_dot_product_attention whichever backend is picked, so the ONNX model
    is the same; with only the math backend allowed, no kernel's conditions are checked. (The
    backend flags are process-wide: a model running in another thread during the export would
    use the math backend for that time.)"""
    attention = any(n.target is torch.ops.aten.scaled_dot_product_attention.default for n in gm.graph.nodes)
    cuda = any(getattr(n.meta.get("val"), "is_cuda", False) for n in _placeholders(gm))
    if not (attention and cuda and any(s.dynamic for s in inputs)):
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH])


@contextlib.contextmanager
def _outside_dynamo() -> Iterator[None]:
    """Export runs inside Dynamo's compile of the user's model; hide that context from it.

    Otherwise torch.export picks up the outer tracing context (its fake mode and ShapeEnv) and
    adds its guards to the user's graph. The exporter's chatty loggers are quieted too.
    """
    quiet = [logging.getLogger(n) for n in ("onnxscript", "onnx_ir", "torch.onnx", "torch.export")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    try:
        with _torch_compat.outside_tracing():
            yield
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
