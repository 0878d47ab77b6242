"""Files that outlive the process (engine cache, runtime cache): atomic, locked writes.

A writer takes an inter-process lock (filelock: flock on POSIX, released by the OS if the
process dies), writes a temp file in the target's directory and renames it over the target.
Readers need no lock: a rename is atomic, so a reader sees the old file or the new one, never
a half-written one. Errors surface as OSError (filelock.Timeout is one) for the caller to turn
into a warning.

Reads never block: a file is opened non-blocking and must be a regular file (a FIFO, a device or
a directory in its place is an OSError, so a warning and a miss). Large files are read into an
anonymous memory map rather than a bytes object: malloc would keep a freed engine-sized block
(its mmap threshold rises to the largest block freed) and a process that compiles again and
again would grow by an engine each time.

A temp file's name carries the host and process that write it, so the next write removes the
temps of a writer that was killed as soon as that process is gone (and any after an hour), and
only temps of files of ours: `.<name>.<host>-<pid>.<random>.tmp`.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import filelock

from ._trust import make_directories

LOCK_TIMEOUT_S = 60.0
TEMP_SUFFIX = ".tmp"
MAP_BYTES = 1 << 20  # files at least this large are read into an anonymous map (see above)
STALE_TEMP_S = 3600.0
_TEMP = re.compile(r"\.(?P<name>.+)\.(?P<host>[A-Za-z0-9_-]*)-(?P<pid>\d+)\.[A-Za-z0-9_]+" + re.escape(TEMP_SUFFIX))


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def atomic_write(path: Path, chunks: Iterable[bytes], *, lock: Path | None = None) -> None:
    """Replace `path` by the concatenated chunks, under `lock` (default: `path` + ".lock")."""
    make_directories(path.parent)
    with filelock.FileLock(str(lock or lock_path(path)), timeout=LOCK_TIMEOUT_S):
        replace(path, chunks)


def replace(path: Path, chunks: Iterable[bytes | memoryview]) -> None:
    """Replace `path` by the concatenated chunks through a temp file and a rename; the caller
    holds the file's lock (atomic_write takes it), so its directory exists."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{_host()}-{os.getpid()}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, 0o644)  # mkstemp makes 0600; a shared cache directory must stay readable
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    remove_stale_temps(path.parent, name=path.name)  # what a writer killed mid-write left


def read_bytes(path: Path) -> bytes | None:
    """The file's bytes, None when it does not exist; other OSErrors propagate (also for what is
    not a regular file: see the module's docstring)."""
    data = read_buffer(path, map_from=None)
    return None if data is None else bytes(data)


def read_buffer(path: Path, map_from: int | None = MAP_BYTES) -> bytes | mmap.mmap | None:
    """The file's content, None when it does not exist: bytes, or from `map_from` bytes on an
    anonymous read/write map (slices of it are bytes, views of it keep it alive)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file ({_kind(st.st_mode)}); it is not read")
        size = st.st_size
        if map_from is None or size < map_from:
            return _read_all(fd, size)
        buffer = mmap.mmap(-1, size)
        view = memoryview(buffer)
        try:
            done = 0
            while done < size:
                n = os.readv(fd, [view[done:]])
                if n == 0:
                    raise OSError(f"{path} shrank while it was read")
                done += n
        finally:
            view.release()
        return buffer
    finally:
        os.close(fd)


def read_head(path: Path, size: int) -> bytes:
    """The first `size` bytes of a regular file (for telling our files from others); b"" for
    anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return b""
    try:
        return os.read(fd, size) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return b""
    finally:
        os.close(fd)


def _read_all(fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, max(size, 1 << 16))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:64]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: someone else's process
        return True
    return True


def temps(directory: Path, ours: Callable[[str], bool]) -> list[tuple[Path, str, int]]:
    """The temp files in `directory` of the files that `ours` accepts: (path, host, pid)."""
    out = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            m = _TEMP.fullmatch(entry.name)
            if m and ours(m["name"]):
                out.append((Path(entry.path), m["host"], int(m["pid"])))
    return out


def stale(host: str, pid: int, mtime: float, older_than_s: float = STALE_TEMP_S) -> bool:
    """Whether a temp's writer is gone: a process of this host that no longer runs, or
    any writer an hour later."""
    return (host == _host() and pid != os.getpid() and not _alive(pid)) or mtime < time.time() - older_than_s


def remove_stale_temps(directory: Path, ours: Callable[[str], bool] | None = None, *, name: str | None = None) -> int:
    """Delete the temps that killed writers left behind, of file `name` or of the files that
    `ours` accepts (never a temp of a file that is not ours); the bytes that remain in temps."""
    accept = ours if ours is not None else (lambda n: n == name)
    remaining = 0
    for temp, host, pid in temps(directory, accept):
        with contextlib.suppress(OSError):
            st = os.lstat(temp)
            if stat.S_ISREG(st.st_mode) and stale(host, pid, st.st_mtime):
                temp.unlink()
            else:
                remaining += st.st_size
    return remaining
