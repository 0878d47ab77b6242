"""A region as a PyTorch custom op: `torch.ops.trtrtx.region(key, tensors[, ints])`.

The partitioned graph calls its regions as submodules (`call_module`), which no other compiler
can carry. `as_op_graph` rewrites those calls into calls of one registered op, so that the graph
is an ordinary ATen FX graph: inductor compiles what stays in PyTorch around the regions, and
`torch.export`/`make_fx` trace through it.

    trtrtx::region(str key, Tensor[] tensors) -> Tensor[]
    trtrtx::region.ints(str key, Tensor[] tensors, SymInt[] ints) -> Tensor[]

`key` names a live region in a process-level table of weak references (the compiled graph owns
its regions; the table only finds them). The overload with `ints` serves regions that take sizes
(dynamic shapes); the plain one saves the dispatcher about a microsecond of SymInt[] boxing.

The fake (meta) implementation runs the region's own PyTorch graph on the fake inputs, so that
symbolic shapes come out as they would in PyTorch, then gives fresh contiguous outputs: that is
what the executors return (TensorRT-RTX and ONNX Runtime write contiguous outputs), and the real
implementation makes a PyTorch fallback's outputs the same (contiguous, never an alias of an
input), so the strides that a compiler reads from the fake outputs are the ones it gets.

The op is defined with `torch.library.Library(...).define/impl` rather than `custom_op`: the
latter's Python wrapper costs several microseconds a call more (see bench/region_op.py).

Long because the op is one unit: its schema, the registry of live regions, the real kernel and
the fake kernel (with symbolic shapes), and the rewrite of a partitioned graph into op calls.
"""

from __future__ import annotations

import itertools
import operator
import re
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import _torch_compat
from .._errors import RtxBackendError

NAMESPACE = "trtrtx"
_FROZEN_NAME = re.compile(r"_frozen_\d+")  # lowering's name of a frozen weight (_lowering.freeze)
_LIB = torch.library.Library(NAMESPACE, "DEF")
_LIB.define("region(str key, Tensor[] tensors) -> Tensor[]")
_LIB.define("region.ints(str key, Tensor[] tensors, SymInt[] ints) -> Tensor[]")


class LiveRegions:
    """The regions that op keys name in this process, held weakly (the compiled graph holds
    them), each under a key of its own (the region's name and a number)."""

    def __init__(self) -> None:
        self.refs: dict[str, weakref.ReferenceType[RegionCall]] = {}
        self._lock = threading.Lock()
        self._counter = itertools.count()

    def add(self, call: RegionCall, name: str) -> str:
        key = f"{name}#{next(self._counter)}"
        ref = weakref.ref(call, self._forget(key))
        with self._lock:
            self.refs[key] = ref
        return key

    def _forget(self, key: str) -> Callable[[Any], None]:
        def forget(_ref: Any) -> None:
            with self._lock:
                if self.refs.get(key) is _ref:
                    del self.refs[key]
        return forget


LIVE = LiveRegions()


class RegionCall:
    """What one op key runs: the region module, its arguments put back in their order.

    `layout[i]` is ("t", j) or ("i", j): argument i of the region is tensors[j] or ints[j].
    `run`: how the region runs (the region module; the rest compiler may wrap it, e.g. to send
    a region that fell back to PyTorch through inductor). Held by the compiled graph; the op's
    table holds it weakly."""

    def __init__(self, module: Any, layout: Sequence[tuple[str, int]], run: Callable[..., Any] | None = None) -> None:
        self.module = module
        self.layout = tuple(layout)
        self.plain = all(kind == "t" and j == i for i, (kind, j) in enumerate(self.layout))
        self.run = run if run is not None else module
        self.key = LIVE.add(self, getattr(module, "name", "region"))

    def arguments(self, tensors: Sequence[Any], ints: Sequence[Any]) -> list[Any]:
        if self.plain:
            return list(tensors)
        sources = {"t": tensors, "i": ints}
        return [sources[kind][j] for kind, j in self.layout]

    def reference(self) -> torch.fx.GraphModule:
        """The region's FX graph as PyTorch runs it (the fake implementation's model)."""
        gm = getattr(self.module, "graph_module", self.module)
        assert isinstance(gm, torch.fx.GraphModule)
        return gm


def lookup(key: str) -> RegionCall:
    """The live region of `key`; a clear error when there is none."""
    ref = LIVE.refs.get(key)
    entry = ref() if ref is not None else None
    if entry is None:
        raise RtxBackendError(
            f"trtrtx::region: no live region {key!r}: the compiled model that owned it was released, or the "
            "graph was saved and loaded in another process (regions are not saved with it); compile the model "
            "again in this process")
    return entry


