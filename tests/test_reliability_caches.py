"""Reliability of the files that outlive the process: the engine cache and the runtime cache.

Every case puts one fault in front of the cache's own API (EngineCache.load/store,
RuntimeCache.load/save) and checks four things:

- crashed: an exception escaped the cache (must never happen: a cache fault is a warning);
- lost: a good file, the entry's previous version or a bystander entry, is gone or damaged;
- served: a bad file was served as an entry or loaded into the cache;
- recovered: once the fault is gone, the next write leaves a good file (where it can).

Faults: damaged files (corrupt, truncated, zero-length, foreign version or format, bit flips,
a directory in the way, unreadable), failing writes (disk full, no permission, fsync or rename
failing, lock timeout), writers killed with SIGKILL in the middle of saving, and many processes
saving at once. `test_summary` prints the totals that the README quotes.

The runtime cache object needs a GPU, so a fake with TensorRT-RTX's contract (deserialize
returns False on anything it did not write) stands in; the GPU test uses the real one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import logging
import os
import random
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import filelock
import pytest
import torch

import rtx_backend
from rtx_backend import _files
from rtx_backend._types import OnnxRegion, TensorSpec
from rtx_backend.cache import engines as _engine_cache
from rtx_backend.cache import store
from rtx_backend.cache.engines import EngineCache, EngineEntry, Key
from rtx_backend.run import runtime_cache as _runtime_cache
from rtx_backend.run.runtime_cache import RuntimeCache

from .helpers import compile_and_run, regions
from .models import MLP, eval_model

# ---- the two caches, with good content to lose ------------------------------------------------------


def _entry(version: int, size: int = 4096) -> EngineEntry:
    spec_in = TensorSpec("input_0", ("s0", 16), torch.float32, (4, 16), ((2, None), (16, 16)))
    spec_out = TensorSpec("output_0", ("s0", 8), torch.float32, (4, 8), ((2, None), (8, 8)))
    region = OnnxRegion(b"onnx-%d" % version, (0,), (spec_in,), (spec_out,))
    engine = hashlib.sha256(b"%d" % version).digest() * (size // 32)
    return EngineEntry(region, engine, {"input_0": ((1, 16), (4, 16), (4096, 16))})


def _key(name: str = "model", trt_version: str = "1.7.1") -> Key:
    """The key of graph `name`; another `trt_version` keeps the file name but not the fields (what
    a cache directory copied between TensorRT-RTX versions would hold)."""
    fields = {"format": _engine_cache.FORMAT, "graph": name, "tensorrt_rtx": trt_version}
    return Key(_engine_cache.make_key({**fields, "tensorrt_rtx": "1.7.1"}), fields)


class FakeRuntimeCache:
    """TensorRT-RTX's IRuntimeCache contract: serialize() bytes, deserialize(bytes) -> False on
    anything that is not its own, current-version output."""

    MAGIC = b"RTXRC-1.7"

    def __init__(self, kernels: bytes = b"") -> None:
        self.kernels = kernels

    def serialize(self) -> bytes:
        return self.MAGIC + hashlib.sha256(self.kernels).digest() + self.kernels

    def deserialize(self, data: bytes) -> bool:
        head, digest, kernels = data[:9], data[9:41], data[41:]
        if head != self.MAGIC or hashlib.sha256(kernels).digest() != digest:
            return False
        self.kernels = kernels
        return True


def _kernels(version: int, size: int = 4096) -> bytes:
    return hashlib.sha256(b"k%d" % version).digest() * (size // 32)


def _read_entry(path: Path, key: Key) -> EngineEntry | None:
    try:
        return _engine_cache.decode(path.read_bytes(), key)
    except (OSError, store.CorruptEntry):
        return None


def _read_kernels(path: Path) -> bytes | None:
    cache = FakeRuntimeCache()
    try:
        return cache.kernels if cache.deserialize(_runtime_cache.unwrap(path.read_bytes())) else None
    except (OSError, _runtime_cache.Foreign, store.CorruptEntry):
        return None


# ---- one case: a fault, the cache's API, the four checks --------------------------------------------


@dataclasses.dataclass
class Outcome:
    crashed: list[str] = dataclasses.field(default_factory=list)
    lost: list[str] = dataclasses.field(default_factory=list)
    served: list[str] = dataclasses.field(default_factory=list)
    unrecovered: list[str] = dataclasses.field(default_factory=list)
    temps_left: int = 0
    cases: int = 1
    mid_write: int = 0  # kills that left a half-written temp file (the kill landed mid-write)

    def call(self, what: str, fn: Callable, *args):
        try:
            return fn(*args)
        except Exception as exc:  # what the test is looking for
            self.crashed.append(f"{what}: {type(exc).__name__}: {exc}")
            return None

    def merge(self, other: Outcome) -> None:
        for f in ("crashed", "lost", "served", "unrecovered"):
            getattr(self, f).extend(getattr(other, f))
        self.temps_left += other.temps_left
        self.cases += other.cases
        self.mid_write += other.mid_write


def _temps(directory: Path) -> int:
    return len(list(directory.glob(f".*{_files.TEMP_SUFFIX}"))) if directory.is_dir() else 0


# Damage to a file that is already there (path, monkeypatch). Simulated faults (what root cannot
# be denied, what a disk cannot be made to do on demand) patch the call that would fail.

def _garbage(path, mp):
    path.write_bytes(os.urandom(3000))


def _truncate(fraction):
    def damage(path, mp):
        data = path.read_bytes()
        path.write_bytes(data[: int(len(data) * fraction)])
    return damage


def _drop_last_byte(path, mp):
    path.write_bytes(path.read_bytes()[:-1])


def _zero_length(path, mp):
    path.write_bytes(b"")


def _flip(offset_from_end):
    def damage(path, mp):
        data = bytearray(path.read_bytes())
        data[len(data) - offset_from_end] ^= 0x01
        path.write_bytes(bytes(data))
    return damage


def _png(path, mp):
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(500))


def _directory(path, mp):
    path.unlink()
    path.mkdir()
    (path / "inside").write_text("x")


def _unreadable(path, mp):
    """Permission denied on read (chmod 000; as root, whom chmod does not stop, simulated)."""
    if os.geteuid() != 0:
        path.chmod(0)
        return
    original = _files.read_buffer

    def read_buffer(where, *args, **kwargs):
        if Path(where) == path:
            raise PermissionError(errno.EACCES, "Permission denied", str(where))
        return original(where, *args, **kwargs)

    mp.setattr(_files, "read_buffer", read_buffer)


def _restore(path):
    if path.exists() and not path.is_dir():
        path.chmod(0o644)


# -- engine cache: damaged entries

def _engine_header_flip(path, mp):
    """A one-bit flip in the region metadata that keeps the header valid JSON ("8" -> "9")."""
    data = path.read_bytes()
    start = len(store.MAGIC) + 8
    head_len = int.from_bytes(data[len(store.MAGIC):start], "little")
    head = data[start:start + head_len]
    at = head.index(b'"name": "output_0", "shape": [') + len(b'"name": "output_0", "shape": [')
    while not chr(head[at]).isalnum():
        at += 1
    path.write_bytes(data[:start + at] + bytes([head[at] ^ 0x01]) + data[start + at + 1:])  # 8 -> 9, s -> r


def _engine_foreign_version(path, mp):
    """Same file name, written by another TensorRT-RTX version (what a copied cache would hold)."""
    foreign = _key(trt_version="1.6.1")
    path.write_bytes(b"".join(_engine_cache.encode(foreign, _entry(1))))


def _engine_foreign_format(path, mp):
    mp.setattr(_engine_cache, "FORMAT", _engine_cache.FORMAT + 1)
    data = b"".join(_engine_cache.encode(_key(), _entry(1)))
    mp.undo()
    path.write_bytes(data)


def _engine_huge_header_length(path, mp):
    data = path.read_bytes()
    n = len(store.MAGIC)
    path.write_bytes(data[:n] + (2**62).to_bytes(8, "little") + data[n + 8:])


def _engine_nested_json(path, mp):
    head = b"[" * 100_000 + b"]" * 100_000
    path.write_bytes(store.MAGIC + len(head).to_bytes(8, "little") + head)


def _engine_other_inputs(path, mp):
    """A well-formed entry for this key whose input specs differ from the region's."""
    entry = _entry(1)
    spec = dataclasses.replace(entry.region.inputs[0], dtype=torch.float16)
    other = EngineEntry(dataclasses.replace(entry.region, inputs=(spec,)), entry.engine, entry.profile)
    path.write_bytes(b"".join(_engine_cache.encode(_key(), other)))


