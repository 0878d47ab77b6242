"""Scoped recording of what the backend compiled, for crosscheck, tests and the public
`rtx_backend.recording()` (`_recording.py`, the stable form users see).

    with recording() as graphs:
        compiled(x)
    graphs[0].regions  # the RegionModules of the first compiled graph

A context variable, not a global registry: only code inside the `with` sees the records.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import weakref
from collections.abc import Iterator
from typing import Any

_ACTIVE: contextvars.ContextVar[list[CompiledGraph] | None] = contextvars.ContextVar(
    "rtx_backend_recording", default=None
)


@dataclasses.dataclass
class CompiledGraph:
    """One graph handed to the backend: its partition plan and its runtime modules."""

    plan: Any  # plan.partition.PartitionPlan; None for a graph that was not lowered
    regions: list[Any]  # run.region.RegionModule, in graph order
    seconds: float
    from_graph_cache: bool = False
    not_lowered: str = ""  # why the whole graph runs in PyTorch or inductor ("" when it was lowered)


@contextlib.contextmanager
def recording() -> Iterator[list[CompiledGraph]]:
    graphs: list[CompiledGraph] = []
    token = _ACTIVE.set(graphs)
    try:
        yield graphs
    finally:
        _ACTIVE.reset(token)


# each recorded graph's record, by its partitioned graph: a graph switched to regions of its own
# later (assemble/shared.py) makes its record list them (both held weakly: the compiled graph owns
# the one, the recording the other)
_BY_GRAPH: weakref.WeakKeyDictionary[Any, weakref.ReferenceType[CompiledGraph]] = weakref.WeakKeyDictionary()


def record(graph: CompiledGraph) -> None:
    graphs = _ACTIVE.get()
    if graphs is not None:
        graphs.append(graph)
        if graph.plan is not None:
            follow(graph.plan.graph_module, graph)


def follow(gm: Any, graph: CompiledGraph) -> None:
    """Make `graph` the record of the partitioned graph `gm` too."""
    _BY_GRAPH[gm] = weakref.ref(graph)


def of_graph(gm: Any) -> CompiledGraph | None:
    """The record of a partitioned graph compiled inside a `recording()`, if any."""
    ref = _BY_GRAPH.get(gm)
    return ref() if ref is not None else None


def record_not_lowered(why: str) -> None:
    """A graph that the backend did not lower at all (grad mode, meta inputs, a failure): recorded
    too, so that `recording()` says so instead of leaving it out."""
    record(CompiledGraph(None, [], 0.0, not_lowered=why))
