"""Work handed to a thread pool, also while the interpreter shuts down.

Once the main thread has finished, `concurrent.futures` refuses new work ("cannot schedule new
futures after interpreter shutdown"), yet work already under way may still hand some on: an
engine built behind the compile (option engine_build="background") stores itself in the engine
cache and makes its execution contexts. `Pool` (the package's thread pools, each made on first
use) runs such work in the calling thread instead, so that it is done, not lost.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any, TypeVar

R = TypeVar("R")


def submit(pool: concurrent.futures.Executor, fn: Callable[..., R], *args: Any) -> concurrent.futures.Future[R]:
    """`pool.submit(fn, *args)`; where the pool refuses (RuntimeError: the package never shuts its
    pools down, so the interpreter is shutting down), `fn(*args)` run here, its outcome in a
    finished future."""
    queued = _offer(pool, fn, *args)
    return queued if queued is not None else _run_here(fn, *args)


def _offer(pool: concurrent.futures.Executor, fn: Callable[..., R], *args: Any) -> concurrent.futures.Future[R] | None:
    try:
        return pool.submit(fn, *args)
    except RuntimeError:  # shutting down
        return None


def _run_here(fn: Callable[..., R], *args: Any) -> concurrent.futures.Future[R]:
    done: concurrent.futures.Future[R] = concurrent.futures.Future()
    try:
        done.set_result(fn(*args))
    except Exception as exc:  # (as the pool would: the caller reads it from the future)
        done.set_exception(exc)
    return done


class Pool:
    """A thread pool started on first use, whose `submit` runs refused work in the caller (see
    `submit`). The package never shuts one down: the interpreter's exit joins its threads."""

    def __init__(self, workers: int, name: str) -> None:
        self.workers = workers
        self.name = name
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def submit(self, fn: Callable[..., R], *args: Any) -> concurrent.futures.Future[R]:
        return submit(self._started(), fn, *args)  # (refused work runs here, under no lock of ours)

    def submit_recorded(self, lock: threading.Lock, record: Callable[[concurrent.futures.Future[R]], Any],
                        fn: Callable[..., R], *args: Any) -> concurrent.futures.Future[R]:
        """`submit`, with `record(future)` called under `lock` together with the queuing, so that a
        thread that reads the records under `lock` (a wait for pending work) never misses work
        already queued. Refused work is not recorded: it runs here, once `lock` is released, and
        is done when this returns."""
        with lock:
            queued = _offer(self._started(), fn, *args)
            if queued is not None:
                record(queued)
        return queued if queued is not None else _run_here(fn, *args)

    def _started(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix=self.name)
            return self._pool
