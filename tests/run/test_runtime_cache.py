"""Runtime cache: file naming, load/save, corrupt/foreign/unreadable files, release and exit saves.

Real runtime caches need a GPU; on CPU a fake cache object (serialize/deserialize with a
checksum, like TensorRT-RTX's) drives the file logic. The GPU tests use the real one.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import rtx_backend
from rtx_backend import _log, _targets, _trust
from rtx_backend._options import Options
from rtx_backend.run import runtime_cache as _runtime_cache

ROOT = Path(__file__).resolve().parents[2]
GPU = ("NVIDIA GeForce RTX 3090", (8, 6))


class FakeCache:
    """Serializes to MAGIC + sha256 + kernels; deserialize rejects anything else and adds what it
    reads to what the cache holds, as TensorRT-RTX does (kernels: "|"-separated names)."""

    MAGIC = b"FAKE-RTX-CACHE"

    def __init__(self) -> None:
        self.kernels = b""

    def serialize(self) -> bytes:
        return self.MAGIC + hashlib.sha256(self.kernels).digest() + self.kernels

    def deserialize(self, data: bytes) -> bool:
        head, digest, kernels = data[:14], data[14:46], data[46:]
        if head != self.MAGIC or hashlib.sha256(kernels).digest() != digest:
            return False
        names = {k for k in (*self.kernels.split(b"|"), *kernels.split(b"|")) if k}
        self.kernels = b"|".join(sorted(names))
        return True


class FakeConfig:
    def __init__(self) -> None:
        self.cache: FakeCache | None = None
        self.created: list[FakeCache] = []

    def create_runtime_cache(self) -> FakeCache:
        self.created.append(FakeCache())
        return self.created[-1]

    def set_runtime_cache(self, cache: FakeCache) -> bool:
        self.cache = cache
        return True


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch, request):
    """A new process, as far as the runtime cache registry knows; a fake GPU for CPU tests."""
    monkeypatch.setattr(_runtime_cache, "CACHES", _runtime_cache.Caches())
    monkeypatch.setattr(_log, "SAID", _log.Once())
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setattr(_targets, "gpu_identity_parts", lambda: GPU)


def _attach(**options) -> tuple[FakeConfig, _runtime_cache.RuntimeCache]:
    config = FakeConfig()
    entry = _runtime_cache.attach(config, Options.from_dict(options))
    assert entry is not None and config.cache is entry.cache
    return config, entry


def _ours(blob: bytes) -> bytes:
    """A runtime cache file as this user's process writes it, holding TensorRT-RTX's `blob`."""
    return b"".join(_runtime_cache.wrap(blob))


def _restart(monkeypatch) -> None:
    monkeypatch.setattr(_runtime_cache, "CACHES", _runtime_cache.Caches())


def test_default_file_is_per_version_and_gpu(tmp_path, monkeypatch):
    default = Options().runtime_cache_path
    path = _runtime_cache.resolve_path(default)
    assert path is not None and path.parent == tmp_path / "cache" / "runtime"
    assert rtx_backend._trt.version() in path.name and "RTX_3090" in path.name and "sm86" in path.name
    monkeypatch.setattr(_targets, "gpu_identity_parts", lambda: ("NVIDIA RTX A6000", (8, 6)))
    assert _runtime_cache.resolve_path(default) != path
    assert _runtime_cache.resolve_path("") is None
    assert _runtime_cache.resolve_path(None) is None
    assert _runtime_cache.resolve_path(str(tmp_path / "x.bin")) == tmp_path / "x.bin"
    assert _runtime_cache.resolve_path(str(tmp_path)).parent == tmp_path  # a directory: the default name in it


def test_engines_of_a_process_share_one_cache_object(tmp_path):
    _, first = _attach(runtime_cache_path=str(tmp_path / "rc.bin"))
    config, second = _attach(runtime_cache_path=str(tmp_path / "rc.bin"))
    assert first is second
    assert config.created == []  # the second config made no cache of its own


def test_memory_only_cache_writes_no_file(tmp_path):
    _, entry = _attach(runtime_cache_path="")
    entry.cache.kernels = b"jit work"
    assert rtx_backend.save_runtime_cache() == []
    assert not any(tmp_path.rglob("*.bin"))


def test_saved_cache_is_loaded_by_the_next_process(tmp_path, monkeypatch):
    path = tmp_path / "rc.bin"
    _, entry = _attach(runtime_cache_path=str(path))
    entry.cache.kernels = b"compiled kernels"
    assert rtx_backend.save_runtime_cache() == [path]
    _restart(monkeypatch)
    _, reloaded = _attach(runtime_cache_path=str(path))
    assert reloaded.cache.kernels == b"compiled kernels"
    assert rtx_backend.stats()["runtime_cache_loads"] == 1


def test_unchanged_cache_is_not_rewritten(tmp_path):
    _, entry = _attach(runtime_cache_path=str(tmp_path / "rc.bin"))
    entry.cache.kernels = b"k"
    rtx_backend.save_runtime_cache()
    rtx_backend.save_runtime_cache()
    assert rtx_backend.stats()["runtime_cache_saves"] == 1
    entry.cache.kernels = b"k2"
    rtx_backend.save_runtime_cache()
    assert rtx_backend.stats()["runtime_cache_saves"] == 2


def test_two_processes_saving_one_file_keep_both_processes_kernels(tmp_path, monkeypatch):
    """Both started before either saved: the second save merges the first one's kernels in."""
    path = tmp_path / "rc.bin"
    _, first = _attach(runtime_cache_path=str(path))
    _restart(monkeypatch)
    _, second = _attach(runtime_cache_path=str(path))
    first.cache.kernels = b"conv"
    assert first.save()
    second.cache.kernels = b"gemm"
    assert second.save()
    assert rtx_backend.stats()["runtime_cache_merges"] == 1
    on_disk = FakeCache()
    assert on_disk.deserialize(_runtime_cache.unwrap(path.read_bytes())) and on_disk.kernels == b"conv|gemm"
    assert first.save()  # the first process's next save keeps the second's kernels too
    assert first.cache.kernels == b"conv|gemm"
    on_disk = FakeCache()
    assert on_disk.deserialize(_runtime_cache.unwrap(path.read_bytes())) and on_disk.kernels == b"conv|gemm"
    assert rtx_backend.stats()["runtime_cache_merges"] == 2


