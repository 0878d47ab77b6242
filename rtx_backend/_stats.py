"""Process-wide event counters (backend calls, engine builds, cache hits) and the milliseconds
spent in each compile stage (`<stage>_ms`: export, screen, build, runtime, validate), for tests,
benchmarks and the compile log.

They live on one object, `COUNTERS`; `reset_stats()` zeroes it, and a test may give the module a
fresh `Counters()`."""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Iterator

STAGES = ("export", "screen", "build", "runtime", "validate")  # in pipeline order, for the log


class Counters:
    """Event counts under a lock: regions build and run on several threads at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()

    def count(self, event: str, n: int = 1) -> None:
        with self._lock:
            self._counts[event] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def clear(self) -> None:
        with self._lock:
            self._counts.clear()


COUNTERS = Counters()


def count(event: str, n: int = 1) -> None:
    COUNTERS.count(event, n)


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Add the block's wall time to the counter `<name>_ms` (also when it raises)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        count(f"{name}_ms", round((time.perf_counter() - start) * 1e3))


def stage_seconds(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """The seconds spent in each stage between two snapshots of the counters (`{}`: since the
    last reset), for the stages that took any."""
    spent = {s: (after.get(f"{s}_ms", 0) - before.get(f"{s}_ms", 0)) / 1e3 for s in STAGES}
    return {s: v for s, v in spent.items() if v > 0}


def stage_split(before: dict[str, int], after: dict[str, int]) -> str:
    """The stages' seconds between two snapshots, for a log line: "export 2.1s, build 1.4s"."""
    return ", ".join(f"{s} {v:.2f}s" for s, v in stage_seconds(before, after).items() if v >= 0.005)


def stats() -> dict[str, int]:
    """A snapshot of the counters."""
    return COUNTERS.snapshot()


def reset_stats() -> None:
    """Set every counter of `rtx_backend.stats()` back to zero: to count what one piece of work
    (a compile, a benchmark round) did, call it first."""
    COUNTERS.clear()
