"""Files that outlive the process (engine cache, runtime cache, op list): private, atomic, locked
writes and checked reads.

A writer takes an inter-process lock (filelock: flock on POSIX, released by the OS if the
process dies), writes a temp file beside the target and renames it over the target. Readers
need no lock: a rename is atomic. Errors surface as OSError (filelock.Timeout is one) for the
caller to turn into a warning.

Cache files hold a model's weights: every file written here (and every lock file) is mode 0600
and every directory made here 0700, whatever the umask: private to their owner.

Every cache file is read through one checked reader (`read_bytes`, `read_buffer`, `read_head`),
which never blocks and never reads what it cannot vouch for: the file must be a regular file (not
a FIFO, a device, a directory or a symbolic link: it is looked at before it is opened, and opened
non-blocking without following links), owned by this user, not writable by group or others, and
no larger than its caller's limit (a 4 TB sparse file is refused by its size, never read). A
refusal is a `Refused` (an OSError) whose message names the file, what is wrong and what to do.
Large files are read into an anonymous map, not bytes: malloc would keep a freed engine-sized
block (its mmap threshold rises to the largest block freed), a process compiling again and again
growing by an engine each time.

A temp file's name carries the host and process that write it, so the next write removes the
temps of a writer that was killed as soon as that process is gone (and any after an hour), and
only temps of files of ours: `.<name>.<host>-<pid>.<random>.tmp`.
"""

from __future__ import annotations

import contextlib
import errno
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

FILE_MODE = 0o600  # cache files and their locks: private to their owner, whatever the umask
DIRECTORY_MODE = 0o700  # directories made for caches: the same
LOCK_TIMEOUT_S = 60.0
TEMP_SUFFIX = ".tmp"
MAP_BYTES = 1 << 20  # files at least this large are read into an anonymous map (see above)
STALE_TEMP_S = 3600.0
_TEMP = re.compile(r"\.(?P<name>.+)\.(?P<host>[A-Za-z0-9_-]*)-(?P<pid>\d+)\.[A-Za-z0-9_]+" + re.escape(TEMP_SUFFIX))


class Refused(OSError):
    """A cache file that the checked reader does not read; the message says which, why and what
    to do."""


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def file_lock(path: Path) -> filelock.FileLock:
    """The inter-process lock at `path` (its file is made 0600, as cache files are)."""
    return filelock.FileLock(str(path), timeout=LOCK_TIMEOUT_S, mode=FILE_MODE)


def make_directories(directory: Path, mode: int = DIRECTORY_MODE) -> None:
    """`mkdir -p` whose new directories get `mode` (0700: private) whatever the umask. One that
    appears meanwhile must be a directory of this user's (another process of theirs made it):
    anything else, say a directory another user slipped in under /tmp, is an OSError."""
    missing = []
    for path in (directory, *directory.parents):
        if path.exists():
            break
        missing.append(path)
    for path in reversed(missing):
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or (os.name == "posix" and st.st_uid != os.geteuid()):
                raise OSError(errno.EEXIST, f"{path} appeared while it was being made, and it is not a directory "
                                            "of yours; it is not used") from None
            continue
        with contextlib.suppress(OSError):  # the umask took bits off; a file system without modes keeps its own
            os.chmod(path, mode)


def atomic_write(path: Path, chunks: Iterable[bytes], *, lock: Path | None = None) -> None:
    """Replace `path` by the concatenated chunks, under `lock` (default: `path` + ".lock")."""
    make_directories(path.parent)
    with file_lock(lock or lock_path(path)):
        replace(path, chunks)


