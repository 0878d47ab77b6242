"""The exporter's op list (rtx_backend/lower/exporter_ops.py): built once, then read from the cache root."""

from __future__ import annotations

import json
import logging
import os
import stat
import threading

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


def _in_a_thread(fn, timeout=60.0):
    """fn's result, or a failure when it has not returned within `timeout` seconds (a hang)."""
    done: list = []
    thread = threading.Thread(target=lambda: done.append(fn()), daemon=True)
    thread.start()
    thread.join(timeout)
    assert done, f"{fn.__name__} did not return within {timeout} s (blocked on a read?)"
    return done[0]


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_a_list_that_is_not_a_regular_file_is_a_warning_not_a_hang(fresh, caplog, kind):
    names = _exporter_ops.translated()
    (saved,) = fresh.glob("exporter/ops-*.json")
    saved.unlink()
    if kind == "fifo":
        os.mkfifo(saved)
    elif kind == "symlink":
        (fresh / "elsewhere.json").write_text(json.dumps(sorted(names)))
        saved.symlink_to(fresh / "elsewhere.json")
    else:
        saved.mkdir()
    _exporter_ops.translated.cache_clear()
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        assert _in_a_thread(lambda: _exporter_ops.is_ours(saved)) is False  # clear-cache's question: no hang
        assert _in_a_thread(_exporter_ops.translated) == names
    expected = {"fifo": "is a FIFO", "symlink": "is a symbolic link", "directory": "is a directory"}[kind]
    assert f"{saved} {expected}" in caplog.text
    if kind != "directory":  # replaced by the list made again
        assert saved.is_file() and not saved.is_symlink() and set(json.loads(saved.read_text())) == names


def test_an_oversized_list_is_not_read(fresh, caplog):
    names = _exporter_ops.translated()
    (saved,) = fresh.glob("exporter/ops-*.json")
    with open(saved, "r+b") as f:
        f.truncate(_exporter_ops.MAX_BYTES + 1)
    _exporter_ops.translated.cache_clear()
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        assert _exporter_ops.translated() == names
    assert f"{saved} is 16.0 MiB ({_exporter_ops.MAX_BYTES + 1} bytes), more than the 16.0 MiB" in caplog.text


def test_a_list_in_a_directory_others_can_write_to_is_not_used(fresh, caplog, monkeypatch):
    names = _exporter_ops.translated()
    (fresh / "exporter").chmod(0o777)
    _exporter_ops.translated.cache_clear()
    monkeypatch.setattr(_registry, "lazy_registry", _registry.lazy_registry)  # (asked again: not from the file)
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        assert _exporter_ops.translated() == names
    assert "is writable by group or others" in caplog.text and f"chmod go-w {fresh / 'exporter'}" in caplog.text


def test_the_list_and_its_directory_are_private(fresh):
    _exporter_ops.translated()
    (saved,) = fresh.glob("exporter/ops-*.json")
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert stat.S_IMODE(saved.parent.stat().st_mode) == 0o700
