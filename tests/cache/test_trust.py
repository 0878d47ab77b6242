"""The per-user cache key and the checks on cache directories (_trust)."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
import torch

import rtx_backend
from rtx_backend import _trust
from rtx_backend._options import Options
from rtx_backend.cache import graphs as _graph_cache
from rtx_backend.cache import store
from rtx_backend.cache.engines import EngineCache

from ..helpers import compile_and_run
from ..models import MLP, eval_model

SM86 = [(8, 6)]
NOBODY = 65534
posix_root = pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0, reason="needs root to chown to another user")


def test_the_key_is_made_once_private_and_reused(tmp_path):
    key = _trust.secret()
    path = _trust.key_path()
    assert key is not None and len(key) == _trust.KEY_BYTES
    assert path == tmp_path / "config" / "rtx_backend" / "cache.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert _trust.secret() == key
    assert not [p for p in path.parent.iterdir() if p.name != "cache.key"]  # no temp left


def test_a_key_file_others_can_read_is_refused_and_caching_is_off(tmp_path, caplog):
    assert _trust.secret() is not None
    _trust.key_path().chmod(0o644)
    assert _trust.secret() is None
    assert "chmod 600" in caplog.text
    model, x = eval_model(MLP()), torch.randn(4, 16)
    y = compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86)
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)  # compiles, uncached
    assert not list((tmp_path / "cache").rglob("*.engine"))


_MODEL: list = []


def _compile_into(directory: Path) -> None:
    """Compile one model (the same weights every time in a test: the same keys)."""
    if not _MODEL:
        torch.manual_seed(0)
        _MODEL.extend([eval_model(MLP()), torch.randn(4, 16)])
    model, x = _MODEL
    y = compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86, engine_cache_dir=str(directory))
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)


def test_a_world_writable_cache_directory_is_refused_naming_the_fix(tmp_path, caplog):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        _compile_into(shared)
    assert f"chmod go-w {shared}" in caplog.text and "adopt-cache" in caplog.text
    assert list(shared.iterdir()) == []  # nothing read from it, nothing written to it
    assert EngineCache.for_options(Options(engine_cache_dir=str(shared))) is None
    assert _graph_cache.GraphCache.for_options(Options(engine_cache_dir=str(shared),
                                                       target_compute_capabilities=SM86)) is None


@posix_root
def test_a_cache_directory_of_another_user_is_refused(tmp_path, caplog):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        _compile_into(theirs)
    assert f"owned by uid {NOBODY}" in caplog.text
    assert list(theirs.iterdir()) == []


def test_a_directory_below_a_group_writable_one_is_refused(tmp_path, caplog):
    parent = tmp_path / "team"
    (parent / "engines").mkdir(parents=True)
    parent.chmod(0o775)
    problem = _trust.directory_problem(parent / "engines") or ""
    assert "above it, is writable by group or others" in problem and f"chmod 700 {parent / 'engines'}" in problem
    assert f"chmod go-w {parent}" not in problem  # (never advice to change a directory such as /tmp)
    parent.chmod(0o1777)  # sticky, as /tmp is: others cannot replace what is ours in it
    assert _trust.directory_problem(parent / "engines") is None


@pytest.fixture(params=[0o022, 0o077], ids=["umask022", "umask077"])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def test_cache_files_and_directories_are_private_whatever_the_umask(tmp_path, umask):
    from rtx_backend.lower import exporter_ops

    _compile_into(tmp_path / "new" / "engines")
    rtx_backend.wait_for_updates(60)
    exporter_ops.translated.cache_clear()
    exporter_ops.translated()  # writes the op list under the cache root
    made = [tmp_path / "new", tmp_path / "new" / "engines", tmp_path / "cache", tmp_path / "cache" / "exporter",
            _trust.key_path().parent]
    assert {d: stat.S_IMODE(d.stat().st_mode) for d in made} == dict.fromkeys(made, 0o700)
    files = [*(tmp_path / "new" / "engines").iterdir(), *(tmp_path / "cache" / "exporter").iterdir(), _trust.key_path()]
    assert {p.suffix for p in files} >= {".engine", ".graph", ".lock", ".json", ".key"}
    assert {f: stat.S_IMODE(f.stat().st_mode) for f in files} == dict.fromkeys(files, 0o600)
    assert _trust.directory_problem(tmp_path / "new" / "engines") is None
    rtx_backend.reset_stats()
    torch._dynamo.reset()
    _compile_into(tmp_path / "new" / "engines")
    assert rtx_backend.stats()["graph_cache_hits"] == 1


def test_a_private_cache_directory_under_a_directory_like_tmp_is_used(tmp_path):
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)  # sticky and world-writable, as /tmp (or /dev/shm on tmpfs) is
    mine = shared / "mine"
    mine.mkdir(mode=0o700)
    assert _trust.directory_problem(mine) is None
    assert _trust.directory_problem(shared / "not-yet" / "engines") is None  # made 0700 by the cache
    _compile_into(mine)
    assert len(list(mine.glob("*.engine"))) == 1


def test_a_private_cache_directory_under_a_world_writable_one_without_sticky_bit_is_used(tmp_path):
    """A tmpfs mounted 0777 (a Kubernetes emptyDir at /tmp, say): a private folder there is safe."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o777)
    mine = shared / "mine"
    mine.mkdir(mode=0o700)
    assert _trust.directory_problem(mine) is None
    assert _trust.directory_problem(shared / "not-yet" / "engines") is None  # the cache makes them 0700
    _compile_into(shared / "not-yet" / "engines")
    assert len(list((shared / "not-yet" / "engines").glob("*.engine"))) == 1
    assert stat.S_IMODE((shared / "not-yet").stat().st_mode) == 0o700
    (shared / "open").mkdir(mode=0o755)  # not private: another user could rename it and put theirs there
    problem = _trust.directory_problem(shared / "open") or ""
    assert f"chmod 700 {shared / 'open'}" in problem and f"chmod go-w {shared}" not in problem


def test_a_directory_every_user_writes_to_is_refused_naming_a_private_one_inside_it(tmp_path, caplog):
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    problem = _trust.directory_problem(shared) or ""
    assert "chmod" not in problem and str(shared / _trust.own_name()) in problem
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        _compile_into(shared)
    assert "chmod go-w" not in caplog.text and str(shared / _trust.own_name()) in caplog.text
    assert not list(shared.iterdir())


@posix_root
def test_a_directory_of_another_user_above_is_refused_advising_a_private_one(tmp_path):
    parent = tmp_path / "team"
    (parent / "engines").mkdir(parents=True)
    parent.chmod(0o777)
    os.chown(parent, NOBODY, NOBODY)
    problem = _trust.directory_problem(parent / "engines") or ""
    assert f"owned by uid {NOBODY}" in problem and f"chmod 700 {parent / 'engines'}" in problem
    assert f"chmod go-w {parent}" not in problem
    (parent / "engines").chmod(0o700)  # private: what is inside is out of their reach
    assert _trust.directory_problem(parent / "engines") is None


def test_files_signed_by_another_user_are_misses(tmp_path, monkeypatch, caplog):
    """The same directory seen by another user (another key): nothing in it is served."""
    _compile_into(tmp_path / "engines")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "another-user"))
    torch._dynamo.reset()
    rtx_backend.reset_stats()
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        _compile_into(tmp_path / "engines")
    stats = rtx_backend.stats()
    assert stats["graph_cache_misses"] == 1 and stats["engine_builds"] == 1 and "engine_cache_hits" not in stats
    assert store.NOT_SIGNED.split(";")[0] in caplog.text
