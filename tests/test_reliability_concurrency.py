"""Reliability under threads: one compiled model called from several threads at once gives each
caller its own, correct result: when warm (executors serialize their sessions and contexts),
with two models at once, and while the first-call validation is still
deciding whether a region's runtime can be trusted."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import rtx_backend
from rtx_backend._record import recording
from rtx_backend.run import validation as _validation
from rtx_backend.run.executors import OrtExecutor

from .models import MLP, WithEagerOp, eval_model

ORT = {"min_block_size": 1, "runtime": "onnxruntime"}
THREADS = 8


def _hammer(compiled, model, n_threads=THREADS, calls=10, shape=(4, 16), barrier=True):
    """Every thread calls `compiled` on its own inputs; returns the worst error against eager."""
    gate = threading.Barrier(n_threads) if barrier else None

    def worker(seed):
        g = torch.Generator().manual_seed(seed)
        worst = 0.0
        with torch.no_grad():  # grad mode is per thread
            if gate is not None:
                gate.wait()
            for _ in range(calls):
                x = torch.randn(*shape, generator=g)
                worst = max(worst, (compiled(x) - model(x)).abs().max().item())
        return worst

    with ThreadPoolExecutor(n_threads) as pool:
        return max(pool.map(worker, range(n_threads)))


def test_warm_model_from_many_threads():
    model = eval_model(WithEagerOp())
    compiled = torch.compile(model, backend="trtrtx", options={**ORT, "torch_executed_ops": ["aten.sigmoid"]})
    with torch.no_grad(), recording() as graphs:
        compiled(torch.randn(4, 16))
    assert [r.kind for g in graphs for r in g.regions] == ["onnxruntime", "onnxruntime"]
    assert _hammer(compiled, model, calls=25) < 1e-5
    assert rtx_backend.stats()["backend_calls"] == 1  # no recompiles from threads


def test_two_models_run_concurrently():
    models = [eval_model(MLP()), eval_model(WithEagerOp())]
    compiled = [torch.compile(m, backend="trtrtx", options=ORT) for m in models]
    with torch.no_grad():  # warm up in one thread, as the README says: concurrent Dynamo traces
        for c in compiled:  # trip over PyTorch's global FX annotation state (KeyError: 'custom')
            c(torch.randn(4, 16))
    with ThreadPoolExecutor(4) as pool:
        errors = list(pool.map(lambda i: _hammer(compiled[i % 2], models[i % 2], n_threads=2, calls=5,
                                                 barrier=False), range(4)))
    assert max(errors) < 1e-5


def test_threads_never_see_a_wrong_result_while_validation_decides(monkeypatch):
    """The runtime is broken (zeros). One thread compiles and makes the first call; while its
    first-call check runs, other threads call the same compiled graph: none of them may return
    the broken outputs as if they had been checked."""
    original_call = OrtExecutor.run
    monkeypatch.setattr(OrtExecutor, "run", lambda self, a, t=(), s=None: [torch.zeros_like(o) for o in original_call(self, a, t, s)])
    original_compare = _validation.compare
    checking = threading.Event()

    def slow_compare(*args, **kwargs):
        checking.set()
        time.sleep(0.5)  # keep the window open for the other threads
        return original_compare(*args, **kwargs)

    monkeypatch.setattr(_validation, "compare", slow_compare)
    model = eval_model(MLP())
    compiled = torch.compile(model, backend="trtrtx", options=ORT)
    with ThreadPoolExecutor(1) as first:
        first_result = first.submit(lambda: _hammer(compiled, model, n_threads=1, calls=1))
        assert checking.wait(300)  # compiled, and its first call is being checked
        assert _hammer(compiled, model, calls=3, barrier=False) < 1e-5
        assert first_result.result() < 1e-5
    stats = rtx_backend.stats()
    assert stats["backend_calls"] == 1  # the others ran the graph the first thread compiled
    assert stats["validation_failures"] == 1  # one loud event, not one per thread


@pytest.mark.gpu
def test_gpu_model_from_many_threads():
    model = eval_model(MLP(), device="cuda")
    compiled = torch.compile(model, backend="trtrtx", options={"min_block_size": 1, "runtime": "tensorrt_rtx"})
    with torch.no_grad(), recording() as graphs:
        compiled(torch.randn(4, 16, device="cuda"))
    assert [r.kind for g in graphs for r in g.regions] == ["tensorrt_rtx"]

    def worker(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        stream = torch.cuda.Stream()  # each thread on its own stream, as servers do
        worst = 0.0
        with torch.no_grad(), torch.cuda.stream(stream):
            for _ in range(20):
                x = torch.randn(4, 16, device="cuda", generator=g)
                worst = max(worst, (compiled(x) - model(x)).abs().max().item())
        return worst

    with ThreadPoolExecutor(THREADS) as pool:
        assert max(pool.map(worker, range(THREADS))) < 1e-3


def test_work_handed_to_a_pool_that_refuses_it_runs_in_the_calling_thread():
    """At interpreter shutdown the pools refuse new work (a background build that stores its
    engine then): it runs where it was handed over, its outcome in the future."""
    from rtx_backend import _threads

    pool = ThreadPoolExecutor(1)
    pool.shutdown()
    done = _threads.submit(pool, lambda a: (a, threading.get_ident()), 3)
    assert done.done() and done.result() == (3, threading.get_ident())
    failed = _threads.submit(pool, lambda: 1 / 0)
    assert isinstance(failed.exception(), ZeroDivisionError)
    live = ThreadPoolExecutor(1)
    assert _threads.submit(live, threading.get_ident).result() != threading.get_ident()
    live.shutdown()
    pool = _threads.Pool(1, "trtrtx-test")  # the package's pools: started on first use
    assert pool.submit(lambda: threading.current_thread().name).result().startswith("trtrtx-test")


def test_recorded_work_is_recorded_under_the_callers_lock_and_refused_work_runs_outside_it():
    """The store's and the update thread's pending work is recorded with its queuing, under their
    lock (a flush or wait on another thread never misses queued work); work refused at shutdown is
    not recorded, and runs here once that lock is free."""
    from rtx_backend import _threads

    lock = threading.Lock()
    recorded = []
    pool = _threads.Pool(1, "trtrtx-test")
    gate = threading.Event()
    future = pool.submit_recorded(lock, lambda f: recorded.append((f, lock.locked())), gate.wait, 5)
    assert recorded == [(future, True)] and not future.done()
    gate.set()
    assert future.result() is True
    pool._started().shutdown()  # as at interpreter exit: the pool refuses
    here = pool.submit_recorded(lock, recorded.append, lambda: (threading.get_ident(), lock.locked()))
    assert here.done() and here.result() == (threading.get_ident(), False)
    assert len(recorded) == 1
