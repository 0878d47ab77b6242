"""Files that outlive the process (engine cache, runtime cache): atomic, locked writes.

A writer takes an inter-process lock (filelock: flock on POSIX, released by the OS if the
process dies), writes a temp file in the target's directory and renames it over the target.
Readers need no lock: a rename is atomic, so a reader sees the old file or the new one, never
a half-written one. Errors surface as OSError (filelock.Timeout is one) for the caller to turn
into a warning.
"""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import filelock

LOCK_TIMEOUT_S = 60.0
TEMP_SUFFIX = ".tmp"


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def atomic_write(path: Path, chunks: Iterable[bytes], *, lock: Path | None = None) -> None:
    """Replace `path` by the concatenated chunks, under `lock` (default: `path` + ".lock")."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(lock or lock_path(path)), timeout=LOCK_TIMEOUT_S):
        replace(path, chunks)


def replace(path: Path, chunks: Iterable[bytes]) -> None:
    """Replace `path` by the concatenated chunks through a temp file and a rename; the caller
    holds the file's lock (atomic_write takes it), so its directory exists."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
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
    """The file's bytes, None when it does not exist; other OSErrors propagate."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def remove_stale_temps(directory: Path, older_than_s: float = 3600.0, *, name: str | None = None) -> None:
    """Delete temp files that a crashed writer left behind (only those of file `name` if given:
    a runtime cache may live in a directory that is not ours)."""
    cutoff = time.time() - older_than_s
    pattern = f".{glob.escape(name)}.*{TEMP_SUFFIX}" if name else f".*{TEMP_SUFFIX}"
    with contextlib.suppress(OSError):
        for temp in directory.glob(pattern):
            with contextlib.suppress(OSError):
                if temp.stat().st_mtime < cutoff:
                    temp.unlink()
