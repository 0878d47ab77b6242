"""The rest: what does not run in a region, run by PyTorch (rest="pytorch") or inductor.

With rest="inductor" the partitioned graph, its regions as calls of the region op
(`_region_op`), is compiled by inductor; so is a graph whose lowering failed (instead of
running eagerly), and a region that falls back to PyTorch runs inductor's code: inlined into
the graph when it falls back at build time, compiled on its own (`torch.compile`) when it falls
back later (first-call validation, a failing executor). Whatever inductor cannot compile runs in
PyTorch, with one warning.

Inductor is reached through `torch._inductor.compile` (`_torch_compat.inductor_compile`)
(= compile_fx, what `backend="inductor"` runs) on the partitioned graph, with Dynamo's example
inputs, once our own aot_autograd pass (lowering) has returned; and `torch.compile`. The
partitioned ATen graph can be given to compile_fx as if it were Dynamo's graph because lowering
checked that it takes Dynamo's inputs as they are (`_lowering.plain_calling_convention`); a
graph that does not (input mutations, aliased outputs) keeps its rest in PyTorch.

With cuda_graph_strategy="whole_graph_capture" (what mode="reduce-overhead" sets) inductor
captures the whole graph in CUDA graphs (its cudagraph trees, `triton.cudagraphs`), the
TensorRT-RTX enqueues included: the executors see the outer capture and use their context
without TensorRT-RTX's own graphs, which are therefore not made (`for_regions`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import _stats, _torch_compat
from .._log import one_line, say_once
from .._options import Options
from ..export.bridge import FROZEN
from ..lower.lowering import without_autocast
from ..plan.policy import op_family, op_names
from ..run import choices as _choices
from ..run.executors import run_with_own_scratch
from ..run.region import RegionModule
from ..run.region_op import as_op_graph
from ..run.validation import capturing

log = logging.getLogger("rtx_backend")


@dataclasses.dataclass(frozen=True)
class RestChoice:
    """Who runs a graph's rest (inductor or PyTorch), and why, as the log and `explain` say it."""

    inductor: bool
    why: str  # e.g. "rest='auto': addmm runs outside the regions"
    op: str = ""  # rest="auto": the op outside the regions that sent the rest to inductor

    def __str__(self) -> str:
        return f"{'inductor' if self.inductor else 'PyTorch'} ({self.why})"


def rest_choice(options: Options, gm: torch.fx.GraphModule | None = None, unlowered: bool = False) -> RestChoice:
    """Whether inductor compiles a graph's rest: always with rest="inductor", never with
    "pytorch"; with "auto" for a graph trtrtx did not lower (`unlowered`: its lowering or partition
    failed) and for a partitioned graph `gm` whose rest computes (`auto_rest`). Without `gm` (no
    partitioned graph that takes Dynamo's inputs as they are) "auto" keeps the rest in PyTorch."""
    if options.rest != "auto":
        return RestChoice(options.rest == "inductor", f"rest='{options.rest}'")
    if unlowered:
        return RestChoice(True, "rest='auto': the graph is not lowered")
    if gm is None:
        return RestChoice(False, "rest='auto': no partitioned graph takes Dynamo's inputs as they are")
    op = auto_rest(gm)
    if op:
        return RestChoice(True, f"rest='auto': {op} runs outside the regions", op)
    return RestChoice(False, "rest='auto': only glue runs outside the regions")


def auto_rest(gm: torch.fx.GraphModule) -> str:
    """rest="auto" on a partitioned graph: the first GEMM, attention or convolution that runs
    outside the regions (between them, kept by the policy, or in a region that fell back at build
    time), which makes the rest worth inductor's compile; "" where the rest is only glue (views,
    casts, small elementwise ops), which eager PyTorch runs as fast and without a compile."""
    for node in gm.graph.nodes:
        if node.op == "call_module":
            sub = gm.get_submodule(str(node.target))
            if isinstance(sub, RegionModule):
                found = auto_rest(sub.graph_module) if sub.in_pytorch else ""
                if found:
                    return found
        elif node.op == "call_function" and hasattr(node.target, "_schema"):
            name = op_names(node.target)[0].partition("::")[2]
            if op_family(name) != "other":
                return name
    return ""