def _fresh(outputs: Sequence[torch.Tensor], inputs: Sequence[Any]) -> list[torch.Tensor]:
    """The outputs as the op promises them: contiguous and no alias of an input (a PyTorch
    fallback's view of an input is copied; an executor's outputs pass unchanged)."""
    storages = None
    result = []
    for out in outputs:
        if out.is_contiguous():
            if storages is None:
                storages = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
            if out.untyped_storage().data_ptr() not in storages or out.numel() == 0:
                result.append(out)
                continue
        result.append(out.clone(memory_format=torch.contiguous_format))
    return result


def _region(key: str, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    ref = LIVE.refs.get(key)
    entry = ref() if ref is not None else None
    if entry is None or not entry.plain:
        entry = lookup(key)
        return _run(entry, tensors, [])
    return _fresh_fast(entry.run(*tensors), tensors)


def _fresh_fast(outputs: Sequence[torch.Tensor], tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`_fresh` for the usual case, an executor's new contiguous outputs, in plain loops (about
    half the time of map()s over methodcallers: each C call is cheap, the iterators are not);
    anything else goes to `_fresh` (the region module may have run PyTorch for this call: shapes
    outside the profile, an empty tensor, inside a capture, a fallback)."""
    for out in outputs:
        if not out.is_contiguous():
            return _fresh(outputs, tensors)
    ptrs = {t.untyped_storage().data_ptr() for t in tensors}
    for out in outputs:
        if out.untyped_storage().data_ptr() in ptrs:
            return _fresh(outputs, tensors)
    return list(outputs)


def _region_ints(key: str, tensors: list[torch.Tensor], ints: list[int]) -> list[torch.Tensor]:
    return _run(lookup(key), tensors, ints)


def _run(entry: RegionCall, tensors: Sequence[torch.Tensor], ints: Sequence[int]) -> list[torch.Tensor]:
    return _fresh(entry.run(*entry.arguments(tensors, ints)), tensors)


def _fake(key: str, tensors: list[torch.Tensor], ints: Sequence[Any] = ()) -> list[torch.Tensor]:
    entry = lookup(key)
    outputs = _FakeRun(entry.reference()).run(*entry.arguments(tensors, ints))
    return [o.new_empty(o.shape) for o in outputs]  # fresh, contiguous: what the executors return


def _fake_ints(key: str, tensors: list[torch.Tensor], ints: list[Any]) -> list[torch.Tensor]:
    return _fake(key, tensors, ints)


class _FakeRun(torch.fx.Interpreter):
    """The region's graph on fake inputs: its constants (frozen weights, real tensors) become
    fake tensors of the inputs' fake mode."""

    def run(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.fake_mode = _torch_compat.detect_fake_mode([a for a in args if isinstance(a, torch.Tensor)])
        return super().run(*args, **kwargs)

    def get_attr(self, target: Any, args: Any, kwargs: Any) -> Any:
        value = super().get_attr(target, args, kwargs)
        mode = self.fake_mode
        if mode is not None and isinstance(value, torch.Tensor) and not _torch_compat.is_fake(value):
            return mode.from_tensor(value, static_shapes=True)
        if mode is None and isinstance(value, torch.Tensor) and not value.is_meta:
            return value.to("meta")  # meta inputs without a fake mode: meta constants
        return value


_LIB.impl("region", _region, "CompositeExplicitAutograd")
_LIB.impl("region.ints", _region_ints, "CompositeExplicitAutograd")
torch.library.register_fake(f"{NAMESPACE}::region", _fake, lib=_LIB)
torch.library.register_fake(f"{NAMESPACE}::region.ints", _fake_ints, lib=_LIB)

REGION = torch.ops.trtrtx.region.default
REGION_INTS = torch.ops.trtrtx.region.ints


class Unsupported(RtxBackendError):
    """A region the op cannot carry (an argument or result that is neither a tensor nor an int)."""


def as_op_graph(
    gm: torch.fx.GraphModule,
    wrap: Callable[[Any], Callable[..., Any] | None] = lambda module: None,
) -> tuple[torch.fx.GraphModule, list[RegionCall]]:
    """A copy of the partitioned graph `gm` whose region calls (`call_module` of a RegionModule)
    are calls of the region op; and the RegionCall of each, which the caller must keep alive as
    long as the graph runs (`gm` is not changed). `wrap(module)`: the function the op runs
    instead of the module itself, or None; a region that runs in PyTorch and gets None is
    inlined (its graph's nodes in place of the call), so that the rest's compiler compiles it."""
    from .region import RegionModule

    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, Any] = {}
    calls: list[RegionCall] = []
    owner = torch.nn.Module()
    for node in gm.graph.nodes:
        module = gm.get_submodule(str(node.target)) if node.op == "call_module" else None
        if isinstance(module, RegionModule):
            args = [env[a] if isinstance(a, torch.fx.Node) else a for a in node.args]
            runner = wrap(module)
            if runner is None and module.kind == "pytorch":
                env[node] = _inline(graph, module.graph_module, args, owner, str(node.target))
            else:
                env[node] = _op_call(graph, node, module, args, calls, runner)
            continue
        if (node.op == "call_function" and node.target is operator.getitem
                and isinstance(env.get(node.args[0]), tuple)):  # type: ignore[arg-type]
            env[node] = env[node.args[0]][node.args[1]]  # type: ignore[index]  # of an inlined region
            continue
        new = graph.node_copy(node, lambda n: env[n])
        if node.op in ("get_attr", "call_module"):
            _copy_attr(gm, owner, str(node.target))
        env[node] = new
    return torch.fx.GraphModule(owner, graph), calls


def _copy_attr(src: torch.nn.Module, dst: torch.nn.Module, target: str) -> None:
    value = operator.attrgetter(target)(src)
    *path, last = target.split(".")
    holder = dst
    for part in path:
        if not hasattr(holder, part):
            holder.add_module(part, torch.nn.Module())
        holder = getattr(holder, part)
    if hasattr(holder, last):
        return
    if isinstance(value, torch.nn.Module):
        holder.add_module(last, value)
    elif isinstance(value, torch.nn.Parameter):
        holder.register_parameter(last, value)
    elif isinstance(value, torch.Tensor):
        holder.register_buffer(last, value, persistent=False)
    else:
        setattr(holder, last, value)


def _op_call(graph: torch.fx.Graph, node: torch.fx.Node, module: Any, args: list[Any], calls: list[RegionCall],
             runner: Callable[..., Any] | None) -> torch.fx.Node:
    tensors: list[Any] = []
    ints: list[Any] = []
    layout: list[tuple[str, int]] = []
    onnx = getattr(module, "onnx", None)
    # which arguments are tensors: the region's ONNX inputs say (a graph from the graph cache has
    # no metadata); else the values the partitioner recorded
    tensor_args = set(onnx.tensor_args) if onnx is not None else None
    for i, (old, new) in enumerate(zip(node.args, args)):
        val = old.meta.get("val") if isinstance(old, torch.fx.Node) else old
        if (i in tensor_args) if tensor_args is not None else isinstance(val, torch.Tensor):
            layout.append(("t", len(tensors)))
            tensors.append(new)
        elif (isinstance(old, torch.fx.Node) if tensor_args is not None
              else isinstance(val, (int, torch.SymInt)) and not isinstance(val, bool)):
            layout.append(("i", len(ints)))  # (a region's non-tensor inputs are sizes: its ONNX model takes
            ints.append(new)                 # none of them, and the op passes them as SymInt)
        else:
            raise Unsupported(f"region {node.target} takes {type(val).__name__} {old}; the region op takes "
                              "tensors and integers")
    if onnx is None:
        results = module.graph_module.graph.output_node().args[0]
        for r in results if isinstance(results, (tuple, list)) else [results]:
            if not (isinstance(r, torch.fx.Node) and isinstance(r.meta.get("val"), torch.Tensor)):
                raise Unsupported(f"region {node.target} returns {r}, not a tensor; the region op returns tensors")
    call = RegionCall(module, layout, runner)
    calls.append(call)
    if ints:
        out = graph.call_function(REGION_INTS, (call.key, tensors, ints))
    else:
        out = graph.call_function(REGION, (call.key, tensors))
    out.meta = dict(node.meta)
    return out


def _inline(graph: torch.fx.Graph, sub: torch.fx.GraphModule, args: list[Any], owner: torch.nn.Module,
            prefix: str) -> Any:
    """The nodes of `sub` copied into `graph` on `args`; its result (a tuple, as the call's)."""
    env: dict[torch.fx.Node, Any] = {}
    placeholders = iter(args)
    output: Any = None
    for node in sub.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(placeholders)
        elif node.op == "output":
            output = torch.fx.node.map_arg(node.args[0], lambda n: env[n])
        elif node.op == "get_attr":
            target = str(node.target)
            # a frozen weight keeps its name (lowering's, shared with the parent graph: the rest's
            # compiler gives it back as the input it was); other constants are named per region
            name = target if _FROZEN_NAME.fullmatch(target) else f"{prefix}_{target.replace('.', '_')}"
            if not hasattr(owner, name):
                value = operator.attrgetter(target)(sub)
                if isinstance(value, torch.Tensor):
                    owner.register_buffer(name, value, persistent=False)
                else:
                    setattr(owner, name, value)
            new = graph.get_attr(name)
            new.meta = dict(node.meta)
            env[node] = new
        else:
            env[node] = graph.node_copy(node, lambda n: env[n])
    return tuple(output) if isinstance(output, (tuple, list)) else output
