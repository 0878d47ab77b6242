"""One compiled graph, several sets of weights: regional compilation.

diffusers' `compile_repeated_blocks` (and `torch.compile` of each block of a ModuleList) makes
Dynamo compile one graph for a block class, whose parameters are graph inputs, and call it with
each block's own parameters. Lowering froze the first block's weights into the regions; every
call of another block then brings other tensor objects in their place, which the weight guard
(weights.py) would take for a change and build the engines again for, on every call.

`WeightSets` tells the two apart. A swap (every changed weight replaced by another parameter or
buffer of the same shape, dtype and device) whose weights swapped away live on (another block
holds them) parks the regions that read them in PyTorch, with the call's weights: no engine is
built for one block. The call that brings back a weight swapped away before (block 1 again, at
the next step) tells that several sets share the graph. A parameter replaced while nothing else
holds the old one is a weight change as any other (weights.py); one whose old tensor lives on is
parked too, and the next call that brings the new one again, another kind of change, or
`wait_for_updates()` (updates.Updates.hold) brings its regions up to date. A change in place (an
optimizer step, `load_state_dict`) is never a swap.

The graph is then switched, once, to regions that take those weights as engine inputs
(`switch`, with shared_graph.weights_as_inputs): exported with them as ONNX graph inputs, built
once (on the update thread, PyTorch running the new regions meanwhile, as engine_build=
"background" builds them; in the call with weight_update="wait" or strict), keyed by the graph and not by one block's values; from then on
a call passes its block's tensors to the engines, and a new set costs nothing. Weights that every
call shares (the same tensor objects) stay frozen and checked.
"""

from __future__ import annotations

import copy
import logging
import time
import weakref
from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch

from .. import _host, _record, _stats
from .._errors import RegionRefused
from .._log import one_line
from .._options import Options
from ..cache import engines as _engine_cache
from ..lower.lowering import is_weight, without_autocast
from ..run.executors import TorchExecutor
from ..run.region import RegionModule, direct_forward
from . import rest as _rest
from .region import compile_region
from .shared_graph import frozen_uses, weights_as_inputs
from .updates import UPDATES

log = logging.getLogger("rtx_backend")


class WeightSets:
    """Whether the calls of one graph swap its weights for other weights, call after call.

    A swap (every changed weight replaced by another weight of its spec) whose weights swapped
    away live on (another block holds them) parks the regions that read them: PyTorch runs them
    with the call's weights, and no engine is built for one block. The call that brings back a
    weight swapped away before tells that several sets share the graph (`returning`); a call
    that keeps its weights, a change of another kind, or a wait for updates tells that it was a
    replacement, and the parked regions are brought up to date then (`settle`)."""

    def __init__(self) -> None:
        self.gone: dict[int, weakref.ReferenceType[torch.Tensor]] = {}  # weights swapped away, by id
        self.swapped: set[int] = set()  # the inputs swapped since the last call that kept them
        self.parked: set[int] = set()  # the inputs whose regions wait for an update (in PyTorch meanwhile)

    @staticmethod
    def is_swap(changed: Sequence[int], by_index: dict[int, Any], old: dict[int, Any]) -> bool:
        return bool(changed) and all(by_index[i] is not old[i] and is_weight(by_index[i]) for i in changed)

    def returning(self, changed: Sequence[int], by_index: dict[int, Any]) -> frozenset[int] | None:
        """The inputs that several sets of weights share, when this swap brings back a weight
        swapped away before; else None."""
        if not any(self._was_gone(by_index[i]) for i in changed):
            return None
        shared = frozenset(self.swapped | set(changed))
        self.settle()
        return shared

    def park(self, changed: Sequence[int], gone: Sequence[weakref.ReferenceType[torch.Tensor]]) -> bool:
        """Whether the weights this swap put away (`gone`) live on: then its inputs are parked."""
        if not any(ref() is not None for ref in gone):
            return False
        self.gone.update((id(t), ref) for ref in gone if (t := ref()) is not None)
        self.swapped.update(changed)
        self.parked.update(changed)
        return True

    def settle(self) -> set[int]:
        """The last swaps were replacements: forget them; returns the parked inputs, to update."""
        parked = self.parked
        self.gone, self.swapped, self.parked = {}, set(), set()
        return parked

    def _was_gone(self, tensor: Any) -> bool:
        ref = self.gone.get(id(tensor))
        return ref is not None and ref() is tensor