def test_a_file_damaged_since_the_load_is_replaced_not_merged(tmp_path, caplog):
    path = tmp_path / "rc.bin"
    _, entry = _attach(runtime_cache_path=str(path))
    entry.cache.kernels = b"mine"
    assert entry.save()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # damaged: its header is ours, its content fails its checksum
    path.write_bytes(bytes(data))
    entry.cache.kernels = b"mine|more"
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        assert entry.save()
    assert not caplog.records and "runtime_cache_merges" not in rtx_backend.stats()
    on_disk = FakeCache()
    assert on_disk.deserialize(_runtime_cache.unwrap(path.read_bytes())) and on_disk.kernels == b"mine|more"


@pytest.mark.parametrize(
    "content",
    [lambda: _runtime_cache.MAGIC + b"\0" * 8, lambda: _ours(b"garbage" * 100),
     lambda: _ours(FakeCache.MAGIC + b"\0" * 32 + b"kernels"), lambda: _ours(b"x")[:-1]],
    ids=["truncated_header", "garbage", "foreign_version", "truncated"],
)
def test_corrupt_or_foreign_file_is_a_warning_and_a_fresh_cache(content, tmp_path, caplog):
    path = tmp_path / "rc.bin"
    path.write_bytes(content())
    with caplog.at_level(logging.WARNING, "rtx_backend"):
        config, entry = _attach(runtime_cache_path=str(path))
    assert "starting with an empty cache" in caplog.text
    assert entry.cache.kernels == b"" and entry.cache is config.created[-1]  # a new object, not the failed one
    entry.cache.kernels = b"new work"
    assert rtx_backend.save_runtime_cache() == [path]  # the bad file is replaced
    assert FakeCache().deserialize(_runtime_cache.unwrap(path.read_bytes()))


def test_unreadable_file_is_a_warning(tmp_path, caplog):
    path = _runtime_cache.resolve_path(Options().runtime_cache_path)
    assert path is not None
    path.mkdir(parents=True)  # a directory where the cache file should be: reading fails
    _, entry = _attach()
    assert "cannot read the runtime cache" in caplog.text
    entry.cache.kernels = b"k"
    assert rtx_backend.save_runtime_cache() == []
    assert "could not save the runtime cache" in caplog.text


