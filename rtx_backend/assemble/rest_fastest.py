"""Option fastest where one region is the whole graph: trtrtx against inductor on Dynamo's graph.

Per region (rest.py's `_RegionRunner`), inductor's candidate is its code for the region's own
lowered ATen graph, which can be slower than what inductor makes of Dynamo's graph of the same
model (DeiT-S on an H200: 0.966 against 0.824 ms a call). Where the partitioned graph has one
region that does not run in PyTorch and its rest is only glue, the choice is therefore made
once for the graph: trtrtx's compiled graph (`compile_rest`, without the per-region timing)
against inductor's code for Dynamo's graph (`rest.inductor_graph`, compiled on the first call
that times). The first call whose region has passed its first-call check, outside any CUDA
graph capture, times both on its inputs and keeps the faster from then on (a tie keeps trtrtx).
The timing is stored beside the region's engine under a name of its own (scope "graph",
`choices.record`), so a later process decides without timing and compiles inductor's code only
where it is kept.

A graph with symbolic shapes keeps the per-region choice: inductor's code for Dynamo's graph,
compiled at call time, would be specialized to the shapes it is compiled with.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import _stats
from .._options import Options
from ..run import choices as _choices
from ..run.region import RegionModule
from ..run.validation import capturing
from . import rest as _rest

log = logging.getLogger("rtx_backend")

SCOPE = "graph"


def compile_fastest(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], partitioned: torch.fx.GraphModule | None,
    fn: Callable[..., Any], options: Options,
) -> Callable[..., Any]:
    """compile_rest of the partitioned graph; with option fastest, where its one region is the
    whole graph (`sole_region`), that behind a `GraphChooser` against inductor on `gm`."""
    region = sole_region(partitioned, gm, example_inputs) if options.fastest else None
    if region is None:
        return _rest.compile_rest(partitioned, example_inputs, fn, options)
    # (one decision, for the graph: the region's runner does not time it again)
    single = dataclasses.replace(options, fastest=False)
    trtrtx = _rest.compile_rest(partitioned, example_inputs, fn, single)
    # with inductor's CUDA graphs, both are timed as replays of graphs of their own (`time_both`)
    # compiled without inductor's graphs: cudagraph-tree functions cannot be captured again
    plain = dataclasses.replace(single, cuda_graph_strategy="disabled")
    replayable = functools.partial(_rest.compile_rest, partitioned, example_inputs, fn, plain) \
        if _choices.in_graphs(options) else None
    return GraphChooser(trtrtx, region, gm, example_inputs, options, replayable)


def sole_region(partitioned: torch.fx.GraphModule | None, gm: torch.fx.GraphModule,
                example_inputs: Sequence[Any]) -> RegionModule | None:
    """The region of a partitioned graph that is the whole graph: its only region, not running in
    PyTorch, with only glue around it (`auto_rest`), in a graph without symbolic shapes; else None."""
    if partitioned is None:
        return None
    regions = [m for m in partitioned.modules() if isinstance(m, RegionModule)]
    if len(regions) != 1 or regions[0].kind == "pytorch" or _rest.auto_rest(partitioned):
        return None
    return regions[0] if _static(gm, example_inputs) else None


def _static(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether Dynamo's graph has no symbolic sizes (inputs or placeholder shapes)."""
    if any(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) for v in example_inputs):
        return False
    for node in gm.graph.find_nodes(op="placeholder"):
        val = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return False
        if isinstance(val, torch.Tensor) and not all(isinstance(d, int) for d in val.shape):
            return False
    return True


class _Logged(Exception):
    """Inductor could not compile the whole graph, as already logged."""


