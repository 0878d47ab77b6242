"""`rtx_backend.save`: a model compiled ahead of time into one `.pt2` (see assemble/package.py for the format).

    torch.export (dynamic_shapes) -> the backend's lowering table (run_decompositions), weights
    frozen -> the backend's policy, partition, ONNX bridge and engine build (compile_regions)
    -> each region replaced by a trtrtx::engine call whose engine and ONNX model are uint8
    buffers -> torch.export of that graph -> torch.export.save -> the manifest sealed in

The regions' weights live only in their engines (and ONNX models): the region submodules, which
held them as constants, are gone from the saved graph; what stays in PyTorch keeps its own.

Long because saving is one sequence: export, lowering, the regions' builds, the packaged graph
and its JSON form, and the manifest, each step feeding the next.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from .. import _torch_compat, _trt
from .._defaults import with_defaults
from .._errors import OptionsError, PackageError
from .._options import Options
from ..assemble import package_archive as _archive
from ..assemble import package_graph as _graph_form
from ..assemble import package_region as _saved_region

log = logging.getLogger("rtx_backend")


@dataclasses.dataclass(frozen=True)
class SavedPackage:
    """What `save` wrote: the path, the archive's size, the engines' and ONNX models' sizes, and
    where each region runs on this machine."""

    path: Path
    size: int
    engine_bytes: int
    onnx_bytes: int
    regions: tuple[str, ...]
    eager_ops: int


def save(
    model: torch.nn.Module,
    example_inputs: Any,
    path: str | os.PathLike[str],
    *,
    options: Mapping[str, Any] | Options | None = None,
    dynamic_shapes: Any = None,
    onnx: bool = True,
    key: bytes | None = None,
) -> SavedPackage:
    """Compile `model` ahead of time and write it to `path` as one `.pt2` that loads and runs
    with `rtx_backend.load(path)` or `torch.export.load(path).module()`: no trace, no export and
    no build at load time.

    `example_inputs`: a tensor or a tuple of tensors (positional arguments). `options`: as for
    torch.compile (`target_compute_capabilities` decides which GPUs the engines run on; without a
    GPU here, declare them: engines are built ahead of time). `dynamic_shapes`: torch.export's
    (`{"x": {0: torch.export.Dim("batch", min=1, max=64)}}`, or a tuple by position), or ranges
    as the `dynamic_shapes` option gives them (`{"x": {0: (1, 8, 64)}}`: min, opt, max of the
    engines' profile; calls outside it get a wider engine, as in a compiled model). `onnx`: also
    store each region's ONNX model, which ONNX Runtime runs where TensorRT-RTX cannot (no GPU,
    another GPU or TensorRT-RTX version) and from which wider engines are built; without them
    the package runs only on TensorRT-RTX and within its profiles, and is about half the size.
    `key`: sign the archive (HMAC-SHA256), for `load(path, key=...)` to check who wrote it.
    """
    from ..assemble.graph import compile_regions
    from ..lower import lowering as _lowering

    opts = dataclasses.replace(Options.from_dict(with_defaults(options)), weights="frozen", validate=False,
                               engine_build="wait")
    args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    if not all(isinstance(a, torch.Tensor) for a in args):
        raise PackageError("example_inputs must be a tensor or a tuple of tensors (the model's positional arguments)")
    export_shapes, ranges = _dynamic_shapes(model, args, dynamic_shapes, opts)
    with torch.no_grad(), _quiet_export():
        try:
            program = torch.export.export(model, args, dynamic_shapes=export_shapes, strict=False)
            program = program.run_decompositions(_lowering.decompositions())
        except Exception as exc:
            raise PackageError(f"torch.export of the model failed: {type(exc).__name__}: {exc}") from exc
    gm, user_inputs = frozen_graph(program)
    _lowering.views_to_reshapes(gm)
    overrides = _symbol_ranges(user_inputs, ranges)
    with torch.no_grad():
        plan = compile_regions(gm, overrides, opts)
    packaged, regions = package_graph(plan.graph_module, plan.regions, opts, onnx)
    wrapper = _AsTheModel(packaged, program.call_spec.out_spec)
    with torch.no_grad(), _quiet_export():
        try:
            final = torch.export.export(wrapper, args, dynamic_shapes=(export_shapes,) if export_shapes else None,
                                        strict=False)
        except Exception as exc:
            raise PackageError(f"torch.export of the compiled graph failed: {type(exc).__name__}: {exc}") from exc
    final.example_inputs = None  # type: ignore[assignment]  # torch.export.load would unpickle them
    manifest = {
        "format": _archive.FORMAT,
        "rtx_backend": _version("trtrtx"),
        "torch": torch.__version__,
        "tensorrt_rtx": _trt.version() if _trt.available() else None,
        "targets": built_for(opts),
        "options": recorded_options(opts),
        "regions": regions,
        "onnx": onnx,
        "graph": own_graph(packaged, program.call_spec.out_spec),
        "graph_owner": "regions",  # the packaged graph's path in the saved module (_AsTheModel)
    }
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp.pt2")
    os.close(fd)
    try:
        torch.export.save(final, temp)
        _archive.seal(Path(temp), manifest, key)
        os.replace(temp, target)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)
    saved = SavedPackage(target, target.stat().st_size, sum(r["plan"]["size"] for r in regions),
                         sum((r["onnx"] or {}).get("size", 0) for r in regions),
                         tuple(r["runs"] for r in regions), len(plan.eager_ops))
    log.info("trtrtx: saved %s: %d region(s), %d MB (engines %d MB, ONNX models %d MB), %d op(s) in PyTorch",
             target, len(regions), saved.size >> 20, saved.engine_bytes >> 20, saved.onnx_bytes >> 20,
             saved.eager_ops)
    return saved


class _AsTheModel(torch.nn.Module):
    """The packaged graph (flat inputs, flat outputs) returning what the model returns."""

    def __init__(self, graph: torch.fx.GraphModule, out_spec: Any) -> None:
        super().__init__()
        self.regions = graph  # (not `graph`: the loaded module's GraphModule has its own)
        self.out_spec = out_spec

    def forward(self, *args: torch.Tensor) -> Any:
        return _torch_compat.tree_unflatten(list(self.regions(*args)), self.out_spec)


def own_graph(packaged: torch.fx.GraphModule, out_spec: Any) -> dict[str, Any] | None:
    """The packaged graph in the package's own form (see _graph_form.encode_graph), or None."""
    try:
        return _graph_form.encode_graph(packaged, out_spec)
    except _graph_form.Unencodable as exc:
        log.info("trtrtx: the package holds no graph of its own (%s); load uses torch.export.load", exc)
        return None