def for_regions(options: Options) -> Options:
    """The options the partitioned graph is made with: those of rest="pytorch" (its regions and
    graph-cache entry are the same), without TensorRT-RTX's own CUDA graphs when inductor
    captures the whole graph (the engines run inside inductor's capture, which their own cannot
    nest in; with rest="auto", decided after the partition, they keep them and use a context
    without them inside a capture)."""
    if options.rest == "auto":
        return dataclasses.replace(options, rest="pytorch")
    if options.rest != "inductor":
        return options
    graphs = "disabled" if options.cuda_graph_strategy == "whole_graph_capture" else options.cuda_graph_strategy
    return dataclasses.replace(options, rest="pytorch", fastest=False, cuda_graph_strategy=graphs)


def _config(options: Options) -> dict[str, Any]:
    return {"triton.cudagraphs": True} if options.cuda_graph_strategy == "whole_graph_capture" else {}


def compile_rest(
    gm: torch.fx.GraphModule | None, example_inputs: Sequence[Any], fn: Callable[..., Any], options: Options,
) -> Callable[..., Any]:
    """The partitioned graph `gm` (taking Dynamo's inputs as they are) compiled by inductor,
    regions as op calls; `fn` (the rest in PyTorch) when there is no such graph or inductor fails."""
    if gm is None:
        say_once("trtrtx: this graph's rest runs in PyTorch: lowering changed its calling convention (input mutations "
              "or aliased outputs), which the partitioned graph cannot be compiled with")
        return fn
    try:
        op_gm, calls = as_op_graph(gm, functools.partial(_runner, options=options))
        _unfreeze(op_gm)
        compiled = _torch_compat.inductor_compile(op_gm, list(example_inputs), _config(options),
                                                  _torch_compat.static_inputs(example_inputs))
    except _torch_compat.dynamo_exc().TorchDynamoException:
        raise  # Dynamo's control flow (a restart: inductor tensorifies float scalars): not a failure
    except Exception as exc:
        if options.strict:
            raise
        say_once(f"trtrtx: inductor could not compile this graph's rest; it runs in PyTorch ({one_line(exc)})")
        log.debug("trtrtx: inductor failed on the rest", exc_info=exc)
        return fn
    _stats.count("rest_inductor_graphs")
    run = without_autocast(compiled)  # (as aot_autograd's wrapper runs the partitioned graph)
    # what the region op's table refers to only weakly: the region calls, and the partitioned
    # graph that owns the region modules
    run.trtrtx_regions = (calls, gm)  # type: ignore[attr-defined]
    return run


def whole_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Options,
                eager: Callable[..., Any]) -> Callable[..., Any]:
    """Dynamo's graph compiled by inductor (a graph trtrtx did not lower); `eager` if inductor fails."""
    try:
        return inductor_graph(gm, example_inputs, options)
    except _torch_compat.dynamo_exc().TorchDynamoException:
        raise
    except Exception as exc:
        say_once(f"trtrtx: inductor could not compile this graph either; it runs in PyTorch ({one_line(exc)})")
        log.debug("trtrtx: inductor failed on the graph", exc_info=exc)
        return eager


def inductor_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Options,
                   counted: bool = True) -> Callable[..., Any]:
    """Dynamo's graph compiled by inductor (what backend="inductor" makes of it); raises where
    inductor fails. Counted in stats()["rest_inductor_whole_graphs"] (not `counted`: a compile
    only for timing)."""
    compiled = _torch_compat.inductor_compile(gm, list(example_inputs), _config(options))
    if counted:
        _stats.count("rest_inductor_whole_graphs")
    return compiled  # type: ignore[no-any-return]


def _runner(module: Any, options: Options) -> Callable[..., Any] | None:
    """How the op runs a region: None (inline it) for one that already runs in PyTorch; else a
    runner that sends the region through inductor once it falls back to PyTorch, and (option
    fastest) through inductor when inductor's code for it is the faster."""
    if not isinstance(module, RegionModule) or module.in_pytorch:
        return None
    return _RegionRunner(module, options)