class GraphChooser:
    """The faster of trtrtx's compiled graph and inductor's code for Dynamo's graph, decided on
    the first call that can time them (or from the record beside the region's engine)."""

    def __init__(self, trtrtx: Callable[..., Any], region: RegionModule, gm: torch.fx.GraphModule,
                 example_inputs: Sequence[Any], options: Options,
                 replayable: Callable[[], Callable[..., Any]] | None = None) -> None:
        self.trtrtx = trtrtx
        self.replayable = replayable  # trtrtx's graph without inductor's CUDA graphs, for timing (None: not needed)
        self.region = region
        self.options = options
        # Dynamo's graph and inputs, for inductor's compiles, until decided (`_release`)
        self.source: tuple[torch.fx.GraphModule, list[Any]] | None = (gm, list(example_inputs))
        self.inductor: Callable[..., Any] | None = None
        self.fn = trtrtx  # what runs the calls once decided
        # once inductor's code for Dynamo's graph is kept: it reads the weights the call passes,
        # so the weight guard (assemble/weights.py) updates no region when they change
        self.reads_live_weights = False
        self.pending = True
        # (what compile_rest's function holds for the region op's table: the region calls)
        self.trtrtx_regions = getattr(trtrtx, "trtrtx_regions", None)
        known = _choices.recorded(options, region.engine_key, SCOPE)
        if known is not None:
            self.pending = False
            decision = _choices.Decision(region.kind, known, "cached", SCOPE)
            if decision.kept != "inductor" or self._compiled():
                self._decide(decision)
            else:
                self._release()

    def __call__(self, *args: Any) -> Any:
        if not self.pending:
            return self.fn(*args)
        outputs = self.trtrtx(*args)
        region = self.region
        if region.executor.kind == "pytorch":  # fell back (validation, a failing executor): nothing to time
            self.pending = False
            self._release()
        elif (not region.validate or region.checked is region.executor) and not capturing(args):
            return self._choose(args, outputs)
        return outputs

    def _compiled(self) -> Callable[..., Any] | None:
        """Inductor's code for Dynamo's graph, compiled on first use; None (one INFO line) where
        inductor fails (strict: raises)."""
        if self.inductor is None and self.source is not None:
            gm, example_inputs = self.source
            try:
                self.inductor = _rest.inductor_graph(gm, example_inputs, self.options)
            except Exception as exc:
                if self.options.strict:
                    raise
                log.info("trtrtx: region %s: inductor could not compile the whole Dynamo graph (%s: %s); "
                         "trtrtx's compiled graph runs it", self.region.name, type(exc).__name__, exc)
                log.debug("trtrtx: inductor failed on the whole graph", exc_info=exc)
        return self.inductor

    def _release(self) -> None:
        """Drop what only deciding needed: Dynamo's graph and inputs, trtrtx's graph for timing."""
        self.source = self.replayable = None

    def _choose(self, args: Sequence[Any], outputs: Any) -> Any:
        """Time both on this call's inputs, keep the faster; this call's outputs from the one kept
        (run again: timing may have overwritten a CUDA graph's outputs)."""
        self.pending = False
        region = self.region
        try:
            timing = self._time(args)
        except Exception as exc:  # inductor cannot compile it, or a run failed: keep trtrtx
            if self.options.strict:
                raise
            if not isinstance(exc, _Logged):
                log.info("trtrtx: region %s: not timed against inductor on the whole Dynamo graph (%s: %s); "
                         "trtrtx's compiled graph runs it", region.name, type(exc).__name__, exc)
            self.inductor = None
            self._release()
            return self.trtrtx(*args)
        decision = _choices.Decision(region.kind, timing, "measured", SCOPE)
        if decision.kept == "inductor" and self._compiled() is None:
            self._release()
            return self.trtrtx(*args)  # (inductor's code with its CUDA graphs failed to compile: logged)
        self._decide(decision)
        _choices.record(self.options, region.engine_key, timing, SCOPE)
        return self.fn(*args)

    def _time(self, args: Sequence[Any]) -> _choices.Timing:
        """Both candidates' times on `args`. With inductor's CUDA graphs (cudagraph trees, which a
        CUDA graph capture of ours cannot hold, nor be timed against another tree) each is timed as
        the replay of a graph of its own, compiled without inductor's graphs for the timing; the
        code with inductor's graphs is compiled only where inductor is kept."""
        if self.replayable is None:
            inductor = self._compiled()
            if inductor is None:
                raise _Logged  # (_compiled said why)
            inductor(*args)  # (a first call: inductor's warm-up, or its failure, before anything is timed)
            return _choices.time_both(lambda: self.trtrtx(*args), lambda: inductor(*args))
        assert self.source is not None
        gm, example_inputs = self.source
        trtrtx = self.replayable()
        plain = _rest.inductor_graph(gm, example_inputs, dataclasses.replace(self.options, cuda_graph_strategy="disabled"),
                                     counted=False)
        plain(*args)
        return _choices.time_both(lambda: trtrtx(*args), lambda: plain(*args), graphs=True)

    def _decide(self, decision: _choices.Decision) -> None:
        region, timing = self.region, decision.timing
        region.fastest = decision
        keep = region.chosen == "inductor"
        text = (f"inductor's code for the whole Dynamo graph takes {timing.inductor_ms:.3f} ms a call and the "
                f"graph with this region on {region.kind} {timing.executor_ms:.3f} ms on this GPU ({decision.how})")
        if keep:
            assert self.inductor is not None
            self.fn = self.inductor
            self.reads_live_weights = True
            region.why = text
            _stats.count("rest_inductor_graphs_chosen")
        else:
            self.inductor = None  # (not kept: its code is dropped)
        self._release()
        log.info("trtrtx: region %s: %s: %s", region.name, text,
                 "inductor's code for the whole graph runs it" if keep else f"{region.kind} runs the region")
