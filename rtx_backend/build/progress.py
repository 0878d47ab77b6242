"""A tqdm progress bar on long engine builds, driven by TensorRT-RTX's IProgressMonitor.

A large model can take a minute to build, and a silent minute looks like a hang. Short builds
(most regions) must stay silent, so the bar appears only once a build has run for `DELAY_S`
seconds (tqdm's `delay`), only when stderr is a terminal (notebooks, CI logs and pipes stay
clean), and never with `options={"progress": False}` or `RTX_BACKEND_PROGRESS=0`.

    with build_progress(options) as monitor:
        built = build(onnx_model, targets, profile, monitor=monitor)

The bar counts the steps of TensorRT-RTX's top-level phase ("Building engine") and shows the
innermost phase running (e.g. "Optimizing graph") after it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO, Any

from .. import _trt
from .._options import Options

log = logging.getLogger("rtx_backend")

DELAY_S = 2.0
ENV = "RTX_BACKEND_PROGRESS"
_OFF = ("0", "false", "no", "off")


def enabled(options: Options, stream: IO[str] | None = None) -> bool:
    """Whether a build may show a bar: the option, the environment, and a terminal on stderr."""
    if not options.progress or os.environ.get(ENV, "").strip().lower() in _OFF:
        return False
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


@contextlib.contextmanager
def build_progress(options: Options, description: str = "trtrtx: building engine") -> Iterator[Any]:
    """A TensorRT-RTX progress monitor for one build (None when no bar may be shown)."""
    if not enabled(options) or not _trt.available():
        yield None
        return
    progress = BuildProgress(description)
    try:
        monitor = make_monitor(progress)
    except Exception as exc:  # an older TensorRT-RTX without IProgressMonitor: build without a bar
        log.debug("trtrtx: no build progress bar (%s)", exc)
        yield None
        return
    try:
        with _log_lines_above_the_bar():
            yield monitor
    finally:
        progress.close()


class _Redirect:
    """How many builds may show a bar now, and tqdm's redirect of the log while any does."""

    def __init__(self) -> None:
        self.count = 0
        self.context: Any = None
        self.lock = threading.Lock()


_REDIRECT = _Redirect()


@contextlib.contextmanager
def _log_lines_above_the_bar() -> Iterator[None]:
    """While a bar may be on the terminal, log records go through tqdm.write (tqdm's
    logging_redirect_tqdm), so that a WARNING printed during a build is a whole line above the bar,
    not cut into it. Builds on several threads share one redirect: the first in installs it, the
    last out removes it, so the user's handlers are restored exactly once."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    with _REDIRECT.lock:
        if _REDIRECT.count == 0:
            context = logging_redirect_tqdm()
            context.__enter__()
            _REDIRECT.context = context
        _REDIRECT.count += 1
    try:
        yield
    finally:
        with _REDIRECT.lock:
            _REDIRECT.count -= 1
            if _REDIRECT.count == 0 and _REDIRECT.context is not None:
                context, _REDIRECT.context = _REDIRECT.context, None
                context.__exit__(None, None, None)


class BuildProgress:
    """The bar's state; TensorRT-RTX calls it from its own threads, hence the lock.

    Callbacks never raise (an exception inside TensorRT-RTX's callback would abort the build)
    and always let the build go on.
    """

    def __init__(
        self, description: str, *, delay: float | None = None, file: IO[str] | None = None, mininterval: float = 0.2
    ) -> None:
        self.description = description
        self.delay = DELAY_S if delay is None else delay
        self.mininterval = mininterval
        self.file = file
        self.lock = threading.Lock()
        self.bar: Any = None
        self.running: list[str] = []  # phases started and not finished, outermost first
        self.top: str | None = None  # the current top-level phase, whose steps the bar counts
        self.start = time.perf_counter()

    def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
        with self.lock, _never_raise():
            self.running.append(phase_name)
            if parent_phase is None:
                self.top = phase_name
                steps = max(int(num_steps), 0)
                if self.bar is None:
                    self._bar(steps)
                else:
                    self.bar.total += steps
            self._show(0)

    def step_complete(self, phase_name: str, step: int) -> bool:
        with self.lock, _never_raise():
            self._show(1 if phase_name == self.top else 0)
        return True

    def phase_finish(self, phase_name: str) -> None:
        with self.lock, _never_raise():
            if phase_name in self.running:
                del self.running[len(self.running) - 1 - self.running[::-1].index(phase_name)]
            if phase_name == self.top:
                self.top = None
            self._show(0)

    def close(self) -> None:
        with self.lock, _never_raise():
            if self.bar is not None:
                self.bar.close()
                seconds = time.perf_counter() - self.start
                log.debug("trtrtx: engine build progress closed after %.1fs", seconds)

    @property
    def shown(self) -> bool:
        """Whether the bar has been drawn (the build ran longer than the delay)."""
        bar = self.bar
        return bar is not None and bar.last_print_t >= bar.start_t + bar.delay

    def _bar(self, total: int | None = None) -> Any:
        if self.bar is None:
            from tqdm import tqdm

            # miniters=0: every callback may redraw (at most every mininterval, never before
            # `delay`), so the phase name stays current while a long phase runs.
            self.bar = tqdm(total=total, desc=self.description, delay=self.delay, file=self.file or sys.stderr,
                            leave=False, miniters=0, mininterval=self.mininterval, unit="step", disable=False)
        return self.bar

    def _show(self, steps: int) -> None:
        bar = self._bar()
        if self.running:
            bar.set_postfix_str(self.running[-1], refresh=False)
        bar.update(steps)


@contextlib.contextmanager
def _never_raise() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        log.debug("trtrtx: build progress bar error ignored: %s", exc)


def make_monitor(progress: BuildProgress) -> Any:
    """A trt.IProgressMonitor that forwards to `progress` (the class needs TensorRT-RTX)."""
    base = _trt.trt().IProgressMonitor

    class Monitor(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            base.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            progress.phase_start(phase_name, parent_phase, num_steps)

        def step_complete(self, phase_name: str, step: int) -> bool:
            return progress.step_complete(phase_name, step)

        def phase_finish(self, phase_name: str) -> None:
            progress.phase_finish(phase_name)

    return Monitor()
