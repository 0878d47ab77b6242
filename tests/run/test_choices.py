"""Timing a region's executor against inductor's code (run/choices.py)."""

from __future__ import annotations

import pytest
import torch

from rtx_backend._options import Options
from rtx_backend.run import choices as _choices


def test_plain_calls_are_timed_per_call():
    calls = {"executor": 0, "inductor": 0}

    def executor():
        calls["executor"] += 1

    def inductor():
        calls["inductor"] += 1

    timing = _choices.time_both(executor, inductor, graphs=True)  # no GPU here: plain calls
    per_way = _choices.WARMUP + _choices.ROUNDS * _choices.CALLS
    assert calls == {"executor": per_way, "inductor": per_way} or torch.cuda.is_available()
    assert timing.executor_ms >= 0 and timing.inductor_ms >= 0


def test_choices_under_cuda_graphs_are_kept_apart():
    plain, graphs = Options(), Options(cuda_graph_strategy="whole_graph_capture")
    assert _choices.here(plain) == _choices.here()
    assert (_choices.here(graphs) != _choices.here(plain)) == torch.cuda.is_available()


@pytest.mark.gpu
def test_gpu_graphs_time_replays_and_fall_back_to_calls_where_capture_fails():
    x = torch.randn(256, 256, device="cuda")
    launches = {"small": 0}

    def many_small():  # launch-bound: 200 tiny kernels
        launches["small"] += 1
        y = x
        for _ in range(200):
            y = y + 1
        return y

    def one_big():
        return x @ x

    eager = _choices.time_both(one_big, many_small, graphs=False)
    replayed = _choices.time_both(one_big, many_small, graphs=True)
    # captured once: the Python function ran only for warm-up and capture, then the graph replayed
    assert launches["small"] == 2 * _choices.WARMUP + _choices.ROUNDS * _choices.CALLS + 1
    assert replayed.inductor_ms < eager.inductor_ms  # launch costs gone in the replay

    def syncs():  # cannot be captured: .item() synchronizes
        return (x.sum() + 1).item()

    fallen = _choices.time_both(one_big, syncs, graphs=True)
    assert fallen.executor_ms > 0 and fallen.inductor_ms > 0