# How a region's engine is built behind the compile: background.start, which sets it here (that
# module imports this one).
BUILD_LATER: list[Callable[..., Any] | None] = [None]


def park(module: RegionModule, changed: set[int]) -> None:
    """Run the region in PyTorch (reading the call's weights) until its update, if it reads any
    of the inputs `changed`; an update of older weights still under way is dropped."""
    if not changed.intersection(frozen_uses(module.graph_module)):
        return
    with UPDATES.swap:
        module.generation += 1
        if module.building:
            return
        executor = module.updating or module.executor
        if isinstance(executor, TorchExecutor) or module.onnx is None:
            return
        module.updating = executor
        module.executor = TorchExecutor(module.graph_module)
        module.why = "its weights changed: PyTorch runs it until its engine has the new ones"


def switch(
    direct: torch.fx.GraphModule, shared: Collection[int], options: Options, overrides: Callable[[], dict[str, Any]],
) -> tuple[Callable[..., Any], torch.fx.GraphModule]:
    """The compiled graph whose regions take the weights `shared` as inputs, and its partitioned
    graph: made from `direct` (a partitioned graph that takes Dynamo's inputs as they are), its
    regions exported now and their engines built on the update thread (PyTorch runs them
    meanwhile) or, with weight_update="wait" or strict, now."""
    start = time.perf_counter()
    rest, options = options.rest, _rest.for_regions(options)
    gm, graphs = weights_as_inputs(direct, shared)
    now = options.weight_update == "wait" or options.strict or options.runtime == "tensorrt_rtx"
    made: dict[str, RegionModule] = {}
    for name, region_gm in graphs.items():
        old = getattr(direct, name)
        with UPDATES.swap:
            old.generation += 1  # an update of its frozen weights still under way is dropped
        module = _compiled(name, region_gm, options, overrides(), now)
        setattr(gm, name, module)
        made[name] = module
    torch.fx.GraphModule.recompile(gm)  # (graph.generate_code: its real code, not a lazy stub)
    _follow_record(direct, gm, made)
    _stats.count("shared_weight_graphs")
    log.info("trtrtx: this graph is called with %d weight(s) swapped for other weights on every call (one graph for "
             "several blocks of the model, as regional compilation makes): %d region(s) take them as inputs from now "
             "on, %s%s", len(shared), len(made),
             f"built in {time.perf_counter() - start:.2f}s" if now else "their engines built in the background "
             "(PyTorch runs them meanwhile)", "; the rest of the graph runs in PyTorch" if rest == "inductor" else "")
    return without_autocast(direct_forward(gm)), gm


def _compiled(name: str, region_gm: torch.fx.GraphModule, options: Options, overrides: dict[str, Any],
              now: bool) -> RegionModule:
    """The region with weights as inputs, exported here (the exporter's tracing state is the
    process's: not beside a compile on another thread), its engine built now or (not `now`) on the
    update thread, PyTorch running it meanwhile (background.py); in PyTorch where that fails."""
    later = None if now else BUILD_LATER[0]
    try:
        with _engine_cache.digest_scope(), _host.sharing():  # (the bridge edits the graph it exports: a copy)
            return compile_region(name, torch.fx.GraphModule(region_gm, copy.deepcopy(region_gm.graph)), overrides,
                                  options, later)
    except RegionRefused as exc:  # the parser wants some of them as constants
        if options.strict:
            raise
        log.warning("trtrtx: region %s runs in PyTorch: with its weights as inputs, %s", name, one_line(exc))
        module = RegionModule(name, region_gm, None, None, TorchExecutor(region_gm))
        module.why = f"with its weights as inputs, {one_line(exc)}"
        return module


def _follow_record(direct: torch.fx.GraphModule, gm: torch.fx.GraphModule, made: dict[str, RegionModule]) -> None:
    """`recording()`'s record of the graph lists the regions that run it now."""
    graph = _record.of_graph(direct)
    if graph is None:
        return
    graph.regions[:] = [made.get(getattr(m, "name", ""), m) for m in graph.regions]
    _record.follow(gm, graph)