def test_unwritable_directory_is_a_warning_not_an_error(tmp_path, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    _, entry = _attach(runtime_cache_path=str(blocker / "sub" / "rc.bin"))
    entry.cache.kernels = b"k"
    assert not entry.save()
    assert rtx_backend.save_runtime_cache() == []
    assert caplog.text.count("could not save the runtime cache") == 1  # warned once


def test_config_refusing_the_cache_does_not_fail(tmp_path, caplog):
    class Refusing(FakeConfig):
        def set_runtime_cache(self, cache):
            return False

    assert _runtime_cache.attach(Refusing(), Options.from_dict({"runtime_cache_path": ""})) is None
    assert "runtime cache is not used" in caplog.text


def test_cache_is_saved_when_its_owner_is_released(tmp_path):
    path = tmp_path / "rc.bin"
    _, entry = _attach(runtime_cache_path=str(path))

    class Executor:
        pass

    owner = Executor()
    _runtime_cache.save_on_release(owner, entry)
    entry.cache.kernels = b"work done by the engine"
    assert not path.exists()
    del owner
    gc.collect()
    assert FakeCache().deserialize(_runtime_cache.unwrap(path.read_bytes()))


AT_EXIT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    from rtx_backend.run import runtime_cache as _runtime_cache
    from rtx_backend._options import Options
    from tests.run.test_runtime_cache import FakeConfig, GPU
    from rtx_backend import _targets
    _targets.gpu_identity_parts = lambda: GPU
    entry = _runtime_cache.attach(FakeConfig(), Options.from_dict({"runtime_cache_path": sys.argv[2]}))
    entry.cache.kernels = b"saved at exit"
    """
)


def test_cache_is_saved_at_interpreter_exit(tmp_path):
    path = tmp_path / "rc.bin"
    out = subprocess.run([sys.executable, "-c", AT_EXIT, str(ROOT), str(path)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    cache = FakeCache()
    assert cache.deserialize(_runtime_cache.unwrap(path.read_bytes())) and cache.kernels == b"saved at exit"


WRITER = textwrap.dedent(
    """
    import os, random, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from rtx_backend.run import runtime_cache as _runtime_cache
    from rtx_backend.run.runtime_cache import RuntimeCache
    from tests.run.test_runtime_cache import FakeCache
    path = Path(sys.argv[2])
    rng = random.Random(int(sys.argv[3]))
    bad = 0
    for _ in range(int(sys.argv[4])):
        entry = RuntimeCache(FakeCache(), path)
        entry.cache.kernels = os.urandom(rng.randrange(1, 200_000))
        entry.save()
        if not FakeCache().deserialize(_runtime_cache.unwrap(path.read_bytes())):
            bad += 1
    print(bad)
    """
)


def test_concurrent_savers_never_leave_an_unreadable_file(tmp_path):
    path = tmp_path / "rc.bin"
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(ROOT), str(path), str(seed), "40"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for seed in range(4)
    ]
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        assert stdout.strip() == "0"
    assert FakeCache().deserialize(_runtime_cache.unwrap(path.read_bytes()))
    assert not list(tmp_path.glob(".*.tmp"))


# ---- GPU: the real runtime cache ---------------------------------------------------------------

COLD_WARM = textwrap.dedent(
    """
    import json, sys, time, torch
    sys.path.insert(0, sys.argv[1])
    import rtx_backend
    from tests.models import ConvNet, eval_model
    torch.manual_seed(0)
    model = eval_model(ConvNet(), torch.float16, "cuda")
    x = torch.randn(8, 3, 64, 64, device="cuda", dtype=torch.float16)
    options = {"min_block_size": 1, "runtime": "tensorrt_rtx", "validate": False,
               "runtime_cache_path": sys.argv[2]}
    compiled = torch.compile(model, backend="trtrtx", options=options)
    with torch.no_grad():
        torch.cuda.synchronize()
        start = time.perf_counter()
        y = compiled(x)  # engine from the engine cache; the engine's kernels from the runtime cache or JIT
        torch.cuda.synchronize()
        first = time.perf_counter() - start
        start = time.perf_counter()
        compiled(x)
        torch.cuda.synchronize()
        second = time.perf_counter() - start
        err = (y.float() - model(x).float()).abs().max().item()
    print(json.dumps({"first_s": first, "second_s": second, "err": err, "stats": rtx_backend.stats()}))
    """
)


def _run_cold_warm(cache_file: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", COLD_WARM, str(ROOT), str(cache_file)], capture_output=True,
                         text=True, timeout=600, env=os.environ.copy())
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
def test_gpu_runtime_cache_file_created_and_reloaded_cold_vs_warm(tmp_path, capsys):
    cache_file = tmp_path / "runtime.bin"
    _run_cold_warm(tmp_path / "priming.bin")  # builds the engine into the engine cache (same env)
    cold = _run_cold_warm(cache_file)  # engine cache hit, empty runtime cache: JIT compiles
    assert cold["stats"].get("engine_builds", 0) == 0
    assert cache_file.stat().st_size > 0, "the runtime cache was not saved at exit"
    assert "runtime_cache_loads" not in cold["stats"]
    warm = _run_cold_warm(cache_file)
    assert warm["stats"]["runtime_cache_loads"] == 1
    assert cold["err"] < 1e-2 and warm["err"] < 1e-2
    with capsys.disabled():
        print(
            f"\n[runtime cache] ConvNet fp16 8x3x64x64, first inference incl. Dynamo/lowering/engine-cache hit: "
            f"cold {cold['first_s'] * 1e3:.1f} ms, warm {warm['first_s'] * 1e3:.1f} ms; "
            f"second call cold-run {cold['second_s'] * 1e3:.2f} ms, warm-run {warm['second_s'] * 1e3:.2f} ms; "
            f"file {cache_file.stat().st_size} bytes"
        )


@pytest.mark.gpu
def test_gpu_save_runtime_cache_writes_the_default_file():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).cuda().eval()
    compiled = torch.compile(model, backend="trtrtx", options={"min_block_size": 1, "runtime": "tensorrt_rtx"})
    with torch.no_grad():
        compiled(torch.randn(4, 16, device="cuda"))
    default = _runtime_cache.resolve_path(rtx_backend.Options().runtime_cache_path)
    assert default is not None and torch.cuda.get_device_name().split()[-1] in default.name
    assert rtx_backend.save_runtime_cache() == [default]
    assert default.stat().st_size > 0


_SAVER = textwrap.dedent("""
    import json, sys, time, torch, rtx_backend
    from pathlib import Path
    from rtx_backend.run import runtime_cache as _runtime_cache
    name, cache, sync = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    torch.manual_seed(0)
    if name == "mlp":
        model, x = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 64)), torch.randn(8, 256)
    else:
        model, x = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 8, 3)), torch.randn(2, 3, 32, 32)
    model = model.eval().cuda().half()
    compiled = torch.compile(model, backend="trtrtx", options={"min_block_size": 1, "engine_cache_dir": "",
                                                               "runtime_cache_path": cache})
    with torch.no_grad():
        compiled(x.cuda().half())
    (sync / f"{name}.ready").touch()
    while len(list(sync.glob("*.ready"))) < 2:  # both loaded the (missing) file before either saves
        time.sleep(0.05)
    if name == "conv":
        while not (sync / "mlp.saved").exists():
            time.sleep(0.05)
    (entry,) = _runtime_cache.CACHES.all()
    own = len(bytes(entry.cache.serialize()))
    rtx_backend.save_runtime_cache()
    (sync / f"{name}.saved").touch()
    print(json.dumps({"own": own, "file": Path(cache).stat().st_size, "stats": rtx_backend.stats()}))
