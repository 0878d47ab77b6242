"""TensorRT-RTX's runtime cache (its JIT-compiled kernels), persisted across processes.

TensorRT-RTX compiles specialised kernels when an engine first runs; the runtime cache keeps
that work, so a warm start skips it. One cache object per file is shared by every engine of
the process. It is loaded when the first runtime config asks for it and saved when an engine's
executor is released, at interpreter exit, and by `save_runtime_cache()`; an unchanged cache is
not rewritten.

The default file name carries the TensorRT-RTX version and the GPU, so a cache from another
version or GPU is never even tried. A file that TensorRT-RTX still rejects (driver update,
corruption), an unreadable file or an unwritable directory is a warning: the cache starts
empty or stays in memory, and inference never fails because of it.

The file is TensorRT-RTX's bytes behind a header of ours (magic, size, SHA-256 and this user's
HMAC, as engine-cache files have: see _trust), so kernels that this user did not save are never
loaded, and a file that is not a runtime cache of ours (a user's file named by mistake, a FIFO)
is never overwritten: the cache then stays in memory, with a warning. The file is read by the
checked reader (_files): a file larger than MAX_BYTES (a 4 TB sparse file) is a warning that
names its size and the limit, and it is not read.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import re
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import _files, _stats, _targets, _trt, _trust
from .._log import say_once
from .._options import Options
from ..cache.store import CorruptEntry, framed_header, read_header

log = logging.getLogger("rtx_backend")

MAGIC = b"TRTRTX-RUNTIME-CACHE\n"
FORMAT = 1
SUFFIX = ".cache"
MAX_BYTES = 1 << 30  # a runtime cache holds kernels: megabytes; a larger file is not read into memory
WHAT = "a runtime cache"


class Foreign(Exception):
    """A file that is not a runtime cache of ours: never read into TensorRT-RTX, never replaced."""


def wrap(blob: bytes) -> list[bytes]:
    """The file's chunks: our signed header, then TensorRT-RTX's serialized cache."""
    import hashlib as _hashlib

    header = {"format": FORMAT, "size": len(blob), "sha256": _hashlib.sha256(blob).hexdigest()}
    return [*framed_header(MAGIC, header), blob]


def unwrap(data: bytes) -> bytes:
    """TensorRT-RTX's bytes in a file of ours; raises Foreign (not ours) or CorruptEntry
    (damaged, or not signed by this user)."""
    if not data.startswith(MAGIC):
        raise Foreign("it is not a runtime cache written by rtx_backend")
    header, at = read_header(data, MAGIC, None, FORMAT)
    blob = data[at:]
    if len(blob) != header.get("size") or hashlib.sha256(blob).hexdigest() != header.get("sha256"):
        raise CorruptEntry("its content is truncated or damaged")
    return blob


class RuntimeCache:
    """One TensorRT-RTX IRuntimeCache and the file it persists to (None: memory only)."""

    def __init__(self, cache: Any, path: Path | None) -> None:
        self.cache = cache  # referenced here for as long as any runtime config may use it
        self.path = path
        self.lock = threading.Lock()
        self.saved_digest: bytes | None = None  # what the file holds, as far as we know
        self.unread: str | None = None  # why an existing file could not be read: never write over it

    def load(self, fresh: Callable[[], Any]) -> None:
        """Fill the cache from its file; on any problem keep (or make) an empty one and warn."""
        if self.path is None:
            return
        try:
            data = _files.read_bytes(self.path, limit=MAX_BYTES, what=WHAT)
        except (OSError, MemoryError) as exc:
            # Unreadable is not corrupt: the file may be good (another user's, a transient error),
            # so this process keeps its cache in memory rather than replace what it cannot judge.
            self.unread = str(exc) or type(exc).__name__
            say_once(f"trtrtx: cannot read the runtime cache {self.path} ({self.unread}); starting with an empty "
                     "cache, kept in memory")
            return
        if data is None:
            log.debug("trtrtx: no runtime cache at %s yet", self.path)
            return
        try:
            blob = unwrap(data)
        except Foreign as exc:
            self.unread = str(exc)
            say_once(f"trtrtx: runtime_cache_path {self.path} is not a runtime cache of rtx_backend ({exc}); it is "
                  "neither loaded nor overwritten, and the cache stays in memory. Point runtime_cache_path at "
                  "another file or a directory")
            return
        except CorruptEntry as exc:
            say_once(f"trtrtx: the runtime cache {self.path} is not loaded: {exc}; starting with an empty cache "
                  "(the file is replaced at the next save)")
            return
        try:
            ok = bool(blob) and self.cache.deserialize(blob) is not False
        except Exception as exc:  # a binding that raises instead of returning False
            log.debug("trtrtx: runtime cache deserialize raised %s", exc)
            ok = False
        if not ok:
            say_once(
                f"trtrtx: the runtime cache {self.path} is empty, corrupt, or from another TensorRT-RTX "
                "version, GPU or driver; starting with an empty cache (the file is replaced at the next save)"
            )
            self.cache = fresh()  # a failed deserialize may leave partial state behind
            return
        self.saved_digest = hashlib.sha256(blob).digest()
        _stats.count("runtime_cache_loads")
        log.info("trtrtx: loaded the runtime cache %s (%d bytes)", self.path, len(data))

    def save(self) -> bool:
        """Write the cache to its file when it changed, merged with what other processes saved
        there meanwhile; False (with one warning) when it cannot."""
        if self.path is None:
            return False
        if self.unread is not None:
            say_once(f"trtrtx: could not save the runtime cache to {self.path}: it could not be read ({self.unread}), "
                  "so it is not overwritten; the cache stays in memory")
            return False
        try:
            _files.make_directories(self.path.parent)
            # the file's lock, held from reading it to replacing it: no other save falls in between
            with self.lock, _files.file_lock(_files.lock_path(self.path)):
                data, on_disk = self._merged()
                if not data:
                    return False
                digest = hashlib.sha256(data).digest()
                if digest != on_disk:
                    _files.replace(self.path, wrap(data))
        except Exception as exc:  # OSError, filelock.Timeout, a TensorRT-RTX error: never fatal
            say_once(f"trtrtx: could not save the runtime cache to {self.path} ({str(exc) or type(exc).__name__}); "
                     "it stays in memory")
            return False
        if digest != on_disk:
            _stats.count("runtime_cache_saves")
            log.debug("trtrtx: saved the runtime cache %s (%d bytes)", self.path, len(data))
        self.saved_digest = digest
        return True

    def _merged(self) -> tuple[bytes, bytes | None]:
        """The cache's bytes, with the kernels of the file added when another process saved it
        since this one last read or wrote it (TensorRT-RTX's deserialize adds to a cache:
        a probe since removed); and the SHA-256 of the file as it is."""
        assert self.path is not None
        data = _files.read_bytes(self.path, limit=MAX_BYTES, what=WHAT)
        current = None
        if data is not None:
            try:
                current = unwrap(data)
            except Foreign as exc:  # appeared since the load: not ours to replace
                self.unread = str(exc)
                raise OSError(f"{self.path} is not a runtime cache of rtx_backend ({exc}); it is not overwritten") from exc
            except CorruptEntry as exc:
                log.debug("trtrtx: the runtime cache file %s is not used (%s); replacing it", self.path, exc)
        on_disk = hashlib.sha256(current).digest() if current else (b"" if data is not None else None)
        if current and on_disk != self.saved_digest:
            try:
                merged = self.cache.deserialize(current) is not False
            except Exception as exc:  # a binding that raises instead of returning False
                log.debug("trtrtx: runtime cache deserialize raised %s", exc)
                merged = False
            if merged:
                _stats.count("runtime_cache_merges")
                log.debug("trtrtx: merged the kernels that another process saved in %s", self.path)
            else:  # corrupt, or another version's: replaced by this process's cache
                log.debug("trtrtx: the runtime cache file %s is not mergeable; replacing it", self.path)
        blob = self.cache.serialize()
        return (bytes(blob) if blob is not None else b""), on_disk


def attach(config: Any, options: Options) -> RuntimeCache | None:
    """Give a runtime config the process's cache for `options.runtime_cache_path`.

    The caller keeps the returned object for as long as the config (and contexts made from it)
    live. None, with a warning, when TensorRT-RTX does not take the cache: inference goes on.
    """
    try:
        path = resolve_path(options.runtime_cache_path)
        if path is not None and not _trust.trusted_directory(path.parent, "runtime cache directory"):
            path = None  # memory only
        key = str(path) if path is not None else f"memory:{_targets.gpu_identity()}"
        entry = CACHES.get(key, lambda: RuntimeCache(config.create_runtime_cache(), path),
                           config.create_runtime_cache)
        if config.set_runtime_cache(entry.cache) is False:
            raise RuntimeError("set_runtime_cache returned False")
    except Exception as exc:
        say_once(f"trtrtx: TensorRT-RTX's runtime cache is not used ({str(exc) or type(exc).__name__}); kernels are "
                 "compiled on each start")
        return None
    return entry


def save_on_release(owner: object, entry: RuntimeCache | None) -> None:
    """Save `entry` when `owner` (an engine's executor) is garbage collected."""
    if entry is not None and entry.path is not None:
        weakref.finalize(owner, entry.save)


def save_runtime_cache() -> list[Path]:
    """Write every runtime cache of this process to its file now.

    Caches are also saved when a compiled model is released and at interpreter exit; call this
    to persist the JIT work earlier (say, after a warm-up). Returns the files that now hold the
    process's caches; a file that could not be written is left out, with a warning.
    """
    return [e.path for e in CACHES.all() if e.path is not None and e.save()]


def resolve_path(option: str | None) -> Path | None:
    """The cache file for the `runtime_cache_path` option; "" or None keep the cache in memory."""
    if not option:
        return None
    path = Path(option).expanduser()
    if path.is_dir() or option.endswith(("/", os.sep)):
        return path / default_file_name()
    return path


def default_file_name() -> str:
    name, (major, minor) = _targets.gpu_identity_parts()
    slug = re.sub(r"[^A-Za-z0-9.]+", "_", name).strip("_") or "gpu"
    return f"tensorrt_rtx-{_trt.version()}-{slug}-sm{major}{minor}{SUFFIX}"


class Caches:
    """The process's runtime caches: one per file (or, in memory only, per GPU), made and loaded
    on first use, saved at interpreter exit once one has a file."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_key: dict[str, RuntimeCache] = {}  # file path, or "memory:<gpu>" -> the cache
        self.saves_at_exit = False

    def get(self, key: str, make: Callable[[], RuntimeCache], create: Callable[[], Any]) -> RuntimeCache:
        with self.lock:
            entry = self.by_key.get(key)
            if entry is None:
                entry = make()
                entry.load(create)
                self.by_key[key] = entry
                if entry.path is not None and not self.saves_at_exit:
                    self.saves_at_exit = True
                    atexit.register(save_runtime_cache)
            return entry

    def all(self) -> list[RuntimeCache]:
        with self.lock:
            return list(self.by_key.values())


CACHES = Caches()
