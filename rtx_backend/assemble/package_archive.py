"""A package's archive and its integrity: the manifest that `rtx_backend.save` adds to the `.pt2`
that torch.export.save wrote, and the check of an archive against it before anything reads it.

The manifest (`extra/trtrtx.json`, under the archive's top-level folder) holds the format
version, versions, targets, options, the package's own graph form (package_graph.py), and the
size and SHA-256 of every other member, so that a truncated or altered archive is refused before
torch.export.load reads any of it; optionally an HMAC under a key that the saving and loading
sides share.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._errors import PackageError
from .package_graph import Unencodable, attach_members

log = logging.getLogger("rtx_backend")

FORMAT = 1  # of the manifest and of each op's meta
MANIFEST = "extra/trtrtx.json"  # under the archive's top-level folder


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k not in ("manifest_sha256", "mac")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def seal(path: Path, manifest: dict[str, Any], key: bytes | None) -> None:
    """Add the manifest to the archive that torch.export.save wrote at `path`: the size and
    SHA-256 of every member, its own SHA-256, and the HMAC of that under `key` when given."""
    from .. import _trust

    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        prefix = top_folder(names)
        files = {}
        for item in archive.infolist():
            with archive.open(item) as f:
                files[item.filename[len(prefix):]] = {"size": item.file_size, "sha256": _sha256(f)}
        if manifest.get("graph") is not None:
            try:
                attach_members(archive, prefix, manifest["graph"], manifest.pop("graph_owner", ""))
            except Unencodable as exc:
                log.info("trtrtx: the package holds no graph of its own (%s); load uses torch.export.load", exc)
                manifest["graph"] = None
    manifest.pop("graph_owner", None)
    manifest["files"] = files
    digest = manifest_digest(manifest)
    manifest["manifest_sha256"] = digest
    if key is not None:
        manifest["mac"] = _trust.sign(digest, key)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(prefix + MANIFEST, json.dumps(manifest, sort_keys=True, indent=1))


def top_folder(names: Sequence[str]) -> str:
    """The archive's top-level folder ("name/"), as torch.export.save lays it out."""
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) != 1 or not all("/" in n for n in names):
        raise PackageError("not a .pt2 archive of torch.export.save (no single top-level folder)")
    return f"{tops.pop()}/"


def _sha256(f: Any) -> str:
    h = hashlib.sha256()
    for chunk in iter(lambda: f.read(1 << 22), b""):
        h.update(chunk)
    return h.hexdigest()


def verify(path: str | os.PathLike[str], key: bytes | None = None) -> dict[str, Any]:
    """The package's manifest, after checking the archive against it: every member present, of
    its size and SHA-256, nothing added; the manifest's own checksum (and HMAC, with `key`); and
    nothing in it that torch.export.load would unpickle. Raises PackageError; reads the archive
    as a zip file only (no unpickling, no torch.export)."""
    from .. import _trust

    where = os.fspath(path)
    try:
        with zipfile.ZipFile(where) as archive:
            names = archive.namelist()
            prefix = top_folder(names)
            if prefix + MANIFEST not in names:
                raise PackageError(f"{where} is not a package saved by rtx_backend.save (no {MANIFEST})")
            manifest = json.loads(archive.read(prefix + MANIFEST))
            if not isinstance(manifest, dict):
                raise PackageError(f"{where}: its manifest is not a JSON object")
            if manifest.get("format") != FORMAT:
                raise PackageError(f"{where} is a package of format {manifest.get('format')!r}; this rtx_backend "
                                   f"reads format {FORMAT}: save it again with this version")
            if manifest.get("manifest_sha256") != manifest_digest(manifest):
                raise PackageError(f"{where}: its manifest was altered (checksum mismatch)")
            if key is not None and not _trust.verify(manifest["manifest_sha256"], manifest.get("mac"), key):
                raise PackageError(f"{where} is not signed with the given key (saved with another key, without "
                                   "one, or altered)")
            files = manifest.get("files")
            members = {n[len(prefix):]: n for n in names if n != prefix + MANIFEST}
            if not isinstance(files, dict) or set(files) != set(members):
                extra = sorted(set(members) - set(files or {}))[:3]
                absent = sorted(set(files or {}) - set(members))[:3]
                raise PackageError(f"{where}: its members are not the ones it was saved with "
                                   f"(added {extra}, missing {absent})")
            for name, full in members.items():
                info = archive.getinfo(full)
                with archive.open(info) as f:
                    if info.file_size != files[name]["size"] or _sha256(f) != files[name]["sha256"]:
                        raise PackageError(f"{where}: member {name} was altered or truncated (checksum mismatch)")
            _no_pickles(archive, prefix, where)
    except PackageError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError, KeyError, TypeError) as exc:
        raise PackageError(f"{where} cannot be read as a package ({type(exc).__name__}: {exc}); it is truncated, "
                           "damaged or not a .pt2 of rtx_backend.save") from exc
    return manifest


def _no_pickles(archive: zipfile.ZipFile, prefix: str, where: str) -> None:
    """rtx_backend.save writes every tensor as raw bytes and no example inputs: a package that
    asks torch.export.load to unpickle something is not one it wrote."""
    for name in archive.namelist():
        rel = name[len(prefix):]
        if rel.startswith("data/sample_inputs/") and archive.getinfo(name).file_size:
            raise PackageError(f"{where}: it holds pickled example inputs, which rtx_backend.save never writes")
        if rel.endswith("_config.json") and rel.startswith("data/"):
            config = json.loads(archive.read(name)).get("config", {})
            if any(meta.get("use_pickle") for meta in config.values()):
                raise PackageError(f"{where}: it holds pickled tensors ({rel}), which rtx_backend.save never writes")
        if rel.startswith("data/constants/") and not rel.endswith(".json") and "tensor" not in rel.rsplit("/", 1)[-1]:
            raise PackageError(f"{where}: it holds pickled objects ({rel}), which rtx_backend.save never writes")
