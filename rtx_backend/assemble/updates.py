"""Weight updates in the background (option weight_update="background", the default).

A region whose weights changed runs in PyTorch at once (its graph reads the live weights), while
one worker thread builds its engine again or refits it from a snapshot of the new weights; the
engine takes over once it is ready, and its first call is validated as a new engine's is. Each
change of a region's weights starts a new generation of it: an update that a later change
overtook is dropped (skipped if it has not started), so that only the newest weights are built.
`wait_for_updates()` waits until every update submitted so far has finished. The update of a
weight replaced by another weight that lives on can wait for the next call, which shows whether
several sets of weights share the graph (assemble/shared.py); `wait_for_updates()` starts such
updates first. The same thread
builds the engines that option engine_build="background" leaves behind the compile
(background.py), so it waits for those too.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .. import _threads

log = logging.getLogger("rtx_backend")


class Updates:
    """The worker thread (one: updates run in the order of the changes) and the updates pending."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.swap = threading.Lock()  # held to start a generation of a region, and to install one
        self.worker = _threads.Pool(1, "trtrtx-weights")
        self.pending: set[concurrent.futures.Future[Any]] = set()
        self.deferred = threading.local()  # this thread's jobs, submitted once its call has run
        self.held: weakref.WeakSet[Any] = weakref.WeakSet()  # owners of updates that wait for a call

    def submit(self, job: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        # pending from the moment it is queued (a wait on another thread waits for it); at exit the
        # job runs here instead (see _threads.Pool)
        future = self.worker.submit_recorded(self.lock, self.pending.add, job)
        future.add_done_callback(self._finished)
        return future

    def defer(self, job: Callable[[], Any]) -> None:
        """Submit `job` when this thread calls `start_deferred` (after the call that saw the change)."""
        jobs = getattr(self.deferred, "jobs", None)
        if jobs is None:
            jobs = self.deferred.jobs = []
        jobs.append(job)

    def start_deferred(self) -> None:
        jobs = getattr(self.deferred, "jobs", None)
        if jobs:
            self.deferred.jobs = []
            for job in jobs:
                self.submit(job)

    def hold(self, owner: Any) -> None:
        """`owner` (a weight guard) has regions whose update waits for its next call: a wait for the
        updates calls its `catch_up()` first, which starts them."""
        with self.lock:
            self.held.add(owner)

    def unhold(self, owner: Any) -> None:
        with self.lock:
            self.held.discard(owner)

    def _finished(self, future: concurrent.futures.Future[Any]) -> None:
        with self.lock:
            self.pending.discard(future)
        if not future.cancelled() and future.exception() is not None:  # jobs report their own failures
            log.warning("trtrtx: a weight update failed: %s", future.exception())

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for every update submitted so far (and any they submit); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            owners = list(self.held)
        for owner in owners:
            owner.catch_up()
        while True:
            with self.lock:
                pending = list(self.pending)
            if not pending:
                return True
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            _, not_done = concurrent.futures.wait(pending, timeout=left)
            if not_done:
                return False


UPDATES = Updates()


def wait_for_updates(timeout: float | None = None) -> bool:
    """Wait until the engines of every region whose weights changed are up to date (option
    weight_update="background": PyTorch runs such regions meanwhile), and every engine that option
    engine_build="background" builds behind a compile is in place. Returns False if `timeout`
    seconds passed first. A benchmark or a test that times engines after a change calls it."""
    return UPDATES.wait(timeout)