class _RegionRunner:
    """The region module; once it runs in PyTorch (validation failed, the executor failed), its
    FX graph compiled by inductor instead (torch.compile, dynamic where the region is).

    With options.fastest, the first call whose executor has passed its first-call check (that
    call's own, or an earlier one), outside any CUDA graph capture, then times the executor
    against inductor's code for the region on that call's inputs and keeps the faster from then
    on (so that inductor's CUDA graphs, whose warm-up call is the first, record the faster); the
    decision is stored beside the engine (its engine-cache entry's record, per GPU and driver),
    so a later process compiles inductor's code only where it is the faster, and times nothing."""

    def __init__(self, module: RegionModule, options: Options) -> None:
        self.module = module
        self.options = options
        self.compiled: Callable[..., Any] | None = None
        self.use_inductor: bool | None = None if options.fastest else False
        if options.fastest:
            known = _choices.recorded(options, module.engine_key)
            if known is not None:
                self._decide(known, "cached")

    def __call__(self, *args: Any) -> Any:
        module = self.module
        if module.in_pytorch or self.use_inductor:
            return self._inductor(*args)
        outputs = self._module(*args)
        if self.use_inductor is None and self._ready(args):  # timed after the call's own check
            self._choose(args)
        return outputs

    def _module(self, *args: Any) -> Any:
        return run_with_own_scratch(self.module, *args)  # (inductor's CUDA graphs track every allocation)

    def _inductor(self, *args: Any) -> Any:
        module = self.module
        if self.compiled is None and module.executor.kind == "pytorch":
            _stats.count("rest_inductor_region_fallbacks")
        try:
            return self._compiled()(*args)
        except Exception as exc:
            say_once(f"trtrtx: inductor could not compile region {module.name}; it runs in "
                  f"{'PyTorch' if module.executor.kind == 'pytorch' else module.kind} ({one_line(exc)})")
            self.compiled = module.graph_module
            if module.executor.kind != "pytorch":
                self.use_inductor = False
                if module.fastest is not None:  # the decision for inductor is void: the executor runs it
                    module.fastest, module.why = None, ""
                return self._module(*args)
            return module.graph_module(*args)

    def _ready(self, args: Sequence[Any]) -> bool:
        """Whether this call can time the region: its executor has passed its first-call check
        (or needs none), and no CUDA graph is being captured."""
        module = self.module
        checked = not module.validate or module.checked is module.executor
        return checked and not capturing(args)

    def _choose(self, args: Sequence[Any]) -> None:
        module = self.module
        try:
            compiled = self._compiled()
            compiled(*args)  # compiles (or raises) before anything is timed
            timing = _choices.time_both(lambda: module(*args), lambda: compiled(*args),
                                        _choices.in_graphs(self.options))
        except Exception as exc:  # inductor cannot compile it, or a run failed: keep the executor
            log.info("trtrtx: region %s: not timed against inductor (%s: %s); it stays on %s",
                     module.name, type(exc).__name__, exc, module.kind)
            self.use_inductor = False
            return
        self._decide(timing, "measured")
        _choices.record(self.options, module.engine_key, timing)

    def _compiled(self) -> Callable[..., Any]:
        """Inductor's code for the region (torch.compile of its graph, dynamic where it is)."""
        if self.compiled is None:
            dynamic = bool(self.module.onnx is not None and self.module.onnx.dynamic)
            self.compiled = torch.compile(self.module.graph_module, backend="inductor", dynamic=dynamic or None)
        return self.compiled

    def _decide(self, timing: _choices.Timing, source: str) -> None:
        module = self.module
        module.fastest = _choices.Decision(module.kind, timing, source)
        self.use_inductor = module.chosen == "inductor"
        text = (f"inductor's code for it takes {timing.inductor_ms:.3f} ms a call and {module.kind} "
                f"{timing.executor_ms:.3f} ms on this GPU ({module.fastest.how})")
        if self.use_inductor:
            module.why = text
            _stats.count("rest_inductor_regions_chosen")
        log.info("trtrtx: region %s: %s: %s", module.name, text,
                 "inductor's code runs it" if self.use_inductor else f"{module.kind} runs it")


def _unfreeze(gm: torch.fx.GraphModule) -> None:
    """Give the rest the weights as Dynamo passes them (its inputs) instead of the constants
    lowering froze: inductor then reads the live weights, as the PyTorch rest does, and treats
    them as the static inputs they are (no copies into CUDA graphs)."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    for node in list(gm.graph.find_nodes(op="get_attr")):
        match = FROZEN.search(str(node.target))
        index = int(match.group(1)) if match else None
        if index is None or index >= len(placeholders):
            continue
        value, ph = getattr(gm, str(node.target), None), placeholders[index]
        val = ph.meta.get("val")
        if not (isinstance(value, torch.Tensor) and isinstance(val, torch.Tensor)
                and val.shape == value.shape and val.dtype == value.dtype):
            continue
        node.replace_all_uses_with(ph)
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
