"""A Dynamo graph, compiled or reused: from the graph cache when it holds the compiled graph
(its regions made from their engine-cache entries), else lowered and compiled, then stored."""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import _host
from .._log import one_line
from .._options import Options
from .._record import CompiledGraph, record
from ..build.profiles import symbol_overrides
from ..cache import engines as _engine_cache
from ..cache.engines import EngineCache, EngineEntry, Validation
from ..cache.graphs import GraphCache, GraphEntry, RegionRef, graph_key, shape_state
from ..cache.store import Key
from ..lower.lowering import is_weight, lower, without_autocast
from ..plan.partition import PartitionPlan
from ..run.region import RegionModule, direct_forward
from . import rest as _rest
from . import rest_fastest as _rest_fastest
from .graph import compile_graph, generate_code, warn_nothing_lowered
from .region import runtime_module

log = logging.getLogger("rtx_backend")


def compile_or_reuse(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Options,
    roots: list[torch.fx.GraphModule] | None = None,
    on_direct: Callable[[torch.fx.GraphModule], None] | None = None,
) -> Callable[..., Any]:
    """The compiled graph from the graph cache, else lowered and compiled (and then cached);
    with rest="inductor", compiled by inductor around its regions (rest.py); with option fastest
    and one region that is the whole graph, that against inductor on `gm` (rest_fastest.py).
    `roots` gets the partitioned graph (whose regions froze the weights); `on_direct` gets it
    when the result computes what it computes from Dynamo's inputs as they are (no aot_autograd
    wrapper around it; with the rest compiled by inductor, inductor's code for it)."""
    roots = roots if roots is not None else []
    if options.rest != "pytorch":
        direct: list[torch.fx.GraphModule] = []
        fn = compile_or_reuse(gm, example_inputs, _rest.for_regions(options), roots, direct.append)
        partitioned = direct[0] if len(direct) == 1 else None
        if on_direct is not None and partitioned is not None:
            on_direct(partitioned)
        choice = _rest.rest_choice(options, partitioned)  # rest="auto": inductor only where the rest computes
        if not choice.inductor:
            return fn
        if choice.op:
            log.info("trtrtx: rest='auto': inductor compiles this graph's rest (it runs %s outside the regions)",
                     choice.op)
        return _rest_fastest.compile_fastest(gm, example_inputs, partitioned, fn, options)
    graphs = GraphCache.for_options(options)
    key = graph_key(gm, example_inputs, options) if graphs is not None else None
    overrides = symbol_overrides(gm, options)  # the option names model inputs: map it on Dynamo's graph
    if graphs is not None and key is not None:
        reused = from_graph_cache(graphs, key, example_inputs, options, overrides, roots)
        if reused is not None:
            _host.release()  # nothing reads the weights' host copies now
            if on_direct is not None:
                on_direct(roots[-1])
            return reused
    plans: list[PartitionPlan] = []
    plain: list[bool] = []
    shapes = shape_state() if graphs is not None and key is not None else None
    fn = lower(gm, example_inputs, lambda aten_gm, args: compile_graph(aten_gm, args, options, overrides, plans.append),
               on_plain=lambda: plain.append(True))
    roots.extend(p.graph_module for p in plans)
    if on_direct is not None and plain and len(plans) == 1:
        on_direct(plans[0].graph_module)
    if graphs is not None and key is not None and plain and len(plans) == 1:
        if shape_state() == shapes:
            to_graph_cache(graphs, key, plans[0], example_inputs)
        else:
            log.debug("trtrtx: this graph is not cached: lowering it added guards on its symbolic sizes")
    return fn


def from_graph_cache(
    graphs: GraphCache, key: Key, example_inputs: Sequence[Any], options: Options,
    overrides: dict[str, Any] | None = None,
    roots: list[torch.fx.GraphModule] | None = None,
) -> Callable[..., Any] | None:
    """The compiled graph of a graph-cache entry, its regions made from their engine-cache
    entries; None when there is none or it cannot be used (then the graph is compiled)."""
    start = time.perf_counter()
    engines = EngineCache.for_options(options)
    if engines is None:
        return None
    fetched: dict[str, concurrent.futures.Future[EngineEntry | None]] = {}  # region -> its engine's read ahead

    def fetch_engines(refs: list[RegionRef]) -> None:
        try:
            fetched.update(zip([r.name for r in refs], _engine_cache.fetch_ahead(engines, [r.engine for r in refs])))
        except RuntimeError as exc:  # no new threads (the interpreter is exiting): loads read them in turn
            log.debug("trtrtx: engine entries not read ahead: %s", exc)

    entry = graphs.load(key, example_inputs, on_header=fetch_engines)
    if entry is None:
        return None
    modules = []
    try:
        for ref in entry.regions:
            hit = engines.load(ref.engine, fetched=fetched.get(ref.name))
            if hit is None:
                return None
            module = runtime_module(ref.name, entry.references[ref.name], hit.region, hit.engine, hit.profile,
                                    Validation(engines, ref.engine), options, torch.device(ref.device),
                                    overrides=overrides)
            setattr(entry.graph_module, ref.name, module)
            modules.append(module)
    except Exception as exc:  # an entry that cannot be rebuilt here: compile as if it were not there
        log.warning("trtrtx: graph cache entry %s is unusable (%s); compiling the graph again",
                    key.name, one_line(exc))
        return None
    gm = entry.graph_module
    generate_code(gm)
    if roots is not None:
        roots.append(gm)
    seconds = time.perf_counter() - start
    plan = PartitionPlan(gm, [r.name for r in entry.regions], entry.reasons, entry.eager_ops)
    record(CompiledGraph(plan, modules, seconds, from_graph_cache=True))
    if not modules:
        warn_nothing_lowered(plan)
    log.info("trtrtx: reused a compiled graph from the graph cache in %.2fs: %d region(s) %s, %d op(s) left in "
             "PyTorch", seconds, len(modules), [m.kind for m in modules], len(entry.eager_ops))
    return without_autocast(direct_forward(gm))


def to_graph_cache(graphs: GraphCache, key: Key, plan: PartitionPlan, example_inputs: Sequence[Any]) -> None:
    """Store the compiled graph when every region runs an engine from the engine cache (a region
    that fell back to PyTorch may do better in another process)."""
    modules = [getattr(plan.graph_module, n) for n in plan.regions]
    if not all(isinstance(m, RegionModule) and m.engine_key is not None and not m.executor.reference
               for m in modules):
        return
    entry = GraphEntry(plan.graph_module, {m.name: m.graph_module for m in modules},
                       [RegionRef(m.name, m.engine_key, str(m.device)) for m in modules], plan.reasons, plan.eager_ops)
    weights = {i: t for i, t in enumerate(example_inputs) if is_weight(t)}
    graphs.store_later(key, entry, weights)
