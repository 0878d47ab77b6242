"""The exporter's op list (rtx_backend/lower/exporter_ops.py): built once, then read from the cache root."""

from __future__ import annotations

import json

import pytest
import torch

from rtx_backend.lower import exporter_ops as _exporter_ops
from rtx_backend.lower import registry as _registry


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("RTX_BACKEND_CACHE_DIR", str(tmp_path))
    _exporter_ops.translated.cache_clear()
    yield tmp_path
    _exporter_ops.translated.cache_clear()


def _no_registry():
    raise AssertionError("the registry was built although the op list was on disk")


def test_list_matches_the_registry_and_is_reused_by_a_later_start(fresh, monkeypatch):
    from torch.onnx._internal.exporter import _decomp

    names = _exporter_ops.translated()
    registry = _registry.full_registry()
    expected = {str(op) for op in _decomp.get_onnx_implemented_overloads(registry)
                if isinstance(op, torch._ops.OpOverload)}
    assert names == expected
    assert _exporter_ops.is_translated(torch.ops.aten.addmm.default)
    assert not _exporter_ops.is_translated(torch.ops.aten._cdist_forward.default)
    (saved,) = fresh.glob("exporter/ops-*.json")
    assert set(json.loads(saved.read_text())) == names
    _exporter_ops.translated.cache_clear()  # a new process: the file answers
    monkeypatch.setattr(_registry, "full_registry", _no_registry)
    assert _exporter_ops.translated() == names
    assert torch.ops.aten.scaled_dot_product_attention.default in _exporter_ops.overloads()


@pytest.mark.parametrize("content", [b"", b"{not json", b"[]", b'{"a": 1}', b"[1, 2]"])
def test_corrupt_list_is_rebuilt(fresh, content):
    names = _exporter_ops.translated()
    (saved,) = fresh.glob("exporter/ops-*.json")
    saved.write_bytes(content)
    _exporter_ops.translated.cache_clear()
    assert _exporter_ops.translated() == names
    assert set(json.loads(saved.read_text())) == names


def test_unwritable_cache_root_still_answers(fresh, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError("read-only cache")

    monkeypatch.setattr(_exporter_ops, "atomic_write", refuse)
    assert _exporter_ops.is_translated(torch.ops.aten.relu.default)
    assert not list(fresh.glob("exporter/*.json"))
