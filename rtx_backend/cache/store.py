"""The store the caches share: one directory of files named and framed alike, written behind.

Engine entries (`<key>.engine`), graph entries (`<key>.graph`) and validation records
(`<key>.validated`) live side by side, each file framed the same way: a magic, the header's
length, a JSON header signed with this user's cache key (_trust), then the payload. Files are
written off the compile's path by one writer thread (in order, so a validation record follows
its entry) and read ahead by reader threads. Only files whose names and first bytes are ours
are ever evicted or cleared. Every key carries the package's fingerprint: a hash of every file
of the package, so that any edit or move of its code invalidates what its old code cached.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .. import _files, _threads, _trust

log = logging.getLogger("rtx_backend")

MAGIC = b"TRTRTX-ENGINE-CACHE\n"
SUFFIX = ".engine"
GRAPH_SUFFIX = ".graph"  # graph-cache entries (cache/graphs.py) share the directory and its size limit
VALIDATED_SUFFIX = ".validated"  # beside an entry: the GPUs and drivers its engine was validated on
GRAPH_MAGIC = b"TRTRTX-GRAPH-CACHE\n"
VALIDATED_MAGIC = b"TRTRTX-VALIDATED\n"
MAGICS = {SUFFIX: MAGIC, GRAPH_SUFFIX: GRAPH_MAGIC, VALIDATED_SUFFIX: VALIDATED_MAGIC}
GRAPH_MAX_BYTES = 256 << 20  # a graph entry holds code and no weights: kilobytes; a larger file is not read
RECORD_MAX_BYTES = 16 << 20  # a validation record: a few lines of JSON
_OUR_NAME = re.compile(r"[0-9a-f]{64}(?P<suffix>\.engine|\.graph|\.validated)")
PACKAGE = Path(__file__).resolve().parent.parent  # rtx_backend/


@dataclasses.dataclass(frozen=True)
class Key:
    """An entry's name (the SHA-256 of `fields`) and the fields, stored in the entry for checks."""

    name: str
    fields: dict[str, Any]


class CorruptEntry(Exception):
    """A cache file failed a check (internal: it becomes a warning and a rebuild)."""


# ---- write-behind and read-ahead: the threads that move cache files off the compile's path -----


class _Threads:
    """The store's writer thread (one: writes land in submission order) and reader threads, made
    on first use, and the writes still pending (each with the key it writes)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.writer = _threads.Pool(1, "trtrtx-cache-write")
        self.reader: concurrent.futures.ThreadPoolExecutor | None = None
        self.pending: dict[concurrent.futures.Future[Any], str] = {}

    def write(self, key: Key, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        # pending from the moment it is queued (a flush on another thread waits for it); at exit it
        # writes here instead (see _threads.Pool)
        future = self.writer.submit_recorded(self.lock, lambda f: self.pending.__setitem__(f, key.name), fn, *args)
        future.add_done_callback(self._finished)
        return future

    def _finished(self, future: concurrent.futures.Future[Any]) -> None:
        with self.lock:
            self.pending.pop(future, None)
        if not future.cancelled() and future.exception() is not None:  # store() reports its own OSErrors
            log.warning("trtrtx: writing to the engine cache failed: %s", future.exception())

    def read(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[concurrent.futures.Future[Any]]:
        with self.lock:
            if self.reader is None:
                self.reader = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="trtrtx-cache-read")
            return [self.reader.submit(fn, item) for item in items]

    def flush(self, key: Key | None = None, timeout: float | None = None) -> None:
        with self.lock:
            pending = [f for f, name in self.pending.items() if key is None or name == key.name]
        concurrent.futures.wait(pending, timeout=timeout)


THREADS = _Threads()


def write_behind(key: Key, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
    """Run `fn(*args)`, which writes `key`'s files, on the store's writer thread (one: writes land
    in submission order, so a validation record follows its entry). The interpreter waits for
    pending writes at exit."""
    return THREADS.write(key, fn, *args)


def flush(key: Key | None = None, timeout: float | None = None) -> None:
    """Wait until the cache files submitted so far (of `key`, or all) are written."""
    THREADS.flush(key, timeout)


def read_limit(suffix: str, engine_limit: int) -> tuple[int, str]:
    """The most bytes a file of this kind is read with (`engine_limit`: the cache's size limit,
    above which no entry is written) and what it is, for the checked reader's message."""
    if suffix == GRAPH_SUFFIX:
        return GRAPH_MAX_BYTES, "a graph cache entry"
    if suffix == VALIDATED_SUFFIX:
        return RECORD_MAX_BYTES, "a validation record"
    return engine_limit, f"an engine cache entry with engine_cache_size_mb={engine_limit >> 20}"


# ---- which files are ours ----------------------------------------------------------------------


def is_our_name(name: str) -> bool:
    """Whether a file name is one that this store writes: `<sha256>.engine|.graph|.validated`."""
    return _OUR_NAME.fullmatch(name) is not None


