"""The package's own form of the saved graph, so that `rtx_backend.load` needs no torch.export.load.

torch.export.load imports Dynamo (torch._export.serde imports torch._export.non_strict_utils,
which imports torch._dynamo): seconds of a fresh process. So the manifest also holds the saved
graph in a small JSON form of our own (ATen ops, trtrtx::engine calls, `operator` functions on
sizes; tensors by the archive member torch.export.save wrote them to, as raw bytes), which
`graph_module` turns into a GraphModule with torch.fx alone. A graph that this form cannot
express has none, and `load` uses torch.export.load.
"""

from __future__ import annotations

import json
import operator
import zipfile
from collections.abc import Mapping
from typing import Any

import torch

from .._errors import PackageError


class Unencodable(Exception):
    """A node or argument that the package's graph form does not express."""


_PY_OPS = ("getitem", "add", "sub", "mul", "floordiv", "truediv", "mod", "neg", "pow", "eq", "ne", "lt", "le",
           "gt", "ge", "and_", "or_", "not_")


def encode_graph(gm: torch.fx.GraphModule, out_spec: Any) -> dict[str, Any]:
    """The graph of `gm` (placeholders, get_attr, call_function, output) as JSON; raises Unencodable."""
    from .._torch_compat import treespec_dumps

    nodes = []
    attrs: dict[str, Any] = {}
    inputs = []
    for node in gm.graph.nodes:
        entry: dict[str, Any] = {"name": node.name, "op": node.op}
        if node.op == "placeholder":
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor):
                raise Unencodable(f"input {node.name} is not a tensor")
            inputs.append({"dtype": str(val.dtype).removeprefix("torch."),
                           "shape": [int(s) if isinstance(s, int) else None for s in val.shape]})
        elif node.op == "get_attr":
            value = _fetch(gm, str(node.target))
            if not isinstance(value, torch.Tensor):
                raise Unencodable(f"{node.target} is not a tensor")
            entry["target"] = str(node.target)
            attrs[str(node.target)] = {"dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape),
                                       "stride": list(value.stride()), "offset": int(value.storage_offset())}
        elif node.op == "call_function":
            entry["target"] = _encode_target(node.target)
            entry["args"] = _encode(node.args)
            entry["kwargs"] = _encode(dict(node.kwargs))
        elif node.op == "output":
            entry["args"] = _encode(node.args)
        else:
            raise Unencodable(f"a {node.op} node ({node.target})")
        nodes.append(entry)
    try:
        spec = treespec_dumps(out_spec)
    except Exception as exc:
        raise Unencodable(f"the output structure: {exc}") from exc
    return {"nodes": nodes, "attrs": attrs, "inputs": inputs, "out_spec": spec}


def _fetch(gm: torch.nn.Module, target: str) -> Any:
    # (cache.engines.fetch_attr's twin: loading a package imports none of the compile's modules)
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part, None)
    return value


def _encode_target(target: Any) -> dict[str, str]:
    if isinstance(target, torch._ops.OpOverload):
        return {"op": f"{target._schema.name}.{target._overloadname}"}
    if getattr(target, "__module__", None) in ("_operator", "operator") and target.__name__ in _PY_OPS:
        return {"py": target.__name__}
    raise Unencodable(f"call of {target}")