ENGINE_READ_FAULTS = {
    "garbage": _garbage,
    "truncated_half": _truncate(0.5),
    "truncated_in_header": _truncate(0.01),
    "last_byte_missing": _drop_last_byte,
    "zero_length": _zero_length,
    "payload_bit_flip": _flip(10),
    "header_bit_flip": _engine_header_flip,
    "foreign_version": _engine_foreign_version,
    "foreign_format": _engine_foreign_format,
    "foreign_file": _png,
    "huge_header_length": _engine_huge_header_length,
    "deeply_nested_header": _engine_nested_json,
    "other_input_specs": _engine_other_inputs,
    "permission_denied": _unreadable,
    "directory_in_the_way": _directory,
}

RUNTIME_READ_FAULTS = {
    "garbage": _garbage,
    "truncated_half": _truncate(0.5),
    "last_byte_missing": _drop_last_byte,
    "zero_length": _zero_length,
    "payload_bit_flip": _flip(10),
    "foreign_version": lambda p, mp: p.write_bytes(  # ours, holding another TensorRT-RTX version's cache
        b"".join(_runtime_cache.wrap(b"RTXRC-1.6" + _runtime_cache.unwrap(p.read_bytes())[9:]))),
    "foreign_file": _png,
    "permission_denied": _unreadable,
    "directory_in_the_way": _directory,
    "deserialize_raises": lambda p, mp: mp.setattr(
        FakeRuntimeCache, "deserialize", lambda self, d: (_ for _ in ()).throw(RuntimeError("injected"))),
}


