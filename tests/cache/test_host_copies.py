"""A compile copies each weight to the host once (rtx_backend/_host.py), for every reader: the
weight digests of the cache keys, TensorRT-RTX's parser and ONNX Runtime."""

from __future__ import annotations

import collections
import threading

import pytest
import torch

import rtx_backend
from rtx_backend import Options, _host
from rtx_backend.cache import engines as _engine_cache
from rtx_backend.export.model import host_buffer

from ..helpers import compile_and_run
from ..models import MLP, eval_model


class _Weight:
    """An onnx_ir tensor as host_buffer reads it: a torch tensor under `raw`."""

    def __init__(self, raw: torch.Tensor) -> None:
        self.raw = raw
        self.nbytes = raw.numel() * raw.element_size()


def counting(monkeypatch) -> collections.Counter:
    made: collections.Counter = collections.Counter()
    real = _host._to_host

    def to_host(t):
        made[_host.place(t)] += 1
        return real(t)

    monkeypatch.setattr(_host, "_to_host", to_host)
    return made


def test_one_copy_per_tensor_within_a_scope_for_every_reader(monkeypatch):
    made = counting(monkeypatch)
    weights = [torch.randn(16, 8).t(), torch.randn(4, 6)[:, ::2]]  # not contiguous: a copy is needed
    plain = [bytes(_engine_cache._tensor_bytes(w)) for w in weights]
    assert sum(made.values()) == 2  # outside a scope: a copy per read
    made.clear()
    with _host.sharing():
        digests = _engine_cache.tensor_digests(weights)
        buffers = [host_buffer(_Weight(w)) for w in weights]
        again = [_host.host_copy(w) for w in weights]
    assert list(made.values()) == [1, 1]
    assert [b.tobytes() for b in buffers] == plain  # the bytes ONNX lays out, from the shared copy
    assert digests == _engine_cache.tensor_digests(weights)  # the same digests as without the scope
    assert all(a.is_contiguous() and torch.equal(a, w) for a, w in zip(again, weights))


def test_a_contiguous_host_tensor_is_never_copied(monkeypatch):
    made = counting(monkeypatch)
    w = torch.randn(8, 8)
    with _host.sharing():
        assert _host.host_copy(w).data_ptr() == w.data_ptr()
    assert not made


def test_copies_of_a_scope_are_let_go_when_it_ends_or_is_released():
    w = torch.randn(8, 8).t()
    with _host.sharing():
        first = _host.host_copy(w)
        assert _host.host_copy(w) is first
        _host.release()
        assert _host.host_copy(w) is not first
        copies = _host.current()
        assert copies is not None and len(copies) == 1
    assert _host.current() is None


def test_another_thread_uses_the_scope_it_is_handed():
    w = torch.randn(8, 8).t()
    with _host.sharing():
        mine = _host.host_copy(w)
        copies = _host.current()
    seen = []
    for fn in (_host.within(copies, _host.host_copy), _host.host_copy):
        thread = threading.Thread(target=lambda fn=fn: seen.append(fn(w)))
        thread.start()
        thread.join()
    assert seen[0] is mine  # handed the compile's scope (the engine cache's writer is)
    assert seen[1] is not mine and torch.equal(seen[1], mine)  # a thread does not inherit it


def test_views_of_other_elements_get_copies_of_their_own():
    base = torch.arange(24.0).reshape(4, 6)
    a, b = base[:, :3], base[:, 3:]
    with _host.sharing():
        assert torch.equal(_host.host_copy(a), a) and torch.equal(_host.host_copy(b), b)


@pytest.mark.gpu
def test_a_cuda_model_compiles_with_one_host_copy_of_each_weight(monkeypatch):
    made: collections.Counter = collections.Counter()
    real = _host._to_host

    def to_host(t):
        made[_host.place(t), threading.current_thread().name.startswith("trtrtx-cache-write")] += 1
        return real(t)

    monkeypatch.setattr(_host, "_to_host", to_host)
    model = eval_model(MLP(64, 256, 64), torch.float16, "cuda")
    x = torch.randn(4, 64, device="cuda", dtype=torch.float16)
    out = compile_and_run(model, x)
    torch.testing.assert_close(out, model(x), atol=2e-2, rtol=2e-2)
    assert rtx_backend.stats()["engine_builds"] == 1
    weights = {_host.place(p.detach()) for p in model.parameters() if p.dim() > 1}
    assert weights <= {where for where, _ in made}  # read on the host: digests, parser, engine cache
    assert set(made.values()) == {1}  # once each
    assert not any(writer for _, writer in made)  # the cache's writer stored the compile's copies
    assert rtx_backend.stats()["engine_cache_misses"] == 1 and list(Options().engine_cache_path.glob("*.engine"))
