"""compile_threads: how many CPU threads TensorRT-RTX's builder (and its runtime, when it compiles
an engine's kernels) may use. TensorRT-RTX uses one unless told otherwise."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch

import rtx_backend
from rtx_backend import _trt
from rtx_backend.build import engine as _engine
from rtx_backend.export.bridge import export_region
from rtx_backend.run import executors as _executors

from ..helpers import compile_and_run, regions
from ..models import ConvNet, eval_model
from .test_progress import tiny_onnx

pytestmark = pytest.mark.skipif(not _trt.available(), reason="TensorRT-RTX is not importable")


def test_threads_default_to_every_cpu_the_process_may_run_on(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    assert _trt.threads() == 3
    assert _trt.threads(2) == 2  # what the option asks for, even above the CPUs there are
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # macOS, Windows
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert _trt.threads() == 6


@pytest.mark.parametrize("threads", [1, 3])
def test_a_build_gives_the_builder_the_threads_asked_for(threads):
    network = _engine.parse_network(tiny_onnx())
    assert network.builder.max_threads == 1  # TensorRT-RTX's own default
    _engine.build(network, ((8, 6),), {}, threads=threads)
    assert network.builder.max_threads == threads


def test_a_build_without_a_count_uses_every_cpu(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    network = _engine.parse_network(tiny_onnx())
    _engine.build(network, ((8, 6),), {})
    assert network.builder.max_threads == 2


def test_threads_do_not_change_the_engine():
    """The engine cache keys engines without the thread count: a build with more threads must
    give the same engine, byte for byte."""
    model = eval_model(ConvNet())
    compile_and_run(model, torch.randn(2, 3, 16, 16), target_compute_capabilities=[(8, 6)])
    (region,) = regions()
    source = export_region(region.graph_module).model
    digests = {threads: hashlib.sha256(bytes(_engine.build(source, ((8, 6),), {}, threads=threads).data)).digest()
               for threads in (1, 2, 4)}
    assert len(set(digests.values())) == 1


def test_the_option_reaches_the_builder(monkeypatch):
    seen: list[tuple[str, int]] = []
    real = _trt.allow_threads

    def spy(obj, count=None):
        real(obj, count)
        seen.append((type(obj).__name__, obj.max_threads))

    monkeypatch.setattr(_trt, "allow_threads", spy)
    model = eval_model(ConvNet())
    x = torch.randn(2, 3, 16, 16)
    out = compile_and_run(model, x, target_compute_capabilities=[(8, 6)], compile_threads=2)
    torch.testing.assert_close(out, model(x), atol=1e-4, rtol=1e-4)
    assert rtx_backend.stats()["engine_builds"] == 1
    assert seen == [("Builder", 2)]


@pytest.mark.gpu
@pytest.mark.parametrize("threads", [None, 3])
def test_the_runtime_that_loads_an_engine_gets_the_threads(threads, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4}, raising=False)
    model = eval_model(ConvNet(), device="cuda")
    x = torch.randn(2, 3, 16, 16, device="cuda")
    options = {"compile_threads": threads} if threads else {}
    out = compile_and_run(model, x, **options)
    torch.testing.assert_close(out, model(x), atol=1e-3, rtol=1e-3)
    (region,) = regions()
    assert isinstance(region.executor, _executors.TrtExecutor)
    assert region.executor.runtime.max_threads == (threads or 5)