# -- failing writes (monkeypatch): the previous version must survive

class _DiskFull:
    """A file object that takes half of the first chunk, then fails as a full disk does."""

    def __init__(self, f):
        self.f = f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def write(self, chunk):
        self.f.write(chunk[: len(chunk) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self.f, name)


def _disk_full(mp):
    real = os.fdopen
    mp.setattr(os, "fdopen", lambda fd, *a, **k: _DiskFull(real(fd, *a, **k)))


def _raises(target, name, exc):
    def inject(mp):
        def fail(*args, **kwargs):
            raise exc
        mp.setattr(target, name, fail)
    return inject


WRITE_FAULTS = {
    "disk_full": _disk_full,
    "no_permission": _raises(tempfile, "mkstemp", PermissionError(errno.EACCES, "Permission denied")),
    "fsync_fails": _raises(os, "fsync", OSError(errno.EIO, "Input/output error")),
    "rename_fails": _raises(os, "replace", OSError(errno.EXDEV, "Invalid cross-device link")),
    "lock_timeout": _raises(filelock.FileLock, "acquire", filelock.Timeout("held by another process")),
}


# ---- the scenarios -----------------------------------------------------------------------------------


def engine_read_case(damage) -> Callable[[Path, pytest.MonkeyPatch], Outcome]:
    def case(root, mp):
        out = Outcome()
        cache = EngineCache(root, 1 << 30)
        key, good = _key(), _entry(1)
        bystander_key, bystander = _key("bystander"), _entry(7)
        assert cache.store(key, good) and cache.store(bystander_key, bystander)
        path = cache.path(key)
        damage(path, mp)
        hit = out.call("load", cache.load, key, good.region.inputs)
        if hit is not None:
            out.served.append(f"load returned an entry from a damaged file ({hit.region.outputs[0].shape})")
        mp.undo()
        _restore(path)
        out.call("store", cache.store, key, good)  # what compile_region does after the miss
        if _read_entry(path, key) != good and not path.is_dir():
            out.unrecovered.append("the rebuilt entry was not written back")
        if _read_entry(cache.path(bystander_key), bystander_key) != bystander:
            out.lost.append("a bystander entry was damaged")
        out.temps_left = _temps(root)
        return out
    return case


def engine_write_case(fault) -> Callable[[Path, pytest.MonkeyPatch], Outcome]:
    def case(root, mp):
        out = Outcome()
        cache = EngineCache(root, 1 << 30)
        key, old, new = _key(), _entry(1), _entry(2)
        assert cache.store(key, old)
        fault(mp)
        if out.call("store", cache.store, key, new):
            out.crashed.append("store reported success under a failing write")
        mp.undo()
        if _read_entry(cache.path(key), key) != old:
            out.lost.append("the previous version of the entry did not survive the failed write")
        out.temps_left = _temps(root)
        if not (out.call("store again", cache.store, key, new) and _read_entry(cache.path(key), key) == new):
            out.unrecovered.append("the next store did not write the entry")
        return out
    return case


def engine_dir_is_a_file(root, mp):
    out = Outcome()
    blocker = root / "cache"
    blocker.write_bytes(b"a file where the cache directory should be")
    cache = EngineCache(blocker, 1 << 30)
    out.call("load", cache.load, _key())
    out.call("store", cache.store, _key(), _entry(1))
    if blocker.read_bytes() != b"a file where the cache directory should be":
        out.lost.append("the file in the way was changed")
    return out


def runtime_read_case(damage) -> Callable[[Path, pytest.MonkeyPatch], Outcome]:
    def case(root, mp):
        out = Outcome()
        path = root / "runtime.bin"
        assert RuntimeCache(FakeRuntimeCache(_kernels(1)), path).save()
        damage(path, mp)
        before = path.read_bytes() if path.is_file() else None  # as the load finds it
        cache = RuntimeCache(FakeRuntimeCache(), path)
        out.call("load", cache.load, FakeRuntimeCache)
        if cache.cache.kernels:
            out.served.append("kernels loaded from a damaged file")
        unreadable = cache.unread is not None
        cache.cache.kernels = _kernels(2)  # this process's JIT work
        out.call("save", cache.save)
        mp.undo()
        _restore(path)
        if unreadable and path.is_file() and path.read_bytes() != before:
            out.lost.append("a file that could not be read (it may be good) was overwritten")
        if not unreadable and not path.is_dir() and _read_kernels(path) != _kernels(2):
            out.unrecovered.append("the damaged file was not replaced by a good one")
        out.temps_left = _temps(root)
        return out
    return case


def runtime_write_case(fault) -> Callable[[Path, pytest.MonkeyPatch], Outcome]:
    def case(root, mp):
        out = Outcome()
        path = root / "runtime.bin"
        assert RuntimeCache(FakeRuntimeCache(_kernels(1)), path).save()
        cache = RuntimeCache(FakeRuntimeCache(), path)
        cache.load(FakeRuntimeCache)
        cache.cache.kernels = _kernels(2)
        fault(mp)
        if out.call("save", cache.save):
            out.crashed.append("save reported success under a failing write")
        mp.undo()
        if _read_kernels(path) != _kernels(1):
            out.lost.append("the previous file did not survive the failed write")
        out.temps_left = _temps(root)
        if not (out.call("save again", cache.save) and _read_kernels(path) == _kernels(2)):
            out.unrecovered.append("the next save did not write the file")
        return out
    return case


def runtime_serialize_raises(root, mp):
    out = Outcome()
    path = root / "runtime.bin"
    assert RuntimeCache(FakeRuntimeCache(_kernels(1)), path).save()
    cache = RuntimeCache(FakeRuntimeCache(_kernels(2)), path)
    mp.setattr(FakeRuntimeCache, "serialize", lambda self: (_ for _ in ()).throw(RuntimeError("injected")))
    out.call("save", cache.save)
    mp.undo()
    if _read_kernels(path) != _kernels(1):
        out.lost.append("the previous file did not survive")
    return out


def runtime_parent_is_a_file(root, mp):
    out = Outcome()
    (root / "blocker").write_bytes(b"x")
    cache = RuntimeCache(FakeRuntimeCache(_kernels(1)), root / "blocker" / "runtime.bin")
    out.call("load", cache.load, FakeRuntimeCache)
    out.call("save", cache.save)
    if (root / "blocker").read_bytes() != b"x":
        out.lost.append("the file in the way was changed")
    return out


# -- killed writers and concurrent writers (forked children: no interpreter start-up per kill)

BIG = 8 << 20  # large enough that a kill often lands in the middle of a write


def _fork(body: Callable[[], None]) -> int:
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            logging.disable(logging.CRITICAL)
            body()
            code = 0
        finally:
            os._exit(code)
    return pid


def _engine_saver(root: Path, versions: range) -> Callable[[], None]:
    def body():
        cache = EngineCache(root, 1 << 34)
        for v in versions:
            if not cache.store(_key(), _entry(v, BIG)):
                raise SystemExit(2)
    return body


def _runtime_saver(path: Path, versions: range) -> Callable[[], None]:
    def body():
        cache = RuntimeCache(FakeRuntimeCache(), path)
        for v in versions:
            cache.cache.kernels = _kernels(v, BIG)
            if not cache.save():
                raise SystemExit(2)
    return body


def _killed_mid_save(kind: str, kills: int) -> Callable[[Path, pytest.MonkeyPatch], Outcome]:
    def case(root, mp):
        out = Outcome(cases=kills)
        rng = random.Random(0)
        engine_cache = EngineCache(root, 1 << 34)
        path = root / "runtime.bin" if kind == "runtime" else engine_cache.path(_key())
        if kind == "runtime":
            assert RuntimeCache(FakeRuntimeCache(_kernels(0, BIG)), path).save()
        else:
            assert engine_cache.store(_key(), _entry(0, BIG))
        for k in range(kills):
            versions = range(1 + 100 * k, 100 * (k + 1))
            body = _runtime_saver(path, versions) if kind == "runtime" else _engine_saver(root, versions)
            pid = _fork(body)
            time.sleep(rng.uniform(0.05, 0.6))
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            out.mid_write += _temps(root) > 0
            # both readers check a SHA-256 over the whole content: not None is a complete version
            if kind == "runtime":
                ok = _read_kernels(path) is not None and len(_read_kernels(path) or b"") == BIG
            else:
                entry = _read_entry(path, _key())
                ok = entry is not None and len(entry.engine) == BIG
            if not ok:
                out.lost.append(f"kill {k}: the file is not a complete version")
            with contextlib.suppress(OSError):  # the next kill starts from a clean directory view
                for temp in root.glob(f".*{_files.TEMP_SUFFIX}"):
                    temp.unlink()
        # the lock a killed writer held is free: a save goes through at once
        mp.setattr(_files, "LOCK_TIMEOUT_S", 5.0)
        if kind == "runtime":
            done = out.call("save after the kills", RuntimeCache(FakeRuntimeCache(_kernels(5000)), path).save)
        else:
            done = out.call("store after the kills", engine_cache.store, _key(), _entry(5000))
        if not done:
            out.unrecovered.append("no save after the kills")
        return out
    return case


def _many_writers(kind: str, writers: int, saves: int) -> Callable[[Path, pytest.MonkeyPatch], Outcome]:
    def case(root, mp):
        out = Outcome(cases=writers)
        path = root / "runtime.bin" if kind == "runtime" else EngineCache(root, 1 << 34).path(_key())
        size = 1 << 20

        def writer(w):
            def body():
                if kind == "runtime":
                    cache = RuntimeCache(FakeRuntimeCache(), path)
                    for s in range(saves):
                        cache.cache.kernels = _kernels(w * 1000 + s, size)
                        if not cache.save():
                            raise SystemExit(2)
                else:
                    cache = EngineCache(root, 1 << 34)
                    for s in range(saves):
                        if not (cache.store(_key(), _entry(w * 1000 + s, size))
                                and cache.store(_key(f"w{w}-{s}"), _entry(s, 4096))):
                            raise SystemExit(2)
            return body

        def reader():
            deadline = time.time() + 60
            seen = 0
            while time.time() < deadline and seen < 200:
                if path.exists():
                    good = _read_kernels(path) is not None if kind == "runtime" else _read_entry(path, _key())
                    if not good:
                        raise SystemExit(3)  # a reader saw a half-written file
                    seen += 1
                time.sleep(0.002)

        pids = [_fork(writer(w)) for w in range(writers)] + [_fork(reader)]
        for i, pid in enumerate(pids):
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            if code == 3:
                out.served.append("a reader saw an incomplete file")
            elif code != 0:
                out.crashed.append(f"process {i} exited with {code}")
        final_ok = _read_kernels(path) is not None if kind == "runtime" else _read_entry(path, _key()) is not None
        if not final_ok:
            out.lost.append("the file is not a complete version after the writers")
        if kind == "engine":
            for w in range(writers):
                for s in range(saves):
                    if _read_entry(EngineCache(root, 1).path(_key(f"w{w}-{s}")), _key(f"w{w}-{s}")) is None:
                        out.lost.append(f"entry w{w}-{s} is missing or damaged")
        out.temps_left = _temps(root)
        return out
    return case


CASES: dict[str, Callable[[Path, pytest.MonkeyPatch], Outcome]] = {
    **{f"engine/read/{n}": engine_read_case(f) for n, f in ENGINE_READ_FAULTS.items()},
    **{f"engine/write/{n}": engine_write_case(f) for n, f in WRITE_FAULTS.items()},
    "engine/write/directory_is_a_file": engine_dir_is_a_file,
    **{f"runtime/read/{n}": runtime_read_case(f) for n, f in RUNTIME_READ_FAULTS.items()},
    **{f"runtime/write/{n}": runtime_write_case(f) for n, f in WRITE_FAULTS.items()},
    "runtime/write/serialize_raises": runtime_serialize_raises,
    "runtime/write/parent_is_a_file": runtime_parent_is_a_file,
    "engine/killed_mid_save": _killed_mid_save("engine", kills=8),
    "runtime/killed_mid_save": _killed_mid_save("runtime", kills=8),
    "engine/many_writers": _many_writers("engine", writers=6, saves=8),
    "runtime/many_writers": _many_writers("runtime", writers=6, saves=8),
}

_OUTCOMES: dict[str, Outcome] = {}


def run_case(name: str, tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    """Run a case once per session (the summary reuses what the per-case tests ran)."""
    if name not in _OUTCOMES:
        root = tmp_path_factory.mktemp(name.replace("/", "-"))
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_files, "LOCK_TIMEOUT_S", 30.0)
            _OUTCOMES[name] = CASES[name](root, mp)
    return _OUTCOMES[name]


@pytest.mark.parametrize("name", list(CASES))
def test_cache_fault(name, tmp_path_factory):
    out = run_case(name, tmp_path_factory)
    assert out.crashed == [], out.crashed
    assert out.lost == [], out.lost
    assert out.served == [], out.served
    assert out.unrecovered == [], out.unrecovered
    if "killed" not in name:
        assert out.temps_left == 0  # a failed write removes its temp file


def _dead_pid() -> int:
    pid = _fork(lambda: None)
    os.waitpid(pid, 0)
    return pid


def test_killed_writers_leave_temps_that_the_next_save_removes(tmp_path):
    """A writer killed mid-write leaves its temp file; the next save of that file removes it at
    once, its process being gone (and only temps of that file: a runtime cache may share a
    directory)."""
    path = tmp_path / "runtime.bin"
    host, dead = _files._host(), _dead_pid()
    stale = tmp_path / f".runtime.bin.{host}-{dead}.abc123{_files.TEMP_SUFFIX}"
    old = tmp_path / f".runtime.bin.otherhost-1.abc123{_files.TEMP_SUFFIX}"  # another host's: an hour old
    live = tmp_path / f".runtime.bin.{host}-{os.getppid()}.abc123{_files.TEMP_SUFFIX}"  # a writer at work
    other = tmp_path / f".someone-else.bin.{host}-{dead}.abc123{_files.TEMP_SUFFIX}"
    for temp in (stale, old, live, other):
        temp.write_bytes(b"half a file")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert RuntimeCache(FakeRuntimeCache(_kernels(1)), path).save()
    assert not stale.exists() and not old.exists()
    assert live.exists() and other.exists()


def test_summary(tmp_path_factory, capsys):
    """Every case (reusing the runs above): the counts the README quotes."""
    total = Outcome(cases=0)
    for name in CASES:
        total.merge(run_case(name, tmp_path_factory))
    lines = [
        f"cache fault cases tried: {total.cases} ({len(CASES)} scenarios: "
        f"{sum('/read/' in n for n in CASES)} damaged files, {sum('/write/' in n for n in CASES)} failing writes, "
        f"{2 * 8} SIGKILLs mid-save ({total.mid_write} left a half-written temp), 12 concurrent writers + 2 readers)",
        f"crashes: {len(total.crashed)}",
        f"files lost: {len(total.lost)}",
        f"bad files served: {len(total.served)}",
        f"not recovered after the fault: {len(total.unrecovered)}",
    ]
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert total.crashed == [] and total.lost == [] and total.served == []


# ---- end to end: a faulty cache never breaks a compile -------------------------------------------------

BUILD = {"min_block_size": 1, "target_compute_capabilities": [(8, 6)]}


def test_compile_with_a_full_disk_still_runs(monkeypatch, caplog, tmp_path):
    from rtx_backend import _trust

    assert _trust.secret() is not None  # the user's cache key was made before the disk filled up
    _disk_full(monkeypatch)
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    y = compile_and_run(model, x, engine_cache_dir=str(tmp_path / "engines"), **BUILD)
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    assert [r.kind for r in regions()] == ["onnxruntime"]
    assert "cannot write to the engine cache" in caplog.text
    left = {f.name for f in (tmp_path / "engines").iterdir()}
    assert left <= {".lock"}, left  # no entry, no half-written temp


def test_compile_over_damaged_entries_rebuilds_and_repairs(caplog, tmp_path):
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    options = {"engine_cache_dir": str(tmp_path / "engines"), **BUILD}
    compile_and_run(model, x, **options)
    (path,) = (tmp_path / "engines").glob("*.engine")
    good = path.read_bytes()
    for damage in (_engine_header_flip, _truncate(0.5), _zero_length):
        path.write_bytes(good)
        with pytest.MonkeyPatch.context() as mp:
            damage(path, mp)
        for attempt in ("rebuild", "hit"):
            torch._dynamo.reset()
            rtx_backend.reset_stats()
            caplog.clear()
            y = compile_and_run(model, x, **options)
            torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
            stats = rtx_backend.stats()
            if attempt == "rebuild":
                assert "unusable" in caplog.text and stats["engine_builds"] == 1
            else:  # the damaged entry was replaced by a good one
                assert stats["engine_cache_hits"] == 1 and "engine_builds" not in stats


@pytest.mark.gpu
def test_gpu_damaged_runtime_cache_file_still_runs(tmp_path, caplog):
    """The real TensorRT-RTX runtime cache: a damaged file is a warning, inference is right, and
    the file is replaced by a good one at the next save."""
    from rtx_backend import save_runtime_cache

    path = tmp_path / "runtime.bin"
    path.write_bytes(b"".join(_runtime_cache.wrap(os.urandom(4096))))  # ours, but not a cache TensorRT-RTX reads
    model = eval_model(MLP(), device="cuda")
    x = torch.randn(4, 16, device="cuda")
    y = compile_and_run(model, x, min_block_size=1, runtime="tensorrt_rtx", runtime_cache_path=str(path))
    torch.testing.assert_close(y, model(x), atol=1e-3, rtol=1e-3)
    assert "runtime cache" in caplog.text
    assert path in save_runtime_cache()
    from rtx_backend import _trt

    trt = _trt.trt()
    engine = trt.Runtime(_trt.logger()).deserialize_cuda_engine(regions()[0].engine)
    config = engine.create_runtime_config()
    assert config.create_runtime_cache().deserialize(_runtime_cache.unwrap(path.read_bytes()))  # a good file now
