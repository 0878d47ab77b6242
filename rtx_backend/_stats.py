"""Process-wide event counters (backend calls, engine builds, cache hits), for tests and benchmarks."""

from __future__ import annotations

import collections
import threading

_LOCK = threading.Lock()
_COUNTS: collections.Counter[str] = collections.Counter()


def count(event: str, n: int = 1) -> None:
    with _LOCK:
        _COUNTS[event] += n


def stats() -> dict[str, int]:
    """A snapshot of the counters."""
    with _LOCK:
        return dict(_COUNTS)


def reset_stats() -> None:
    """Set every counter of `rtx_backend.stats()` back to zero: to count what one piece of work
    (a compile, a benchmark round) did, call it first."""
    with _LOCK:
        _COUNTS.clear()
