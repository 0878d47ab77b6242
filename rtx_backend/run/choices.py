"""The faster of a region's executor and inductor's code for it (option fastest, rest="inductor").

TensorRT-RTX's kernels are not the fastest for every region on every GPU (on GPUs it does not
list as RTX targets least of all). With `fastest`, each region is timed once, on the first call
after its executor passed its first-call check, against inductor's code for the same graph on
the same inputs; the faster runs it from then on. The timing is stored in the record beside the
region's engine (its engine-cache entry, signed like the entry), per GPU and driver, so that a
later process on the same machine decides without timing, and compiles inductor's code only for
the regions where it is the faster. Regions without an engine-cache entry are timed again in
each process.

Where one region is the whole graph (its rest only glue), the choice is made once for the graph
instead (assemble/rest_fastest.py): trtrtx's compiled graph against inductor's code for Dynamo's
own graph, recorded beside the region's engine under its own name (scope "graph").
"""

from __future__ import annotations

import dataclasses
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from .._options import Options
from ..cache.engines import EngineCache, validation_identity
from ..cache.store import Key

WARMUP = 3
ROUNDS = 5
CALLS = 5  # per round, each way: timings interleave, so that clocks and caches treat both alike


@dataclasses.dataclass(frozen=True)
class Timing:
    """Milliseconds per call of a region's executor and of inductor's code for it."""

    executor_ms: float
    inductor_ms: float


@dataclasses.dataclass(frozen=True)
class Decision:
    """What a region runs on with option fastest, and what that was decided on."""

    executor: str  # the kind of the executor timed against inductor ("tensorrt_rtx", "onnxruntime")
    timing: Timing
    source: str  # "cached": the timing stored beside the engine; "measured": timed in this process
    scope: str = "region"  # "region": inductor's code for the region; "graph": for Dynamo's whole graph

    @property
    def kept(self) -> str:
        """The faster: "inductor" or the executor's kind (a tie keeps the executor)."""
        return "inductor" if self.timing.inductor_ms < self.timing.executor_ms else self.executor

    @property
    def how(self) -> str:
        """How the log says it was decided: "recorded" (cached) or "timed" (measured)."""
        return "recorded" if self.source == "cached" else "timed"


def time_both(executor: Callable[[], Any], inductor: Callable[[], Any], graphs: bool = False) -> Timing:
    """Median milliseconds per call of each, in interleaved rounds (CUDA events on a GPU).

    `graphs`: the model runs in CUDA graphs (cuda_graph_strategy="whole_graph_capture"), so each
    is timed as the replay of a graph that captured one call: launch costs, which graphs remove,
    would otherwise count against inductor's many small kernels. Where either cannot be
    captured, both are timed as plain calls."""
    for _ in range(WARMUP):
        executor()
        inductor()
    if graphs and torch.cuda.is_available():
        replays = _captured(executor), _captured(inductor)
        if replays[0] is not None and replays[1] is not None:
            executor, inductor = replays[0].replay, replays[1].replay
    runs: dict[str, list[float]] = {"executor": [], "inductor": []}
    for _ in range(ROUNDS):
        for name, fn in (("executor", executor), ("inductor", inductor)):
            runs[name].append(_per_call_ms(fn))
    return Timing(statistics.median(runs["executor"]), statistics.median(runs["inductor"]))


def _captured(fn: Callable[[], Any]) -> torch.cuda.CUDAGraph | None:
    """A CUDA graph of one call of `fn` (already warmed up), or None where it cannot be captured."""
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception:  # a region or code that cannot be captured is timed as plain calls
        return None
    return graph


def _per_call_ms(fn: Callable[[], Any]) -> float:
    if torch.cuda.is_available():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(CALLS):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / CALLS
    t = time.perf_counter()
    for _ in range(CALLS):
        fn()
    return (time.perf_counter() - t) * 1e3 / CALLS


def here(options: Options | None = None) -> str:
    """This machine as choices name it: the GPU and driver, or the CPU (ONNX Runtime's path);
    with " cuda graphs" where the model runs in CUDA graphs (timed as replays, see time_both)."""
    machine = validation_identity() or f"cpu {platform.machine()} {platform.processor()}".strip()
    return machine + (" cuda graphs" if options is not None and in_graphs(options) else "")


def in_graphs(options: Options) -> bool:
    """Whether the model's calls replay CUDA graphs, so that regions are timed as replays."""
    return options.cuda_graph_strategy == "whole_graph_capture" and torch.cuda.is_available()


def _identity(options: Options, scope: str) -> str:
    """The name a choice is recorded under: this machine, and " whole graph" for a graph's choice."""
    return here(options) + (" whole graph" if scope == "graph" else "")


def recorded(options: Options, key: Key | None, scope: str = "region") -> Timing | None:
    """The timing stored beside the engine of `key` for this machine and scope, or None."""
    cache = EngineCache.for_options(options) if key is not None else None
    if cache is None or key is None:
        return None
    value = cache.choice(key, _identity(options, scope))
    try:
        return Timing(float(value["executor_ms"]), float(value["inductor_ms"])) if value else None
    except (KeyError, TypeError, ValueError):
        return None


def record(options: Options, key: Key | None, timing: Timing, scope: str = "region") -> None:
    """Store `timing` beside the engine of `key` for this machine and scope (nothing without an entry)."""
    cache = EngineCache.for_options(options) if key is not None else None
    if cache is not None and key is not None:
        cache.record_choice(key, _identity(options, scope), dataclasses.asdict(timing))