def built_for(opts: Options) -> list[list[int]] | None:
    """The GPUs the engines run on: the declared targets, else this GPU (ComputeCapability.CURRENT)."""
    from .. import _targets

    if opts.target_compute_capabilities:
        return [list(t) for t in opts.target_compute_capabilities]
    current = _targets.current_capability()
    return [list(current)] if current is not None else None


def recorded_options(opts: Options) -> dict[str, Any]:
    return {k: getattr(opts, k) for k in (*_saved_region.RUNTIME_OPTIONS, "min_block_size", "optimize_onnx")} | {
        "torch_executed_ops": sorted(opts.torch_executed_ops)}


@contextlib.contextmanager
def _quiet_export() -> Any:
    quiet = [logging.getLogger(n) for n in ("torch.export", "torch._export", "torch.fx.experimental.symbolic_shapes")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)


def _dynamic_shapes(model: torch.nn.Module, args: Sequence[torch.Tensor], dynamic_shapes: Any,
                    opts: Options) -> tuple[Any, dict[tuple[int, int], tuple[int, int, int]]]:
    """torch.export's dynamic_shapes (a tuple by position), and the (min, opt, max) ranges given
    as the `dynamic_shapes` option gives them, by (input position, dim). A range becomes an
    unbounded Dim for torch.export (as Dynamo does not guard the option's ranges) and the engines'
    profile; calls outside it get a wider engine."""
    names = _argument_names(model, len(args))
    given: dict[int, Any] = {}
    for source in (opts.dynamic_shapes, dynamic_shapes):
        if source is None:
            continue
        items = source.items() if isinstance(source, Mapping) else enumerate(source)
        for k, dims in items:
            index = names.index(k) if isinstance(k, str) and k in names else k
            if not isinstance(index, int) or not 0 <= index < len(args):
                raise OptionsError(f"dynamic_shapes names input {k!r}; the model takes {names}")
            if dims is None:
                continue
            given.setdefault(index, {}).update(dims if isinstance(dims, Mapping) else dict(enumerate(dims)))
    ranges: dict[tuple[int, int], tuple[int, int, int]] = {}
    shapes: list[Any] = []
    for index, tensor in enumerate(args):
        dims = given.get(index)
        if not dims:
            shapes.append(None)
            continue
        per_dim: dict[int, Any] = {}
        for dim, spec in dims.items():
            if spec is None:
                continue
            if isinstance(spec, (tuple, list)) and len(spec) == 3 and all(isinstance(v, int) for v in spec):
                ranges[(index, dim % tensor.dim())] = (int(spec[0]), int(spec[1]), int(spec[2]))
                per_dim[dim] = torch.export.Dim(f"{names[index]}_{dim % tensor.dim()}")
            else:
                per_dim[dim] = spec
        shapes.append(per_dim or None)
    return (tuple(shapes) if any(s is not None for s in shapes) else None), ranges