""")


@pytest.mark.gpu
def test_gpu_two_processes_saving_one_runtime_cache_keep_both(tmp_path):
    cache, sync = tmp_path / "runtime.bin", tmp_path / "sync"
    sync.mkdir()
    procs = {name: subprocess.Popen([sys.executable, "-c", _SAVER, name, str(cache), str(sync)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in ("mlp", "conv")}
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        out[name] = json.loads(stdout.strip().splitlines()[-1])
    print("runtime cache merge:", out)
    assert out["conv"]["stats"]["runtime_cache_merges"] == 1
    assert out["conv"]["file"] > max(out["mlp"]["own"], out["conv"]["own"])
    assert out["conv"]["file"] >= 0.9 * (out["mlp"]["own"] + out["conv"]["own"])


# ---- trust: only our own runtime cache is read or replaced -------------------------------------


def test_a_file_that_is_not_our_runtime_cache_is_never_overwritten(tmp_path, caplog):
    path = tmp_path / "notes.txt"  # runtime_cache_path naming a user's file by mistake
    path.write_bytes(b"my notes, not a cache")
    with caplog.at_level(logging.WARNING, "rtx_backend"):
        _, entry = _attach(runtime_cache_path=str(path))
    entry.cache.kernels = b"jit work"
    assert rtx_backend.save_runtime_cache() == []
    assert path.read_bytes() == b"my notes, not a cache"
    assert "is not a runtime cache of rtx_backend" in caplog.text and "neither loaded nor overwritten" in caplog.text


def test_a_file_that_appears_after_the_load_and_is_not_ours_is_not_overwritten(tmp_path, caplog):
    path = tmp_path / "rc.bin"
    _, entry = _attach(runtime_cache_path=str(path))
    path.write_bytes(b"someone's file")
    entry.cache.kernels = b"jit work"
    assert not entry.save()
    assert path.read_bytes() == b"someone's file"


def test_kernels_saved_by_another_user_are_not_loaded(tmp_path, monkeypatch, caplog):
    path = tmp_path / "rc.bin"
    _, entry = _attach(runtime_cache_path=str(path))
    entry.cache.kernels = b"their kernels"
    assert entry.save()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "another-user"))
    _restart(monkeypatch)
    with caplog.at_level(logging.WARNING, "rtx_backend"):
        _, mine = _attach(runtime_cache_path=str(path))
    assert mine.cache.kernels == b"" and "not signed with your cache key" in caplog.text
    mine.cache.kernels = b"my kernels"
    assert mine.save()  # a file of ours (our header) that we cannot vouch for: replaced
    assert _runtime_cache.unwrap(path.read_bytes()).endswith(b"my kernels")


def test_a_fifo_as_the_runtime_cache_is_a_warning_not_a_hang(tmp_path, caplog):
    import threading

    path = tmp_path / "rc.bin"
    os.mkfifo(path)
    done: list = []
    thread = threading.Thread(target=lambda: done.append(_attach(runtime_cache_path=str(path))), daemon=True)
    thread.start()
    thread.join(60)
    assert done, "loading the runtime cache blocked on a FIFO"
    entry = done[0][1]
    entry.cache.kernels = b"k"
    assert not entry.save()  # and it is not replaced
    assert path.is_fifo() and "a FIFO" in caplog.text


def test_a_world_writable_runtime_cache_directory_keeps_the_cache_in_memory(tmp_path, caplog):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with caplog.at_level(logging.WARNING, "rtx_backend"):
        _, entry = _attach(runtime_cache_path=str(shared / "rc.bin"))
    assert entry.path is None and "chmod go-w" in caplog.text
    entry.cache.kernels = b"k"
    assert rtx_backend.save_runtime_cache() == [] and list(shared.iterdir()) == []


def test_a_huge_sparse_runtime_cache_is_a_warning_naming_its_size_and_is_not_read(tmp_path, caplog):
    path = tmp_path / "rc.bin"
    with open(path, "wb") as f:
        try:
            f.truncate(4 * 2**40)  # 4 TiB, sparse: no disk used
        except OSError as exc:
            pytest.skip(f"this file system makes no 4 TiB sparse file ({exc})")
    with caplog.at_level(logging.WARNING, "rtx_backend"):
        _, entry = _attach(runtime_cache_path=str(path))
    warning = next(r.getMessage() for r in caplog.records if str(path) in r.getMessage())
    assert "4.0 TiB" in warning and str(4 * 2**40) in warning  # its size
    assert "1.0 GiB" in warning and f"rm {path}" in warning  # the limit, and what to do
    entry.cache.kernels = b"k"
    assert not entry.save()  # what it could not judge is not overwritten
    assert path.stat().st_size == 4 * 2**40


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_a_saved_runtime_cache_and_its_directory_are_private_whatever_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        _, entry = _attach(runtime_cache_path=str(tmp_path / "new" / "rc.bin"))
        entry.cache.kernels = b"k"
        assert entry.save()
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "new", *(tmp_path / "new").iterdir())}
    assert modes == {"new": 0o700, "rc.bin": 0o600, "rc.bin.lock": 0o600}


def test_a_runtime_cache_in_a_directory_every_user_writes_to_names_a_private_one(tmp_path, monkeypatch, caplog):
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp is
    with caplog.at_level(logging.WARNING, "rtx_backend"):
        _, entry = _attach(runtime_cache_path=str(shared / "rc.bin"))
    assert entry.path is None and "chmod go-w" not in caplog.text
    assert str(shared / _trust.own_name()) in caplog.text  # a directory of one's own inside it
    _restart(monkeypatch)
    _, entry = _attach(runtime_cache_path=str(shared / _trust.own_name() / "rc.bin"))
    entry.cache.kernels = b"k"
    assert entry.path is not None and entry.save()
    assert stat.S_IMODE((shared / _trust.own_name()).stat().st_mode) == 0o700
