"""The engine-build progress bar: only on terminals, only for long builds, off on request."""

from __future__ import annotations

import io
import logging
import sys

import pytest
import torch

from rtx_backend import Options
from rtx_backend.build import engine as _engine
from rtx_backend.build import progress as _progress

from ..helpers import compile_and_run
from ..models import MLP, eval_model


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def tiny_onnx() -> bytes:
    from rtx_backend.tools.info import _tiny_onnx

    return _tiny_onnx()


@pytest.mark.parametrize(
    ("options", "env", "stream", "expected"),
    [
        ({}, None, Tty(), True),
        ({}, None, io.StringIO(), False),  # a pipe, a CI log, a notebook
        ({"progress": False}, None, Tty(), False),
        ({}, "0", Tty(), False),
        ({}, "off", Tty(), False),
        ({}, "1", Tty(), True),
    ],
)
def test_enabled(monkeypatch, options, env, stream, expected):
    if env is None:
        monkeypatch.delenv(_progress.ENV, raising=False)
    else:
        monkeypatch.setenv(_progress.ENV, env)
    assert _progress.enabled(Options.from_dict(options), stream) is expected


def feed(progress: _progress.BuildProgress) -> None:
    """The callbacks TensorRT-RTX makes for a small build (names as in 1.7)."""
    progress.phase_start("Building engine", None, 3)
    progress.phase_start("Optimizing graph", "Building engine", 2)
    assert progress.step_complete("Optimizing graph", 0) is True
    assert progress.step_complete("Optimizing graph", 1) is True
    progress.phase_finish("Optimizing graph")
    assert progress.step_complete("Building engine", 0) is True
    assert progress.step_complete("Building engine", 1) is True
    progress.phase_finish("Building engine")


def test_bar_appears_after_the_delay_with_the_running_phase():
    out = Tty()
    progress = _progress.BuildProgress("building region_0", delay=0.0, file=out, mininterval=0.0)
    feed(progress)
    assert progress.shown
    assert progress.bar.n == 2 and progress.bar.total == 3  # top-level steps only
    progress.close()
    text = out.getvalue()
    assert "building region_0" in text and "2/3" in text and "Optimizing graph" in text


def test_short_build_shows_nothing():
    out = Tty()
    progress = _progress.BuildProgress("building", delay=60.0, file=out)
    feed(progress)
    progress.close()
    assert not progress.shown
    assert out.getvalue() == ""


def test_callback_errors_never_reach_tensorrt_rtx():
    progress = _progress.BuildProgress("building", delay=0.0, file=Tty())
    progress.bar = object()  # a broken bar: every use raises
    progress.phase_start("Building engine", None, 3)
    assert progress.step_complete("Building engine", 0) is True
    progress.phase_finish("Building engine")
    progress.close()


def test_tensorrt_rtx_drives_the_bar(monkeypatch, capsys):
    made = []

    class Immediate(_progress.BuildProgress):  # no delay, every callback redraws
        def __init__(self, description):
            super().__init__(description, delay=0.0, mininterval=0.0)
            made.append(self)

    monkeypatch.setattr(_progress, "enabled", lambda options: True)
    monkeypatch.setattr(_progress, "BuildProgress", Immediate)
    with _progress.build_progress(Options(), "building tiny") as monitor:
        assert monitor is not None
        built = _engine.build(tiny_onnx(), ((8, 6),), {}, monitor=monitor)
    assert len(built.data) > 1000
    bar = made[0].bar
    assert bar.total > 0 and 0 < bar.n <= bar.total  # TensorRT-RTX reported its top-level steps
    err = capsys.readouterr().err
    assert "building tiny" in err and "Building engine" in err


def test_no_monitor_when_disabled(monkeypatch):
    monkeypatch.setenv(_progress.ENV, "0")
    with _progress.build_progress(Options()) as monitor:
        assert monitor is None


@pytest.mark.parametrize("forced_on", [True, False])
def test_backend_passes_a_monitor_only_when_enabled(monkeypatch, forced_on):
    seen = []
    original = _engine.build

    def spy(*args, monitor=None, **kwargs):
        seen.append(monitor)
        return original(*args, monitor=monitor, **kwargs)

    monkeypatch.setattr("rtx_backend.assemble.region.build", spy)
    monkeypatch.setattr(_progress, "enabled", lambda options: forced_on and options.progress)
    model = eval_model(MLP())
    x = torch.randn(2, 16)
    y = compile_and_run(model, x, min_block_size=1, target_compute_capabilities=[(8, 6)], engine_cache_dir="")
    torch.testing.assert_close(y, model(x), atol=1e-4, rtol=1e-4)
    assert len(seen) == 1
    assert (seen[0] is not None) is forced_on


def test_log_lines_during_a_build_go_above_the_bar_and_the_handlers_come_back(monkeypatch):
    """A WARNING while a bar may be on the terminal is written by tqdm (a whole line above the
    bar, not cut into it); overlapping builds share the redirect, and the user's handlers return."""
    monkeypatch.setattr(_progress, "enabled", lambda options: True)
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    root.addHandler(handler)
    try:
        before = list(root.handlers)
        with _progress.build_progress(Options()) as first:
            assert first is not None and handler not in root.handlers
            with _progress.build_progress(Options()):  # another build at the same time
                assert handler not in root.handlers
            assert handler not in root.handlers  # the first build's bar may still be shown
        assert root.handlers == before
    finally:
        root.removeHandler(handler)
