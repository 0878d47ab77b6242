"""The package's one way to say something once per process.

A condition that holds for every compile (TensorRT-RTX missing, a runtime cache that cannot be
read, an exporter API that moved) is worth one line, not one per region or per call. What
has been said is kept on one object, `SAID`; tests give it a fresh one to hear a message again.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("rtx_backend")


class Once:
    """The messages (or keys) already said, under a lock: threads compile at the same time."""

    def __init__(self) -> None:
        self._said: set[str] = set()
        self._lock = threading.Lock()

    def first(self, key: str) -> bool:
        """True the first time `key` is given, False after."""
        with self._lock:
            if key in self._said:
                return False
            self._said.add(key)
            return True


SAID = Once()


def say_once(message: str, level: int = logging.WARNING, *, key: str | None = None) -> None:
    """Log `message` at `level` on the package's logger, the first time this process says it
    (or anything under `key`)."""
    if SAID.first(key if key is not None else message):
        log.log(level, message)


def one_line(exc: BaseException, limit: int = 300) -> str:
    """`Type: message` of an exception on one line, for a WARNING: exporter and TensorRT-RTX
    errors run to many lines (reports, tracebacks), which would break up the log. The first
    lines that say something, cut at `limit` characters; DEBUG logging keeps the whole error."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = " / ".join(lines[:3]) if lines else "(no message)"
    if len(text) > limit:
        text = text[: limit - 3].rstrip() + "..."
    return f"{type(exc).__name__}: {text}"