def _argument_names(model: torch.nn.Module, count: int) -> list[str]:
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:count]
    return names + [f"input_{i}" for i in range(len(names), count)]


def frozen_graph(program: Any) -> tuple[torch.fx.GraphModule, list[torch.fx.Node]]:
    """The exported program's graph with its parameters, buffers and constants frozen in as
    constants (as the backend's lowering freezes them), taking the user inputs only."""
    from torch.export.graph_signature import InputKind, OutputKind

    from ..lower.lowering import freeze

    gm = program.graph_module
    signature = program.graph_signature
    if any(o.kind != OutputKind.USER_OUTPUT for o in signature.output_specs):
        raise PackageError("the model mutates its buffers or inputs when it runs (e.g. BatchNorm in training "
                           "mode); call model.eval() before saving")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    weights: dict[int, torch.Tensor] = {}
    for index, spec in enumerate(signature.input_specs):
        if spec.kind == InputKind.USER_INPUT:
            continue
        if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            raise PackageError(f"the model takes a {spec.kind.name.lower()} input, which a package cannot hold")
        value = program.state_dict.get(spec.target) if spec.target in program.state_dict else program.constants.get(spec.target)
        if not isinstance(value, torch.Tensor):
            raise PackageError(f"{spec.target} of the model is not a tensor")
        weights[index] = value.detach()
    freeze(gm, weights)
    users = []
    for index, node in enumerate(placeholders):
        if index in weights:
            if node.users:
                raise PackageError(f"{node.name} could not be frozen into the graph")
            gm.graph.erase_node(node)
        else:
            users.append(node)
    gm.graph.lint()
    gm.recompile()
    return gm, users


def _symbol_ranges(user_inputs: Sequence[torch.fx.Node], ranges: Mapping[tuple[int, int], tuple[int, int, int]]) -> Any:
    """The (min, opt, max) ranges by the graph's symbol names, as the profiles read them."""
    from ..build.profiles import SymbolRanges

    out: dict[str, tuple[int, int, int]] = {}
    labels: dict[str, str] = {}
    for index, node in enumerate(user_inputs):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for dim, size in enumerate(val.shape):
            if isinstance(size, torch.SymInt) and not size.node.expr.is_number:
                symbol = str(size.node.expr).replace(" ", "")
                labels.setdefault(symbol, f"{node.name} dim {dim}")
                if (index, dim) in ranges:
                    out[symbol] = ranges[(index, dim)]
    return SymbolRanges(out, labels)


