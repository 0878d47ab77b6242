"""Reliability over time: compiling and releasing a model 50 times in one process leaves nothing
behind: every region module (with its ONNX Runtime session or engine) is freed, and host (and, on
a GPU, device) memory stays within a small bound of where it was after a warm-up.

The CPU test goes through the engine cache (targets declared, engine built once, regions run in
ONNX Runtime), so each cycle is the full compile path minus the export and build: Dynamo,
lowering, policy, partition, cache read, session creation, first-call validation."""

from __future__ import annotations

import gc
import logging
import os
import sys
import weakref

import pytest
import torch

from rtx_backend._record import recording

from .models import MLP, eval_model

CYCLES = 50
WARMUP = 10
HOST_BOUND_MB = 20.0  # measured here: 5 to 6 MB over 40 cycles (Dynamo's own bookkeeping)


def rss_mb() -> float:
    """Resident set size now (not the peak: ru_maxrss cannot show memory coming back)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.fixture(autouse=True)
def _no_trace_records(monkeypatch):
    """pytest keeps every log record of a test, and torch's structured-trace logger sends ~65
    DEBUG records (with their payloads) per compile to it: measure the backend, not pytest."""
    monkeypatch.setattr(logging.getLogger("torch.__trace"), "propagate", False)


def _cycles(model, x, options, on_cycle=None):
    """Compile, call, release CYCLES times; returns the weak references to every region made."""
    refs = []
    for i in range(CYCLES):
        compiled = torch.compile(model, backend="trtrtx", options=options)
        with torch.no_grad(), recording() as graphs:
            y = compiled(x)
        torch.testing.assert_close(y, model(x), atol=1e-3, rtol=1e-3)
        refs += [weakref.ref(r) for g in graphs for r in g.regions]
        del compiled, graphs, y
        torch._dynamo.reset()
        gc.collect()
        if on_cycle is not None:
            on_cycle(i)
    return refs


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_compile_and_release_50_times_host_memory():
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    marks = {}
    refs = _cycles(model, x, {"min_block_size": 1, "target_compute_capabilities": [(8, 6)]},
                   lambda i: marks.setdefault(i, rss_mb()) if i in (WARMUP - 1, CYCLES - 1) else None)
    assert len(refs) == CYCLES and all(r is not None for r in refs)
    alive = sum(r() is not None for r in refs)
    assert alive == 0, f"{alive} region modules outlived their compiled model"
    growth = marks[CYCLES - 1] - marks[WARMUP - 1]
    print(f"host RSS after warm-up {marks[WARMUP - 1]:.1f} MB, after {CYCLES} cycles "
          f"{marks[CYCLES - 1]:.1f} MB (+{growth:.1f} MB)")
    assert growth < HOST_BOUND_MB


@pytest.mark.gpu
def test_gpu_compile_and_release_50_times_device_and_host_memory():
    model = eval_model(MLP(), device="cuda")
    x = torch.randn(4, 16, device="cuda")
    marks = {}

    def mark(i):
        if i in (WARMUP - 1, CYCLES - 1):
            torch.cuda.synchronize()
            marks[i] = (rss_mb(), torch.cuda.memory_allocated() / 2**20,
                        (torch.cuda.mem_get_info()[1] - torch.cuda.mem_get_info()[0]) / 2**20)

    refs = _cycles(model, x, {"min_block_size": 1, "runtime": "tensorrt_rtx"}, mark)
    assert sum(r() is not None for r in refs) == 0
    (rss0, alloc0, used0), (rss1, alloc1, used1) = marks[WARMUP - 1], marks[CYCLES - 1]
    print(f"after warm-up / after {CYCLES} cycles: host RSS {rss0:.1f} / {rss1:.1f} MB, torch allocated "
          f"{alloc0:.1f} / {alloc1:.1f} MB, device used {used0:.1f} / {used1:.1f} MB")
    assert alloc1 - alloc0 < 1.0  # torch's allocator: the engines' outputs and inputs all freed
    assert used1 - used0 < 64.0  # the whole device, TensorRT-RTX's own allocations included
    assert rss1 - rss0 < 2 * HOST_BOUND_MB
