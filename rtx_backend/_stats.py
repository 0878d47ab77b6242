"""Process-wide event counters (backend calls, engine builds, cache hits), for tests and benchmarks.

They live on one object, `COUNTERS`; `reset_stats()` zeroes it, and a test may give the module a
fresh `Counters()`."""

from __future__ import annotations

import collections
import threading


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


def stats() -> dict[str, int]:
    """A snapshot of the counters."""
    return COUNTERS.snapshot()


def reset_stats() -> None:
    """Set every counter of `rtx_backend.stats()` back to zero: to count what one piece of work
    (a compile, a benchmark round) did, call it first."""
    COUNTERS.clear()