def replace(path: Path, chunks: Iterable[bytes | memoryview]) -> None:
    """Replace `path` by the concatenated chunks through a temp file and a rename; the caller
    holds the file's lock (atomic_write takes it), so its directory exists."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{_host()}-{os.getpid()}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            with contextlib.suppress(OSError):  # mkstemp asks for 0600, which the umask may narrow
                os.fchmod(f.fileno(), FILE_MODE)
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    remove_stale_temps(path.parent, name=path.name)  # what a writer killed mid-write left


def read_bytes(path: Path, *, limit: int, what: str = "a cache file") -> bytes | None:
    """The file's bytes, None when it does not exist; Refused for a file that the checks refuse
    (see the module's docstring: `limit` bytes at most, `what` names the file in the message),
    other OSErrors propagate."""
    data = read_buffer(path, limit=limit, what=what, map_from=None)
    return None if data is None else bytes(data)


def read_buffer(path: Path, *, limit: int, what: str = "a cache file",
                map_from: int | None = MAP_BYTES) -> bytes | mmap.mmap | None:
    """The file's content, None when it does not exist: bytes, or from `map_from` bytes on an
    anonymous read/write map (slices of it are bytes, views of it keep it alive). Checked as
    `read_bytes` is."""
    opened = _open_checked(path, limit, what)
    if opened is None:
        return None
    fd, size = opened
    try:
        if map_from is None or size < map_from:
            return _read_all(path, fd, size, limit, what)
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
    """The first `size` bytes of a file that the checked reader accepts (for telling our files
    from others); b"" for anything else."""
    try:
        opened = _open_checked(path, None, "a cache file")
    except OSError:
        return b""
    if opened is None:
        return b""
    fd, _ = opened
    try:
        return os.read(fd, size)
    except OSError:
        return b""
    finally:
        os.close(fd)


def file_problem(path: Path, st: os.stat_result, limit: int | None = None, what: str = "a cache file") -> str | None:
    """Why the file that `st` describes is not read as a cache file; None when it may be."""
    if stat.S_ISLNK(st.st_mode):
        return (f"{path} is a symbolic link, and a cache file is never read through one; it is not read. "
                "Remove the link to have the file made again")
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is {_kind(st.st_mode)}, not a regular file; it is not read"
    if os.name == "posix":
        me = os.geteuid()
        if st.st_uid != me:
            return (f"{path} is owned by uid {st.st_uid}, not by you (uid {me}); it is not read. Remove it to have "
                    "it made again, or use a cache directory of your own")
        if st.st_mode & 0o022:
            return (f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); it is not read. "
                    f"Fix: `chmod 600 {path}`, or remove it to have it made again")
    if limit is not None and st.st_size > limit:
        return (f"{path} is {human_size(st.st_size)} ({st.st_size} bytes), more than the {human_size(limit)} that "
                f"{what} may be; it is not read. Fix: remove it (`rm {path}`); it is made again when needed")
    return None


def human_size(n: int) -> str:
    """Bytes in binary units: "512 B", "4.0 TiB"."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _open_checked(path: Path, limit: int | None, what: str) -> tuple[int, int] | None:
    """An open descriptor of the file and its size, None when it does not exist; Refused when
    `file_problem` objects. The file is looked at before it is opened (a device is never
    opened), then opened without following a link and without blocking, and checked again: the
    file opened is the file looked at."""
    try:
        before = os.lstat(path)
    except FileNotFoundError:
        return None
    problem = file_problem(path, before, limit, what)
    if problem is not None:
        raise Refused(problem)
    flags = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_NOCTTY", 0))
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # replaced by a link since it was looked at
            raise Refused(f"{path} is a symbolic link, and a cache file is never read through one; it is not read") from exc
        raise
    try:
        st = os.fstat(fd)
        problem = file_problem(path, st, limit, what)
        if problem is None and (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            problem = f"{path} was replaced while it was opened; it is not read"
        if problem is not None:
            raise Refused(problem)
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def _read_all(path: Path, fd: int, size: int, limit: int, what: str) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, max(min(size, limit + 1 - total), 1 << 16))
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > limit:  # it grew while it was read
            raise Refused(f"{path} grew past the {human_size(limit)} that {what} may be while it was read; "
                          "it is not read")
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
