"""Trust in cache files: only files this user wrote are served, only directories this user owns.

A cache file is data that the next compile acts on: an engine runs on the GPU, a graph entry is
unpickled, a validation record skips a check, a runtime cache holds kernels. A checksum only says
that a file is whole; anyone who can write to the cache directory can also recompute it. So every
cache file carries an HMAC-SHA256 of its header (which holds the SHA-256 of each payload, already
computed for the integrity check: a large engine is not hashed twice) under a per-user secret,
`$XDG_CONFIG_HOME/rtx_backend/cache.key` (mode 0600, made on first use). A file without this
user's HMAC is a miss with a warning, never executed, never unpickled.

A cache directory owned by another user, or writable by group or others, is refused the way ssh
refuses such a key directory: with a warning that names the fix; caching is then off for that
directory and compiles go on without it. Above it, up to the first private directory of this
user's (mode 0700: no one else can look inside), each directory must be owned by this user or
root, and one that others can write to must have the sticky bit (as /tmp has: then only the owner
of a directory in it can rename or remove that directory). So a private directory under /tmp or
on a tmpfs, sticky or not, is accepted. Directories and files that the package creates are made 0700 and 0600
(_files): private to their owner. Files copied from another machine (engines built on a laptop
for a declared target) are taken in by an explicit step, `python -m rtx_backend adopt-cache DIR`,
which checks and re-signs them.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import hmac
import os
import secrets
import stat
import tempfile
import threading
from pathlib import Path

from ._files import Refused, make_directories, read_bytes
from ._log import say_once

KEY_BYTES = 32
ADOPT_HINT = "python -m rtx_backend adopt-cache"


class KeyFiles:
    """The key files read in this process, by (path, inode, mtime): a key is read once, and read
    again when its file is replaced. Tests and benchmarks call `clear()`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[tuple[str, int, int], bytes] = {}

    def get(self, ident: tuple[str, int, int]) -> bytes | None:
        with self._lock:
            return self._keys.get(ident)

    def put(self, ident: tuple[str, int, int], key: bytes) -> None:
        with self._lock:
            self._keys[ident] = key

    def clear(self) -> None:
        with self._lock:
            self._keys.clear()


KEYS = KeyFiles()


class Untrusted(Exception):
    """A cache file or directory that this user cannot vouch for (internal: a warning and a miss)."""


def key_path() -> Path:
    """The per-user secret's file: in the user's config directory, never in a cache directory."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "rtx_backend" / "cache.key"


def secret() -> bytes | None:
    """This user's cache key, made on first use; None (with one warning) when it cannot be read or
    made safely: then nothing is cached, as nothing could be trusted."""
    path = key_path()
    try:
        return _load_or_create(path)
    except (OSError, Untrusted) as exc:
        say_once(f"trtrtx: no usable cache key at {path} ({exc}); the engine, graph and runtime caches are off. "
                  "Fix: make the directory writable, or remove a damaged key file (a new one is made), "
                  "or set XDG_CONFIG_HOME to a directory of your own")
        return None


def _load_or_create(path: Path) -> bytes:
    with contextlib.suppress(FileNotFoundError):
        return _read_key(path)
    make_directories(path.parent)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".cache.key.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)  # mkstemp asks for 0600, which the umask may narrow
            f.write(secrets.token_bytes(KEY_BYTES))
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):  # another process made one first: use theirs
            os.link(temp, path)  # never replaces a key: entries signed with it stay valid
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise Untrusted("it is not a regular file")
    if os.name == "posix":
        if st.st_uid != os.geteuid():
            raise Untrusted(f"it is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})")
        if st.st_mode & 0o077:
            raise Untrusted(f"its mode is {stat.S_IMODE(st.st_mode):04o}; run `chmod 600 {path}`")
    ident = (str(path), st.st_ino, st.st_mtime_ns)
    known = KEYS.get(ident)
    if known is not None:
        return known
    try:
        key = read_bytes(path, limit=KEY_BYTES, what="a cache key") or b""
    except Refused as exc:
        raise Untrusted(str(exc)) from exc
    if len(key) != KEY_BYTES:
        raise Untrusted(f"it holds {len(key)} bytes, not {KEY_BYTES}")
    KEYS.put(ident, key)
    return key


def sign(digest: str, key: bytes) -> str:
    """The HMAC of a header's SHA-256 (hex): it covers the header and, through it, the payloads."""
    return hmac.new(key, digest.encode(), hashlib.sha256).hexdigest()


