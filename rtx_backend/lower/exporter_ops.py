"""Which ATen ops the ONNX exporter translates, remembered across processes.

Importing the exporter's registry (onnxscript's torchlib) takes seconds, on every start, only to
learn which ops it translates (the policy asks, and the lowering keeps those ops whole). The
answer depends only on the torch and onnxscript versions, so it is kept in a small JSON file under
the cache root; a missing, unreadable or corrupt file means asking the registry's index
(lower/registry.py), which names the ops without inferring their signatures. The file is read
as every cache file is (_files' checked reader: a FIFO, a link or a file of another user's in its
place is a warning, never a hang), and only from a directory that _trust accepts.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import logging
from pathlib import Path

import torch

from .. import _files, _torch_compat, _trust
from .._files import atomic_write
from .._log import say_once
from .._options import default_cache_root

log = logging.getLogger("rtx_backend")


FILES = "ops-torch*-onnxscript*.json"  # the op lists of every version pair (clear-cache deletes them)
MAX_BYTES = 16 << 20  # a few thousand op names: tens of kilobytes
WHAT = "an exporter op list"


def _path() -> Path:
    versions = f"torch{torch.__version__}-onnxscript{importlib.metadata.version('onnxscript')}"
    return default_cache_root() / "exporter" / f"ops-{versions.replace('+', '_')}.json"


def is_ours(path: Path) -> bool:
    """Whether `path` holds an op list as translated() writes it (a JSON list of op names; read
    without blocking, as every cache file is)."""
    try:
        names = json.loads(_files.read_bytes(path, limit=MAX_BYTES, what=WHAT) or b"")
    except (OSError, ValueError):
        return False
    return isinstance(names, list) and all(isinstance(n, str) for n in names)


@functools.cache
def translated() -> frozenset[str]:
    """Names (str(OpOverload), e.g. "aten.add.Tensor") of the ops the exporter translates."""
    path = _path()
    problem = _trust.directory_problem(path.parent)
    if problem is not None:
        say_once(f"trtrtx: not using {path.parent} for the exporter's op list: {problem}. Without it, each start "
                 "asks the exporter's registry (about two seconds)")
    else:
        names = _read(path)
        if names is not None:
            return names
    from ..lower import registry as _registry

    found = frozenset(
        str(op) for op in _torch_compat.exporter("_decomp").get_onnx_implemented_overloads(_registry.lazy_registry())
        if isinstance(op, torch._ops.OpOverload)
    )
    try:
        if problem is None:
            atomic_write(path, [json.dumps(sorted(found)).encode()])
    except OSError as exc:  # an unwritable cache directory costs the next start two seconds, no more
        log.debug("trtrtx: could not save the exporter op list to %s: %s", path, exc)
    return found


def _read(path: Path) -> frozenset[str] | None:
    """The op list in `path`, None when there is none (or none usable: then it is rebuilt)."""
    try:
        data = _files.read_bytes(path, limit=MAX_BYTES, what=WHAT)
    except _files.Refused as exc:  # a FIFO, a link, another user's file, a huge file: replaced by a new one
        log.warning("trtrtx: %s; asking the exporter's registry instead", exc)
        return None
    except OSError as exc:
        log.debug("trtrtx: no usable exporter op list at %s (%s)", path, exc)
        return None
    if data is None:
        return None
    try:
        names = json.loads(data)
    except ValueError as exc:
        log.debug("trtrtx: the exporter op list %s is not JSON (%s); rebuilding it", path, exc)
        return None
    if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
        return frozenset(names)
    log.debug("trtrtx: %s does not hold a list of op names; rebuilding it", path)
    return None


def is_translated(op: torch._ops.OpOverload) -> bool:
    return str(op) in translated()


def overloads() -> set[torch._ops.OpOverload]:
    """The translated ops as OpOverloads of this torch (names it does not know are skipped)."""
    ops = set()
    for name in translated():
        namespace, packet, overload = name.split(".", 2)
        op = getattr(getattr(getattr(torch.ops, namespace, None), packet, None), overload, None)
        if isinstance(op, torch._ops.OpOverload):
            ops.add(op)
    return ops


