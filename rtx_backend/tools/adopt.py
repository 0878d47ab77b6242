"""`python -m rtx_backend adopt-cache DIR`: take in an engine cache built elsewhere.

Cache files are signed with the key of the user who wrote them (_trust), so a directory copied
from another machine (engines built on a laptop for `[(8, 6)]`, shipped to an RTX 3090) or from
another user is all misses. Adopting it is the explicit step that says "I trust these files":
the directory is made private to this user (0700), and each file of ours in it is made 0600,
checked (its name is its key, its header and payloads match their SHA-256; a graph entry's pickle
names nothing but what compiled graphs hold, read from its opcodes without running it) and
signed again with this user's key. Files that fail are left as they are (misses) and listed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from .. import _files, _trust
from .._options import Options
from ..cache import engines as _engine_cache
from ..cache import store
from ..cache.store import CorruptEntry


@dataclasses.dataclass
class Adopted:
    """What adopt_cache did: files signed again, files refused (and why), the directory's fix."""

    directory: Path
    adopted: list[str] = dataclasses.field(default_factory=list)
    refused: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    changed_mode: str | None = None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None and not self.refused


def adopt_cache(directory: Path) -> Adopted:
    """Check and re-sign every cache file of ours in `directory` (see the module docstring)."""
    directory = Path(directory).expanduser()
    report = Adopted(directory)
    try:
        st = os.stat(directory)
    except OSError as exc:
        report.problem = f"cannot examine {directory}: {exc}"
        return report
    if not stat.S_ISDIR(st.st_mode):
        report.problem = f"{directory} is not a directory"
        return report
    if os.name == "posix" and st.st_uid != os.geteuid():
        report.problem = (f"{directory} is owned by uid {st.st_uid}, not by you; copy it to a directory of your own "
                          f"(cp -r {directory} <copy>) and adopt the copy")
        return report
    if os.name == "posix" and st.st_mode & 0o077:
        mode = stat.S_IMODE(st.st_mode) & ~0o077
        os.chmod(directory, mode)
        report.changed_mode = f"{mode:04o}"
    report.problem = _trust.directory_problem(directory)
    secret = _trust.secret()
    if report.problem is None and secret is None:
        report.problem = f"there is no usable cache key at {_trust.key_path()}"
    if report.problem is not None or secret is None:
        return report
    with _files.file_lock(directory / ".lock"):
        for path in sorted(directory.iterdir()):
            if not store.is_our_name(path.name):
                continue
            try:
                _adopt_file(path, secret)
                report.adopted.append(path.name)
            except (OSError, CorruptEntry) as exc:
                report.refused.append((path.name, str(exc)))
    return report


def _adopt_file(path: Path, secret: bytes) -> None:
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise CorruptEntry("not a regular file")
    if os.name == "posix" and st.st_uid == os.geteuid() and st.st_mode & 0o077:
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)  # a copy keeps the modes it had: made private
    magic = store.MAGICS[path.suffix]
    limit, what = store.read_limit(path.suffix, Options().engine_cache_size_mb * 2**20)
    data = _files.read_buffer(path, limit=limit, what=what)
    if data is None:
        raise CorruptEntry("it is gone")
    header, at, signed = store.parse_header(data, magic, secret)
    try:
        if header["key"] != path.stem or _engine_cache.make_key(header["fields"]) != header["key"]:
            raise CorruptEntry("its name is not the key that its header describes")
        payload = memoryview(data)[at:]
        _check_payload(path.suffix, header, payload)
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptEntry(f"unreadable header ({type(exc).__name__}: {exc})") from exc
    if not signed:
        _files.replace(path, [*store.framed_header(magic, header, secret), payload])


def _check_payload(suffix: str, header: dict[str, Any], payload: memoryview) -> None:
    if suffix == store.SUFFIX:
        onnx_size, engine_size = int(header["onnx"]["size"]), int(header["engine"]["size"])
        if onnx_size + engine_size != len(payload):
            raise CorruptEntry("truncated or padded payload")
        if hashlib.sha256(payload[:onnx_size]).hexdigest() != header["onnx"]["sha256"]:
            raise CorruptEntry("ONNX checksum mismatch")
        if hashlib.sha256(payload[onnx_size:]).hexdigest() != header["engine"]["sha256"]:
            raise CorruptEntry("engine checksum mismatch")
    elif suffix == store.GRAPH_SUFFIX:
        from ..cache.graphs import scan_globals

        if int(header["payload"]["size"]) != len(payload) or hashlib.sha256(payload).hexdigest() != header["payload"]["sha256"]:
            raise CorruptEntry("payload truncated or damaged")
        try:
            refused = scan_globals(payload)
        except Exception as exc:  # not a pickle at all
            raise CorruptEntry(f"its graph is not readable ({type(exc).__name__}: {exc})") from exc
        if refused:
            raise CorruptEntry(f"its graph names {', '.join(sorted(set(refused)))}, which no compiled graph holds")
    elif len(payload):
        raise CorruptEntry("a validation record with a payload")


def render_adopted(report: Adopted) -> str:
    lines = []
    if report.changed_mode is not None:
        lines.append(f"{report.directory}: made private to you (mode {report.changed_mode})")
    if report.problem is not None:
        lines.append(f"not adopted: {report.problem}")
        return "\n".join(lines)
    lines.append(f"{report.directory}: {len(report.adopted)} cache file(s) checked and signed with your key")
    for name, why in report.refused:
        lines.append(f"  refused {name}: {why} (left as it is: a miss)")
    return "\n".join(lines)
