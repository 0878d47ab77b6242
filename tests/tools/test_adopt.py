"""`python -m rtx_backend adopt-cache DIR`: a cache built elsewhere becomes this user's, after checks."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import stat
from pathlib import Path

import pytest
import torch

import rtx_backend
from rtx_backend.cache import store
from rtx_backend.tools import info as _info
from rtx_backend.tools.adopt import adopt_cache

from ..helpers import compile_and_run
from ..models import MLP, eval_model

SM86 = [(8, 6)]


def _build_elsewhere(tmp_path: Path, monkeypatch) -> tuple[Path, torch.nn.Module, torch.Tensor]:
    """Engines built for a declared target by "the laptop" (another key), copied here."""
    torch.manual_seed(0)
    model, x = eval_model(MLP()), torch.randn(4, 16)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "laptop-config"))
    compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86,
                    engine_cache_dir=str(tmp_path / "laptop"))
    shutil.copytree(tmp_path / "laptop", tmp_path / "shipped")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # this machine's user
    torch._dynamo.reset()
    rtx_backend.reset_stats()
    return tmp_path / "shipped", model, x


def test_an_adopted_cache_is_served_and_unadopted_it_is_not(tmp_path, monkeypatch, capsys):
    shipped, model, x = _build_elsewhere(tmp_path, monkeypatch)
    probe = tmp_path / "probe"
    shutil.copytree(shipped, probe)
    compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86, engine_cache_dir=str(probe))
    assert rtx_backend.stats()["engine_builds"] == 1  # not adopted: nothing of it is trusted
    shipped.chmod(0o777)  # as a copy onto a shared volume may leave it, with its files
    for path in shipped.iterdir():
        path.chmod(0o666)
    assert _info.main(["adopt-cache", str(shipped)]) == 0
    out = capsys.readouterr().out
    assert "2 cache file(s) checked and signed with your key" in out  # the engine entry, the graph entry
    assert f"{shipped}: made private to you (mode 0700)" in out
    assert stat.S_IMODE(shipped.stat().st_mode) == 0o700
    ours = [p for p in shipped.iterdir() if store.is_our_name(p.name)]
    assert len(ours) >= 2 and {stat.S_IMODE(p.stat().st_mode) for p in ours} == {0o600}
    torch._dynamo.reset()
    rtx_backend.reset_stats()
    y = compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86, engine_cache_dir=str(shipped))
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    stats = rtx_backend.stats()
    assert stats["graph_cache_hits"] == 1 and stats["engine_cache_hits"] == 1 and "engine_builds" not in stats


def _rewrite(path: Path, magic: bytes, edit) -> None:
    data = path.read_bytes()
    start = len(magic) + 8
    size = int.from_bytes(data[len(magic):start], "little")
    header = json.loads(data[start:start + size])
    header, payload = edit(header, data[start + size:])
    path.write_bytes(b"".join([*store.framed_header(magic, header, b"k" * 32), payload]))


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("true",))


def test_adopt_refuses_damaged_misnamed_and_code_carrying_files(tmp_path, monkeypatch):
    shipped, _, _ = _build_elsewhere(tmp_path, monkeypatch)
    (engine,) = shipped.glob("*.engine")
    (graph,) = shipped.glob("*.graph")
    misnamed = shipped / ("0" * 64 + ".engine")
    shutil.copy(engine, misnamed)  # a good entry under another key's name
    data = bytearray(engine.read_bytes())
    data[-5] ^= 0xFF
    engine.write_bytes(bytes(data))  # damaged

    def plant(header, payload):
        bad = pickle.dumps({"graph_module": _RunsCode()})
        header["payload"] = {"size": len(bad), "sha256": hashlib.sha256(bad).hexdigest()}
        return header, bad

    _rewrite(graph, store.GRAPH_MAGIC, plant)
    mine = shipped / "my_notes.engine"
    mine.write_bytes(b"mine")
    before = {p.name: p.read_bytes() for p in shipped.iterdir() if p.is_file()}
    report = adopt_cache(shipped)
    assert not report.ok and report.adopted == []
    why = dict(report.refused)
    assert "checksum mismatch" in why[engine.name]
    assert "posix.system" in why[graph.name] or "os.system" in why[graph.name]
    assert "its name is not the key" in why[misnamed.name]
    assert {p.name: p.read_bytes() for p in shipped.iterdir() if p.is_file()} == before  # nothing changed


@pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0, reason="needs root to chown to another user")
def test_adopt_refuses_a_directory_of_another_user(tmp_path, monkeypatch, capsys):
    shipped, _, _ = _build_elsewhere(tmp_path, monkeypatch)
    os.chown(shipped, 65534, 65534)
    assert _info.main(["adopt-cache", str(shipped)]) == 1
    assert "copy it to a directory of your own" in capsys.readouterr().out
