"""`rtx_backend.load`: a package saved by `rtx_backend.save`, ready to run with none of the compiler
(no Dynamo, no aot_autograd, no exporter).

A package is a `.pt2` of torch.export.save whose graph calls `trtrtx::engine` for each region
(tools/save.py writes it). What reads and runs it is split by concern:

- package_archive.py: the manifest and the archive's integrity (sizes, SHA-256s, HMAC, no pickles);
- package_graph.py: the package's own JSON form of the graph, rebuilt with torch.fx;
- package_op.py: the `trtrtx::engine` op, its fake kernel, the region module of each plan buffer;
- package_region.py: one saved region's runtime module and the options it runs with;
- here: `load` (those checks, then the graph, with each op call replaced by its region module:
  what a compiled model calls, no dispatcher round trip per call).
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .._errors import PackageError
from .package_archive import top_folder, verify
from .package_graph import graph_module
from .package_op import host_bytes
from .package_region import parse_meta, region_module, runtime_options


def load(path: str | os.PathLike[str], *, device: str | torch.device | None = None,
         options: Mapping[str, Any] | None = None, key: bytes | None = None) -> torch.nn.Module:
    """A package saved by `rtx_backend.save`, ready to run: no trace, no export, no build.

    The archive is checked first (see `verify`: a truncated, altered or foreign file raises
    PackageError before torch.export.load reads it; with `key`, its HMAC too). Then each region
    gets its runtime module: TensorRT-RTX where this GPU is one of the recorded targets and the
    installed TensorRT-RTX is the one that built the engines, else ONNX Runtime with one warning
    (or PackageError where the package holds no ONNX models). `device`: where the model runs
    (default: CUDA when there is a GPU); `options`: runtime options (runtime,
    cuda_graph_strategy, dynamic_shapes_kernel_specialization_strategy, strict, default_max_dim,
    runtime_cache_path). The engine and graph caches are never touched.

    The graph is rebuilt from the package's own JSON form of it with torch.fx (torch.export.load
    would import Dynamo, seconds of a fresh process); a package without one (a graph that form
    cannot express) goes through torch.export.load.
    """
    manifest = verify(path, key)
    overrides = dict(options or {})
    runtime_options({"options": manifest.get("options", {})}, overrides)  # bad keys raise before the load
    target = torch.device(device) if device is not None else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    if target.type == "cuda" and target.index is None:
        target = torch.device("cuda", torch.cuda.current_device())
    graph = manifest.get("graph")
    if graph:
        try:
            with zipfile.ZipFile(os.fspath(path)) as archive:
                gm, out_spec = graph_module(archive, top_folder(archive.namelist()), graph, target)
        except PackageError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
            raise PackageError(f"{os.fspath(path)}: its graph cannot be rebuilt ({type(exc).__name__}: {exc})") from exc
        swap_in_regions(gm, target, overrides)
        return LoadedPackage(gm, out_spec, graph["inputs"])
    program = torch.export.load(os.fspath(path))
    if target.type != "cpu":
        from torch.export.passes import move_to_device_pass

        program = move_to_device_pass(program, target)
    module = program.module()
    swap_in_regions(module, target, overrides)
    return module


def swap_in_regions(module: torch.fx.GraphModule, device: torch.device, overrides: Mapping[str, Any]) -> None:
    """Replace each trtrtx::engine call by a call of its region module (made now: engines are
    deserialized at load, not on the first call), and drop the engine and ONNX buffers from the
    module (the region modules hold the bytes they need). torch.export's check of the input
    shapes runs only when they change."""
    op = torch.ops.trtrtx.engine.default
    graph = module.graph
    index = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not op:
            continue
        plan_node, onnx_node, meta, inputs = node.args
        plan = _attr(module, plan_node)
        onnx = _attr(module, onnx_node)
        region = region_module(host_bytes(plan), host_bytes(onnx), parse_meta(meta), device, overrides)
        name = f"trtrtx_region_{index}"
        index += 1
        module.add_submodule(name, region)
        with graph.inserting_before(node):
            call = graph.call_module(name, tuple(inputs))
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        graph.erase_node(node)
        for used in (plan_node, onnx_node):
            if not used.users:
                target = str(used.target)
                graph.erase_node(used)
                _delete_attr(module, target)
    graph.lint()
    module.recompile()
    _check_shapes_on_change(module)


def _attr(module: torch.nn.Module, node: Any) -> torch.Tensor:
    value: Any = module
    for part in str(node.target).split("."):
        value = getattr(value, part)
    if not isinstance(value, torch.Tensor):
        raise PackageError(f"{node.target} of the package is not a tensor")
    return value


def _delete_attr(module: torch.nn.Module, target: str) -> None:
    owner_path, _, name = target.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    if name in owner._buffers:
        del owner._buffers[name]
    elif hasattr(owner, name):
        delattr(owner, name)


def _check_shapes_on_change(module: torch.nn.Module) -> None:
    """torch.export's module checks its inputs against the exported ranges on every call (a
    Python walk over every dim); the compiled model's guards cost far less. Run the check when
    the input shapes differ from the last ones that passed."""
    hooks = module._forward_pre_hooks
    for hook_id, hook in list(hooks.items()):
        if getattr(hook, "__name__", "") != "_check_input_constraints_pre_hook":
            continue
        passed: list[Any] = [None]
        check = hook

        def on_change(self: Any, args: Any, kwargs: Any, check: Any = check, passed: list[Any] = passed) -> None:
            shapes = tuple(a.shape if isinstance(a, torch.Tensor) else a for a in args)
            if shapes == passed[0] and not kwargs:
                return
            check(self, args, kwargs)
            passed[0] = shapes

        hooks[hook_id] = on_change
        module._forward_pre_hooks_with_kwargs[hook_id] = True


class LoadedPackage(torch.nn.Module):
    """What `rtx_backend.load` returns for a package that holds its own graph: the graph module
    (its regions swapped in), called with the model's positional arguments, returning what the
    model returns. Each input's dtype and static sizes are checked when the input shapes change."""

    def __init__(self, graph: torch.fx.GraphModule, out_spec: Any, inputs: Sequence[Mapping[str, Any]]) -> None:
        super().__init__()
        self.graph_module = graph
        self.out_spec = out_spec
        self.inputs = [(getattr(torch, i["dtype"]), tuple(i["shape"])) for i in inputs]
        self.checked: Any = None
        from .._torch_compat import tree_unflatten

        self.unflatten = tree_unflatten
        self.leaf = out_spec.is_leaf() if hasattr(out_spec, "is_leaf") else False

    def forward(self, *args: torch.Tensor) -> Any:
        shapes = tuple(a.shape if isinstance(a, torch.Tensor) else None for a in args)
        if shapes != self.checked:
            self.check(args)
            self.checked = shapes
        outputs = self.graph_module(*args)
        return self.unflatten(list(outputs), self.out_spec)

    def check(self, args: Sequence[Any]) -> None:
        if len(args) != len(self.inputs):
            raise PackageError(f"the package takes {len(self.inputs)} tensor argument(s), got {len(args)}")
        for index, (arg, (dtype, shape)) in enumerate(zip(args, self.inputs)):
            if not isinstance(arg, torch.Tensor) or arg.dtype != dtype or arg.dim() != len(shape) or any(
                    s is not None and s != a for s, a in zip(shape, arg.shape)):
                got = f"{arg.dtype} {tuple(arg.shape)}" if isinstance(arg, torch.Tensor) else type(arg).__name__
                want = "x".join("*" if s is None else str(s) for s in shape)
                raise PackageError(f"argument {index} must be a {dtype} tensor of shape [{want}] (* : dynamic), "
                                   f"got {got}")