def package_graph(gm: torch.fx.GraphModule, regions: Sequence[str], opts: Options,
                  with_onnx: bool) -> tuple[torch.fx.GraphModule, list[dict[str, Any]]]:
    """Replace each compiled region of the partitioned graph by a trtrtx::engine call on buffers
    holding its engine and ONNX model; a region that runs in PyTorch (its build failed) goes back
    into the graph as it was. Returns the graph and each region's record for the manifest."""
    from .._types import OnnxRegion
    from ..cache.engines import _region_to_json
    from ..run.executors import TorchExecutor

    op = torch.ops.trtrtx.engine.default
    graph = gm.graph
    records = []
    calls = {str(n.target): n for n in graph.nodes if n.op == "call_module"}
    for name in regions:
        module = getattr(gm, name)
        node = calls[name]
        region = module.onnx
        if isinstance(module.executor, TorchExecutor) or region is None:
            setattr(gm, name, module.graph_module)  # torch.export inlines it: the region runs in PyTorch
            log.warning("trtrtx: region %s is saved to run in PyTorch: %s", name, module.why or "it was not compiled")
            continue
        plan = bytes(module.engine) if module.engine is not None else b""
        model = region.model if with_onnx or not plan else b""
        region_json = _region_to_json(OnnxRegion(b"", tuple(range(len(region.tensor_args))), region.inputs,
                                                 region.outputs))
        profile = module.profile.profile if module.profile is not None else {}
        meta = {
            "format": _archive.FORMAT,
            "name": name,
            "region": region_json,
            "profile": {n: [list(lo), list(opt), list(hi)] for n, (lo, opt, hi) in profile.items()},
            "plan": {"size": len(plan), "sha256": hashlib.sha256(plan).hexdigest()},
            "onnx": {"size": len(model), "sha256": hashlib.sha256(model).hexdigest()},
            "targets": built_for(opts) if plan else None,
            "tensorrt_rtx": _trt.version() if plan else None,
            "options": recorded_options(opts),
        }
        gm.register_buffer(f"{name}_plan", _bytes_tensor(plan))
        gm.register_buffer(f"{name}_onnx", _bytes_tensor(model))
        with graph.inserting_before(node):
            plan_node = graph.get_attr(f"{name}_plan")
            onnx_node = graph.get_attr(f"{name}_onnx")
            inputs = [node.args[i] for i in region.tensor_args]
            call = graph.call_function(op, (plan_node, onnx_node, json.dumps(meta, sort_keys=True), inputs))
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        graph.erase_node(node)
        delattr(gm, name)
        records.append({"name": name, "runs": module.kind, "plan": meta["plan"], "onnx": meta["onnx"] if model else None})
    _drop_unused_attributes(gm)
    graph.lint()
    gm.recompile()
    return gm, records


def _bytes_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)


def _drop_unused_attributes(gm: torch.fx.GraphModule) -> None:
    """Remove the constants that only the regions used (their engines hold them now), so that
    torch.export saves no second copy of the weights; and the graph's get_attr nodes without users."""
    for node in list(gm.graph.nodes):
        if node.op == "get_attr" and not node.users:
            gm.graph.erase_node(node)
    used = {str(n.target) for n in gm.graph.nodes if n.op in ("get_attr", "call_module")}
    for name in list(gm._buffers):
        if name not in used:
            del gm._buffers[name]
    for name in list(gm._parameters):
        if name not in used:
            del gm._parameters[name]
    for name in list(gm._modules):
        if name not in used:
            del gm._modules[name]
    for name, value in list(vars(gm).items()):
        if isinstance(value, torch.Tensor) and name not in used:
            delattr(gm, name)


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"