def verify(digest: str, mac: object, key: bytes) -> bool:
    return isinstance(mac, str) and hmac.compare_digest(sign(digest, key), mac)


# ---- directories --------------------------------------------------------------------------------


def directory_problem(directory: Path) -> str | None:
    """Why `directory` (or a directory above it) could let another user plant cache files or
    read them, in words that say what to do; None when it is safe or does not exist yet (it is
    then made by this user, 0700)."""
    if os.name != "posix":
        return None
    me = os.geteuid()
    try:
        st = os.stat(directory)
    except OSError:  # not there (made by this user), or not reachable: writes fail and say so
        st = None
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            return "it is not a directory"
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o022 and mode & stat.S_ISVTX:  # /tmp itself, /dev/shm: everyone's
            return (f"other users can create files in it (mode {mode:04o}, as in /tmp); a cache needs a directory "
                    f"that only you can write to. Fix: use one of your own inside it, such as "
                    f"{Path(directory) / own_name()} (trtrtx makes it, private to you)")
        if st.st_uid != me:
            return (f"it is owned by uid {st.st_uid}, not by you (uid {me}). Fix: use a directory of your own, "
                    f"or copy this one (cp -r) and run `{ADOPT_HINT} <copy>`")
        if mode & 0o022:
            return (f"it is writable by group or others (mode {mode:04o}). "
                    f"Fix: `chmod go-w {directory}`, or `{ADOPT_HINT} {directory}` if its files came from elsewhere")
    # Up from the directory to the first private one (yours, no group or other bits: no one else can even look
    # inside, and the cache makes its missing directories so) or to the root: each directory on the way must be
    # one that no other user can replace. One whose parent others can write to is safe only if that parent has
    # the sticky bit (/tmp, /dev/shm: then only the owner of a directory in it can rename or remove it).
    child = Path(os.path.realpath(directory))
    for parent in child.parents:
        try:
            cst = os.stat(child)
        except OSError:
            return None  # made by this user, 0700: private
        if cst.st_uid == me and not cst.st_mode & 0o077:
            return None
        try:
            pst = os.stat(parent)
        except OSError:
            return None  # not reachable: writes fail and say so
        mode = stat.S_IMODE(pst.st_mode)
        if pst.st_uid not in (0, me):
            return (f"{parent}, above it, is owned by uid {pst.st_uid}, who could replace {child}. "
                    f"Fix: {_private_fix(child, cst, me)}")
        if mode & 0o022 and not mode & stat.S_ISVTX:
            return (f"{parent}, above it, is writable by group or others (mode {mode:04o}) without the sticky bit "
                    f"that /tmp has, so another user could rename {child} and put their own in its place. "
                    f"Fix: {_private_fix(child, cst, me)}")
        child = parent
    return None


def _private_fix(child: Path, st: os.stat_result, me: int) -> str:
    """What to do about a directory that another user could replace: a private directory is safe
    anywhere (never `chmod` a directory above it, such as /tmp)."""
    if st.st_uid == me:
        return f"make {child} private to you (`chmod 700 {child}`), or use a directory under your home directory"
    return "use a directory of your own (under your home directory, say)"


def own_name() -> str:
    """A directory name for this user's cache inside a shared directory such as /tmp."""
    try:
        user = getpass.getuser()
    except Exception:  # no name for this uid (a container's): its number
        user = str(os.geteuid()) if os.name == "posix" else "user"
    return f"trtrtx-{user}"


def trusted_directory(directory: Path, what: str) -> bool:
    """Whether the cache `what` may use `directory`; a refusal is one warning per directory."""
    problem = directory_problem(directory)
    if problem is None:
        return secret() is not None
    say_once(f"trtrtx: not using {directory} as the {what}: {problem}. Without it, compiles go on uncached.")
    return False
