"""What a compiled model did: where each region ran, why, and where its engine came from.

    with rtx_backend.recording() as rec:
        y = compiled(x)              # the first call compiles, then runs
    print(rec)                       # one line per region
    rec.regions[0].runtime           # "TensorRT-RTX", "ONNX Runtime", "PyTorch" or "inductor"
    rec.regions[0].why               # why not TensorRT-RTX ("" when it runs there)
    rec.regions[0].fastest           # option fastest: the runtime kept and the times it was decided on

`explain` says what trtrtx would do before anything is built; this says what it did. The
records are read from the live regions whenever asked, so a region that first-call validation
sent to PyTorch during the call shows as such afterwards. Only graphs compiled inside the
`with` are recorded (a context variable, not a global registry): a model compiled earlier and
reused is not listed; `torch._dynamo.reset()` before the `with` compiles it again.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from .. import _record

RUNTIMES = {"tensorrt_rtx": "TensorRT-RTX", "onnxruntime": "ONNX Runtime", "pytorch": "PyTorch",
            "inductor": "inductor"}
ENGINE_SOURCES = {"built": "built", "engine cache": "loaded from the engine cache", "": "none"}


@dataclasses.dataclass(frozen=True)
class FastestRecord:
    """Option fastest's decision for a region: the runtime kept, the per-call times it was decided
    on, and whether they were measured in this process or read from the record beside the engine."""

    kept: str  # "TensorRT-RTX", "ONNX Runtime" or "inductor"
    times_ms: dict[str, float]  # runtime -> milliseconds a call, e.g. {"ONNX Runtime": 0.05, "inductor": 0.02}
    source: str  # "measured" (timed in this process) or "cached" (the engine cache's record)
    # "region": inductor's code for the region; "graph": the region is the whole graph, timed as
    # trtrtx's compiled graph against inductor's code for Dynamo's whole graph
    scope: str = "region"

    def __str__(self) -> str:
        times = ", ".join(f"{k} {v:.3f} ms" for k, v in self.times_ms.items())
        whole = "; whole graph: inductor on Dynamo's graph" if self.scope == "graph" else ""
        return f"fastest: {self.kept} kept ({times} a call; {self.source}{whole})"


@dataclasses.dataclass(frozen=True)
class RegionRecord:
    """One region of a compiled graph: one TensorRT-RTX engine (or its ONNX model, or its graph)."""

    graph: int
    name: str
    runtime: str  # "TensorRT-RTX", "ONNX Runtime", "PyTorch" or "inductor" (option fastest)
    why: str  # why it does not run on TensorRT-RTX; "" when it does
    engine: str  # "built", "loaded from the engine cache" or "none"
    engine_bytes: int  # size of the serialized engine (0: none)
    fastest: FastestRecord | None = None  # option fastest's decision (None: the option is off)


@dataclasses.dataclass(frozen=True)
class EagerRecord:
    """A node of a compiled graph that is not in any region, and the rule that kept it out."""

    graph: int
    node: str
    op: str
    rule: str
    reason: str


@dataclasses.dataclass(frozen=True)
class GraphRecord:
    """One graph that Dynamo handed to trtrtx."""

    index: int
    seconds: float  # the backend's compile time
    from_graph_cache: bool  # reused from the graph cache: not lowered again
    regions: tuple[RegionRecord, ...]
    kept_in_pytorch: tuple[EagerRecord, ...]
    not_lowered: str = ""  # why the whole graph runs in PyTorch or inductor ("" when it was lowered)


class Recording:
    """The graphs trtrtx compiled inside a `recording()` block, and what became of them."""

    def __init__(self, graphs: list[_record.CompiledGraph]) -> None:
        self._graphs = graphs  # appended to by the backend while the block runs

    @property
    def graphs(self) -> tuple[GraphRecord, ...]:
        return tuple(_graph_record(i, g) for i, g in enumerate(self._graphs))

    @property
    def regions(self) -> tuple[RegionRecord, ...]:
        return tuple(r for g in self.graphs for r in g.regions)

    @property
    def kept_in_pytorch(self) -> tuple[EagerRecord, ...]:
        return tuple(n for g in self.graphs for n in g.kept_in_pytorch)

    @property
    def runtimes(self) -> set[str]:
        """Where the regions run, e.g. {"TensorRT-RTX"}: check this in a script or a test."""
        return {r.runtime for r in self.regions}

    def to_dict(self) -> dict[str, Any]:
        return {"graphs": [dataclasses.asdict(g) for g in self.graphs]}

    def __str__(self) -> str:
        graphs, regions = self.graphs, self.regions
        per_runtime = ", ".join(f"{sum(r.runtime == k for r in regions)} on {k}" for k in RUNTIMES.values()
                                if any(r.runtime == k for r in regions))
        built = sum(r.engine == "built" for r in regions)
        loaded = sum(r.engine == ENGINE_SOURCES["engine cache"] for r in regions)
        lines = [f"trtrtx: {len(graphs)} graph(s) compiled, {len(regions)} region(s)"
                 + (f" ({per_runtime})" if per_runtime else "")
                 + f"; engines: {built} built, {loaded} loaded from the engine cache"]
        for g in graphs:
            if g.not_lowered:
                lines.append(f"graph {g.index}: not lowered, runs without TensorRT-RTX: {g.not_lowered}")
                continue
            source = "reused from the graph cache" if g.from_graph_cache else "compiled"
            lines.append(f"graph {g.index}: {source} in {g.seconds:.2f}s, {len(g.regions)} region(s), "
                         f"{len(g.kept_in_pytorch)} node(s) kept in PyTorch")
            said = ""
            for r in g.regions:
                size = f" ({r.engine_bytes} bytes)" if r.engine_bytes else ""
                # (a region that inductor runs because it is the faster: its times are the reason)
                why = f"; {r.why}" if r.why and not (r.fastest and r.fastest.kept == r.runtime) else ""
                if why and why == said:
                    why = "; the same reason"  # (one reason for every region, e.g. no GPU: said once)
                else:
                    said = why or said
                fastest = f"; {r.fastest}" if r.fastest else ""
                lines.append(f"  {r.name}: runs on {r.runtime}; engine {r.engine}{size}{why}{fastest}")
            rules: dict[str, int] = {}
            for n in g.kept_in_pytorch:
                rules[n.rule] = rules.get(n.rule, 0) + 1
            if rules:
                lines.append("  kept in PyTorch, by rule: " + ", ".join(f"{k} x{v}" for k, v in rules.items())
                             + " (rtx_backend.explain shows each node)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Recording: {len(self._graphs)} graph(s)>"


@contextlib.contextmanager
def recording() -> Iterator[Recording]:
    """Record what trtrtx compiles inside the block: `with rtx_backend.recording() as rec:`.

    Yields a `Recording`; read it after (or during) the block. Nesting is allowed: the inner
    block records its graphs, the outer one does not see them.
    """
    with _record.recording() as graphs:
        yield Recording(graphs)


def _graph_record(index: int, graph: _record.CompiledGraph) -> GraphRecord:
    regions = tuple(_region_record(index, m) for m in graph.regions)
    plan = graph.plan
    eager = []
    for node, op in (plan.eager_ops if plan is not None else ()):
        reason = plan.reasons.get(node)
        eager.append(EagerRecord(index, node, op, getattr(reason, "rule", "unknown"),
                                 getattr(reason, "message", "not placed in a region")))
    return GraphRecord(index, graph.seconds, graph.from_graph_cache, regions, tuple(eager), graph.not_lowered)


def _region_record(index: int, module: Any) -> RegionRecord:
    kind = "inductor" if getattr(module, "chosen", "") == "inductor" else module.kind
    runtime = RUNTIMES.get(kind, kind)
    engine = getattr(module, "engine", None)
    source = getattr(module, "engine_source", "") if engine is not None else ""
    why = "" if runtime == RUNTIMES["tensorrt_rtx"] else (getattr(module, "why", "") or "unknown")
    return RegionRecord(index, module.name, runtime, why, ENGINE_SOURCES.get(source, source),
                        len(engine) if engine is not None else 0, _fastest_record(getattr(module, "fastest", None)))


def _fastest_record(decision: Any) -> FastestRecord | None:
    """The record of a run.choices.Decision (None: option fastest is off, or not decided yet)."""
    if decision is None:
        return None
    executor = RUNTIMES.get(decision.executor, decision.executor)
    times = {executor: decision.timing.executor_ms, "inductor": decision.timing.inductor_ms}
    return FastestRecord(RUNTIMES.get(decision.kept, decision.kept), times, decision.source,
                         getattr(decision, "scope", "region"))