def _encode(value: Any) -> Any:
    if isinstance(value, torch.fx.Node):
        return {"n": value.name}
    if value is None or isinstance(value, (bool, str)):
        return {"v": value}
    if isinstance(value, int):
        return {"v": int(value)}
    if isinstance(value, float):
        return {"f": repr(value)}
    if isinstance(value, (list, tuple)):
        return {"l" if isinstance(value, list) else "t": [_encode(v) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"d": {k: _encode(v) for k, v in value.items()}}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    raise Unencodable(f"an argument of type {type(value).__name__}")


def _decode(value: Any, env: Mapping[str, torch.fx.Node], device: torch.device | None) -> Any:
    (kind, item), = value.items()
    if kind == "n":
        return env[item]
    if kind == "v":
        return item
    if kind == "f":
        return float(item)
    if kind == "l":
        return [_decode(v, env, device) for v in item]
    if kind == "t":
        return tuple(_decode(v, env, device) for v in item)
    if kind == "d":
        return {k: _decode(v, env, device) for k, v in item.items()}
    if kind in ("dtype", "layout", "memory_format"):
        found = getattr(torch, item, None)
        if not isinstance(found, (torch.dtype, torch.layout, torch.memory_format)):
            raise PackageError(f"unknown {kind} {item!r} in the package's graph")
        return found
    if kind == "device":
        return device if device is not None else torch.device(item)
    raise PackageError(f"unknown value {value!r} in the package's graph")


def _decode_target(target: Mapping[str, str]) -> Any:
    if "py" in target:
        if target["py"] not in _PY_OPS:
            raise PackageError(f"the package's graph calls operator.{target['py']}, which it may not")
        return getattr(operator, target["py"])
    qualified, _, overload = target["op"].rpartition(".")
    namespace, _, name = qualified.partition("::")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), name), overload)
    except (AttributeError, RuntimeError) as exc:
        raise PackageError(f"the package's graph calls {target['op']}, which this PyTorch does not have") from exc


def attach_members(archive: zipfile.ZipFile, prefix: str, graph: dict[str, Any], owner: str) -> None:
    """Name, for each tensor of the graph, the archive member that torch.export.save wrote it to
    (as raw bytes: its configs say where); `owner` is the graph's path in the saved module."""
    where: dict[str, str] = {}
    for name in archive.namelist():
        rel = name[len(prefix):]
        if rel.startswith("data/") and rel.endswith("_config.json"):
            folder = rel.rsplit("/", 1)[0]
            for fqn, meta in json.loads(archive.read(name)).get("config", {}).items():
                where[fqn] = f"{folder}/{meta['path_name']}"
    for target, attr in graph["attrs"].items():
        member = where.get(f"{owner}.{target}" if owner else target)
        if member is None:
            raise Unencodable(f"{target} is not among the archive's tensors")
        attr["member"] = member


def graph_module(archive: zipfile.ZipFile, prefix: str, graph: Mapping[str, Any],
                 device: torch.device) -> tuple[torch.fx.GraphModule, Any]:
    """The package's graph as a GraphModule (its tensors on `device`), and its output structure."""
    from .._torch_compat import treespec_loads

    root = torch.nn.Module()
    fx = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}
    moved = device  # the graph's device arguments (aten.full(..., device=)) follow the model
    for entry in graph["nodes"]:
        op = entry["op"]
        if op == "placeholder":
            env[entry["name"]] = fx.placeholder(entry["name"])
        elif op == "get_attr":
            target = entry["target"]
            if "." in target or not target.isidentifier():
                raise PackageError(f"bad tensor name {target!r} in the package's graph")
            blob = target.endswith(("_plan", "_onnx"))  # engine and ONNX bytes stay on the host
            root.register_buffer(target, _read_tensor(archive, prefix, graph["attrs"][target],
                                                      torch.device("cpu") if blob else device))
            env[entry["name"]] = fx.get_attr(target)
        elif op == "call_function":
            env[entry["name"]] = fx.call_function(_decode_target(entry["target"]),
                                                  _decode(entry["args"], env, moved), _decode(entry["kwargs"], env, moved))
        elif op == "output":
            fx.output(_decode(entry["args"], env, moved)[0])
        else:
            raise PackageError(f"unknown node kind {op!r} in the package's graph")
    return torch.fx.GraphModule(root, fx), treespec_loads(graph["out_spec"])


def _read_tensor(archive: zipfile.ZipFile, prefix: str, attr: Mapping[str, Any], device: torch.device) -> torch.Tensor:
    data = archive.read(prefix + attr["member"])
    dtype = getattr(torch, attr["dtype"])
    if not data:
        base = torch.zeros(0, dtype=dtype)
    else:
        base = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype)
    tensor = base.as_strided(attr["shape"], attr["stride"], attr["offset"]) if base.numel() else base.reshape(attr["shape"])
    return tensor if device.type == "cpu" else tensor.to(device)
