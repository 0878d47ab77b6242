"""One lowered graph, compiled: planned (policy and partition), every region compiled in place,
planned again without the nodes that the ONNX screen refuses, and its code generated."""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import _stats
from .._errors import BuildError, RegionRefused
from .._log import say_once
from .._options import Options
from .._record import CompiledGraph, record
from .._types import Reason
from ..plan.fixes import FIXES, TARGET_RULES
from ..plan.partition import PartitionPlan, plan_graph
from ..run.region import direct_forward
from . import background as _background
from .region import compile_region

log = logging.getLogger("rtx_backend")


def compile_graph(
    aten_gm: torch.fx.GraphModule,
    args: Sequence[Any],
    options: Options,
    overrides: dict[str, Any] | None = None,
    on_plan: Callable[[PartitionPlan], None] | None = None,
) -> Callable[..., Any]:
    start, before = time.perf_counter(), _stats.stats()
    plan = compile_regions(aten_gm, overrides if overrides is not None else {}, options)
    if on_plan is not None:
        on_plan(plan)
    gm = plan.graph_module
    modules = [getattr(gm, n) for n in plan.regions]
    generate_code(gm)
    seconds = time.perf_counter() - start
    record(CompiledGraph(plan, modules, seconds))
    if not modules:
        warn_nothing_lowered(plan)
    after = _stats.stats()
    built, cached, behind = (after.get(k, 0) - before.get(k, 0)
                             for k in ("engine_builds", "engine_cache_hits", "background_builds"))
    log.info(
        "trtrtx: compiled a graph in %.2fs: %d region(s) %s, %d engine(s) built, %d loaded from cache, "
        "%s%d op(s) left in PyTorch (%s)",
        seconds, len(modules), [m.kind for m in modules], built, cached,
        f"{behind} being built in the background (PyTorch runs them until then), " if behind else "", len(plan.eager_ops),
        _stats.stage_split(before, after) or "no stage took 5 ms",
    )
    return direct_forward(gm)


def generate_code(gm: torch.fx.GraphModule) -> None:
    """Generate the graph's code now. A lazily recompiled GraphModule (what the partitioner makes)
    would keep `forward` as a stub that re-enters `__call__` and checks for a recompile on every
    call: microseconds per call, for nothing."""
    torch.fx.GraphModule.recompile(gm)  # GraphModule's own recompile: the real code generation


def compile_regions(
    aten_gm: torch.fx.GraphModule, overrides: dict[str, Any], options: Options
) -> PartitionPlan:
    """Plan, then compile every region in place. When the ONNX screen refuses nodes of a region
    (RegionRefused), plan again with them in PyTorch, from a copy of the graph (partitioning
    edits it). Each round refuses nodes that were in a region, so the loop ends."""
    pristine = copy.deepcopy(aten_gm.graph)
    known = {n.name for n in pristine.nodes}
    refused: dict[str, Reason] = {}
    gm = aten_gm
    later = _background.start if _background.wanted(options) else None
    while True:
        plan = plan_graph(gm, options, refused)
        try:
            for name in plan.regions:
                region = compile_region(name, getattr(plan.graph_module, name), overrides, options, later)
                setattr(plan.graph_module, name, region)
            return plan
        except RegionRefused as exc:
            new = {k: v for k, v in exc.reasons.items() if k in known and k not in refused}
            if not new:
                raise BuildError(f"the ONNX screen refused nodes that are in no region: {exc}") from exc
            refused.update(new)  # type: ignore[arg-type]
            gm = torch.fx.GraphModule(aten_gm, copy.deepcopy(pristine))


def warn_nothing_lowered(plan: PartitionPlan) -> None:
    """A graph of which nothing runs on TensorRT-RTX (an FP32 model for Turing, a model smaller
    than min_block_size, every op in torch_executed_ops) deserves a WARNING, not an INFO line:
    say which rules kept its nodes out, and the fix of each. A graph with nothing to lower (host
    arithmetic, weights only) says nothing."""
    counts: dict[str, int] = {}
    for reason in plan.reasons.values():
        if reason.rule not in QUIET_RULES:
            counts[reason.rule] = counts.get(reason.rule, 0) + 1
    if counts:
        ordered = sorted(counts.items(), key=lambda kv: (kv[0] not in TARGET_RULES, -kv[1]))
        rules = "; ".join(f"{rule} kept {n} node(s) in PyTorch (fix: {FIXES.get(rule, 'see explain')})"
                          for rule, n in ordered)
        # once a process for each set of rules: a model with many small graphs (graph breaks) gets
        # one line, not one a graph; recording() and explain list every graph
        say_once(f"trtrtx: nothing of this graph runs on TensorRT-RTX: {rules}. rtx_backend.explain(model, "
                 "*inputs, options=...) lists every node", key="nothing-lowered:" + ",".join(sorted(counts)))


# rules that keep nodes out with nothing for the user to do, and that follow from other rules
QUIET_RULES = frozenset({"not-an-op", "not-aten", "weights-only"})
