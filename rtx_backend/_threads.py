"""Work handed to a thread pool, also while the interpreter shuts down.

Once the main thread has finished, `concurrent.futures` refuses new work ("cannot schedule new
futures after interpreter shutdown"), yet work already under way may still hand some on: an
engine built behind the compile (option engine_build="background") stores itself in the engine
cache and makes its execution contexts. `submit` runs such work in the calling thread instead, so
that it is done, not lost.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any, TypeVar

R = TypeVar("R")


def submit(pool: concurrent.futures.Executor, fn: Callable[..., R], *args: Any) -> concurrent.futures.Future[R]:
    """`pool.submit(fn, *args)`; where the pool refuses (RuntimeError: the package never shuts its
    pools down, so the interpreter is shutting down), `fn(*args)` run here, its outcome in a
    finished future."""
    try:
        return pool.submit(fn, *args)
    except RuntimeError:
        pass
    done: concurrent.futures.Future[R] = concurrent.futures.Future()
    try:
        done.set_result(fn(*args))
    except Exception as exc:  # (as the pool would: the caller reads it from the future)
        done.set_exception(exc)
    return done