def is_ours(path: Path) -> bool:
    """Whether `path` is a file of this store: our name and our magic (a regular file: nothing
    else is ever opened in a way that could block)."""
    m = _OUR_NAME.fullmatch(path.name)
    if m is None:
        return False
    magic = MAGICS[m["suffix"]]
    return _files.read_head(path, len(magic)) == magic


def our_files(directory: Path, suffixes: Sequence[str] = tuple(MAGICS)) -> list[Path]:
    """The files of this store in `directory` (see is_ours), of the given kinds."""
    out = []
    with contextlib.suppress(OSError):
        for item in os.scandir(directory):
            path = Path(item.path)
            if path.suffix in suffixes and is_ours(path):
                out.append(path)
    return out


# ---- the package's fingerprint -----------------------------------------------------------------


@functools.cache
def package_fingerprint() -> str:
    """A hash of every file of this package (its path relative to the package, sorted, and its
    content; compiled bytecode, derived from the sources, is left out). Lowering, policy,
    partition, export and build all shape what the caches hold, and the keys are computed before
    any of them runs, so an edited, added, moved or removed file must miss every old entry, even
    when the package version did not change (development, installs from a branch). A file that
    cannot be read makes the fingerprint this process's own: nothing it writes is ever reused."""
    h = hashlib.sha256()
    for path in sorted(p for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                       and p.suffix not in (".pyc", ".pyo")):
        relative = path.relative_to(PACKAGE).as_posix()
        h.update(len(relative).to_bytes(4, "little") + relative.encode())
        try:
            content = path.read_bytes().replace(b"\r\n", b"\n")
        except OSError as exc:
            log.warning("trtrtx: cannot read %s (%s); this process's cache entries will not be reused", path, exc)
            content = uuid.uuid4().bytes
        h.update(len(content).to_bytes(8, "little") + hashlib.sha256(content).digest())
    return h.hexdigest()


def framed_header(magic: bytes, header: dict[str, Any], secret: bytes | None = None) -> list[bytes]:
    """A cache file's first chunks: magic, the header's length (8 bytes, little endian), the JSON
    header with its own SHA-256 (it is served as well as the payload) and this user's HMAC of that
    SHA-256 (`secret`: default this user's cache key). Raises ValueError without a usable key."""
    header.pop("header_sha256", None)
    header.pop("mac", None)
    secret = secret if secret is not None else _trust.secret()
    if secret is None:
        raise ValueError("there is no usable cache key to sign the file with")
    digest = _header_digest(header)
    header["header_sha256"] = digest
    header["mac"] = _trust.sign(digest, secret)
    head = json.dumps(header, sort_keys=True).encode()
    return [magic, len(head).to_bytes(8, "little"), head]


NOT_SIGNED = (f"not signed with your cache key (written by another user or on another machine, or altered); "
              f"it is not used. To use a cache copied from elsewhere, run `{_trust.ADOPT_HINT} DIR`")


def parse_header(data: Any, magic: bytes, secret: bytes | None) -> tuple[dict[str, Any], int, bool]:
    """A cache file's header (checked against its SHA-256), where its payload starts, and whether
    it is signed with `secret`. Raises CorruptEntry."""
    start = len(magic) + 8
    if len(data) < start or data[:len(magic)] != magic:
        raise CorruptEntry("not a cache entry of this kind (truncated or foreign)")
    head_len = int.from_bytes(data[len(magic):start], "little")
    if start + head_len > len(data):
        raise CorruptEntry("truncated header")
    try:
        header = json.loads(data[start:start + head_len])
        mac = header.pop("mac", None)
        digest = header.pop("header_sha256", None)
        if digest != _header_digest(header):
            raise CorruptEntry("header checksum mismatch")
    except CorruptEntry:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise CorruptEntry(f"unreadable header ({type(exc).__name__}: {exc})") from exc
    return header, start + head_len, secret is not None and _trust.verify(digest, mac, secret)


def read_header(data: Any, magic: bytes, key: Key | None, file_format: int) -> tuple[dict[str, Any], int]:
    """The checked header of a cache file written by this user for `key` (None: a file of no
    key, such as a runtime cache), and where its payload starts. Nothing in the header is
    trusted before its HMAC is checked."""
    header, at, signed = parse_header(data, magic, _trust.secret())
    if not signed:
        raise CorruptEntry(NOT_SIGNED)
    try:
        if header["format"] != file_format or (key is not None and (header["key"] != key.name
                                                                    or header["fields"] != key.fields)):
            raise CorruptEntry("written for another key or format")
    except CorruptEntry:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise CorruptEntry(f"unreadable header ({type(exc).__name__}: {exc})") from exc
    return header, at


def _header_digest(header: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(header, sort_keys=True).encode()).hexdigest()
