"""`python -m rtx_backend info` and `clear-cache`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from importlib import metadata

import pytest
import torch

from rtx_backend import _files, _trt
from rtx_backend.cache import store
from rtx_backend.run import runtime_cache as _runtime_cache
from rtx_backend.tools import info as _info

ENTRY = "ab" * 32 + ".engine"  # an entry's name: its key, a SHA-256


def _ours(magic: bytes, size: int) -> bytes:
    """Content whose first bytes are those of a cache file of ours (all that clear-cache reads)."""
    return magic.ljust(size, b"x")


def run_cli(*args: str, cache: str, hide_trt: bool = False) -> subprocess.CompletedProcess:
    prelude = "import sys; sys.modules['tensorrt_rtx'] = None; " if hide_trt else "import sys; "
    code = prelude + "from rtx_backend.tools.info import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "RTX_BACKEND_CACHE_DIR": cache}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_info_prints_versions_gpu_targets_and_caches(tmp_path):
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / ENTRY).write_bytes(_ours(store.MAGIC, 2048))
    out = subprocess.run([sys.executable, "-m", "rtx_backend", "info"], capture_output=True, text=True,
                         env={**os.environ, "RTX_BACKEND_CACHE_DIR": str(tmp_path)}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert f"torch         {torch.__version__}" in text
    assert f"onnxruntime   {metadata.version('onnxruntime')}" in text
    assert f"TensorRT-RTX:  {_trt.version()} (rtx_backend supports 1.4 to 1.7)" in text
    assert "GPU:" in text and "runs engines:" in text
    assert "builds for:    SM7.5, SM8.0, SM8.6" in text
    assert f"engine cache  {tmp_path / 'engines'}: 1 file(s), 2.0 KiB" in text
    assert f"runtime cache {tmp_path / 'runtime'}: empty" in text
    if not torch.cuda.is_available():
        assert "GPU:           none: no CUDA GPU visible to torch" in text
    assert out.stderr == ""  # nothing else, no warnings


def test_info_names_a_module_on_the_path_without_package_metadata(monkeypatch):
    """A package imported from PYTHONPATH without its metadata is not "not installed"."""
    from rtx_backend.tools import info as _info

    found = metadata.version

    def version(name: str) -> str:
        if name == "onnxscript":
            raise metadata.PackageNotFoundError(name)
        return found(name)

    monkeypatch.setattr(_info.metadata, "version", version)
    monkeypatch.setitem(sys.modules, "onnxscript", types.SimpleNamespace(__version__="9.8.7"))
    text = _info.render(_info.collect(probe=False))
    assert "onnxscript    9.8.7 (imported from the path, no package metadata)" in text
    monkeypatch.delitem(sys.modules, "onnxscript")
    assert "onnxscript    not installed" in _info.render(_info.collect(probe=False))


def test_info_without_tensorrt_rtx_says_so(tmp_path):
    out = run_cli("info", "--json", cache=str(tmp_path), hide_trt=True)
    assert out.returncode == 0, out.stderr[-2000:]
    info = json.loads(out.stdout)
    assert info["tensorrt_rtx"]["usable"] is False
    assert "not importable" in info["tensorrt_rtx"]["problem"]
    assert info["tensorrt_rtx"]["version"] is None
    assert [7, 5] in info["buildable"] and "not usable" in info["buildable_source"]
    text = _info.render(info)
    assert "TensorRT-RTX:  not usable: TensorRT-RTX is not importable" in text


def test_info_json_fields(tmp_path, monkeypatch):
    monkeypatch.setenv("RTX_BACKEND_CACHE_DIR", str(tmp_path))
    info = json.loads(json.dumps(_info.collect(probe=False)))
    assert set(info) >= {"rtx_backend", "python", "packages", "tensorrt_rtx", "gpu", "buildable", "caches"}
    assert set(info["packages"]) == set(_info.PACKAGES)
    assert info["caches"]["engines"] == {"path": str(tmp_path / "engines"), "files": 0, "bytes": 0}
    assert info["buildable"] == [list(t) for t in _trt.named_capabilities()]


def test_clear_cache_removes_only_our_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RTX_BACKEND_CACHE_DIR", str(tmp_path))
    engines, runtime = tmp_path / "engines", tmp_path / "runtime"
    engines.mkdir()
    runtime.mkdir()
    (engines / ENTRY).write_bytes(_ours(store.MAGIC, 100))
    (engines / ("cd" * 32 + ".graph")).write_bytes(_ours(store.GRAPH_MAGIC, 60))
    (engines / ("ab" * 32 + ".validated")).write_bytes(_ours(store.VALIDATED_MAGIC, 40))
    user_files = {"my_own_model.engine": b"e" * 100, "ef" * 32 + ".engine": b"not ours" * 10,
                  "notes.txt": b"mine", ".lock": b""}
    for name, content in user_files.items():
        (engines / name).write_bytes(content)
    (runtime / "tensorrt_rtx-1.7.1-NVIDIA_RTX_3090-sm86.cache").write_bytes(_ours(_runtime_cache.MAGIC, 50))
    (runtime / "tensorrt_rtx-1.7.1-NVIDIA_RTX_3090-sm86.cache.lock").write_text("")
    (runtime / "tensorrt_rtx-my-notes.cache").write_bytes(b"r" * 50)  # our name pattern, not our header
    assert _info.main(["clear-cache"]) == 0
    out = capsys.readouterr().out
    assert f"engines: removed 3 file(s), 200 B, from {engines}" in out
    assert f"runtime: removed 1 file(s), 50 B, from {runtime}" in out
    assert {p.name: p.read_bytes() for p in engines.iterdir()} == user_files
    assert sorted(p.name for p in runtime.iterdir()) == ["tensorrt_rtx-1.7.1-NVIDIA_RTX_3090-sm86.cache.lock",
                                                         "tensorrt_rtx-my-notes.cache"]
    assert _info.main(["clear-cache"]) == 0  # again: nothing left, no error
    assert "engines: removed 0 file(s)" in capsys.readouterr().out


def test_clear_cache_removes_the_exporter_op_list_and_dead_writers_temps(tmp_path, monkeypatch, capsys):
    """Everything the caches wrote goes, not only engines: also the exporter's op list and the
    temps of writers that were killed; a live writer's temp and a user's JSON file stay."""
    import os

    monkeypatch.setenv("RTX_BACKEND_CACHE_DIR", str(tmp_path))
    engines, exporter = tmp_path / "engines", tmp_path / "exporter"
    engines.mkdir()
    exporter.mkdir()
    (exporter / "ops-torch2.13.0-onnxscript0.5.json").write_text('["aten.add.Tensor"]')
    (exporter / "ops-torch-mine-onnxscript.json").write_text('{"not": "an op list"}')
    dead = engines / f".{ENTRY}.{_files._host()}-999999999.abc.tmp"  # a writer whose process is gone
    dead.write_bytes(b"x" * 10)
    live = engines / f".{ENTRY}.{_files._host()}-{os.getpid()}.abc.tmp"
    live.write_bytes(b"y" * 10)
    assert _info.main(["clear-cache"]) == 0
    out = capsys.readouterr().out
    assert f"exporter: removed 1 file(s), 19 B, from {exporter}" in out
    assert f"engines: removed 1 file(s), 10 B, from {engines}" in out
    assert sorted(p.name for p in exporter.iterdir()) == ["ops-torch-mine-onnxscript.json"]
    assert not dead.exists() and live.exists()


def test_custom_cache_dirs(tmp_path, capsys):
    custom = tmp_path / "my_engines"
    custom.mkdir()
    (custom / ENTRY).write_bytes(_ours(store.MAGIC, 24))
    assert _info.main(["info", "--no-probe", "--engine-cache-dir", str(custom)]) == 0
    assert f"engine cache  {custom}: 1 file(s), 24 B" in capsys.readouterr().out
    assert _info.main(["clear-cache", "--engine-cache-dir", str(custom)]) == 0
    assert list(custom.iterdir()) == [custom / ".lock"] or list(custom.iterdir()) == []


def test_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        _info.main(["frobnicate"])
    assert info.value.code == 2
    assert "info" in capsys.readouterr().err


@pytest.mark.gpu
def test_gpu_probe_runs_an_engine():
    gpu = _info.gpu_info()
    assert gpu["name"] and len(gpu["compute_capability"]) == 2
    assert gpu["runs_engines"] is True, gpu["why"]


def test_help_is_whole_and_names_every_command(capsys):
    with pytest.raises(SystemExit) as done:
        _info.main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for command in ("info", "clear-cache", "adopt-cache"):
        assert f"python -m rtx_backend {command}" in text
    assert "what is installed,\nwhat this machine can do, and the caches." in text  # not cut short
    assert "RTX_BACKEND_CACHE_DIR" in text
