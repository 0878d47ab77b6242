"""Engine cache: built engines on disk, reused by any later compile in any process.

The key is a SHA-256 of everything that changes an engine: the region's graph (its code, its
inputs' dtypes and shapes, the bytes of its frozen weights), the optimization profile, the
declared targets (or, with none declared, the current GPU), the TensorRT-RTX, torch and
exporter versions, a hash of the whole package's code (store.package_fingerprint), and the
options that matter.
With declared targets nothing in the key depends on the build machine, so an engine built on
a laptop without a GPU is a hit on the RTX GPU it was built for.

An entry holds the engine, the region's ONNX model and the region's metadata, so a hit skips
the export as well as the build. It is one file, `<key>.engine`, so that one rename publishes
all of it: MAGIC, the header length (8 bytes, little endian), a JSON header (the key and its
fields, the region metadata, sizes and SHA-256 of the payloads), the ONNX model, the engine
bytes. The ONNX model is its serialized bytes, or (for a freshly exported region) its weightless
skeleton followed by each large weight's raw bytes, as the header's weight table lists them: no
ONNX serialization in the writer, and a hit hands the weights to the parser without a copy.
A file that fails any check is a warning, a rebuild and an overwrite; a stale entry is
never served (the stored key and input specs are compared with the wanted ones). Every file
(entries, graph entries, validation records) carries an HMAC of its header under this user's
cache key (_trust): a file that this user did not write is a miss, whatever its checksums say.
Eviction and `clear-cache` delete only files whose names and first bytes are ours.

Long because the key, the graph digests it is made of, the entry's file format and the cache's
load, store, eviction and validation records all describe one kind of file; the framing and
threads that the caches share are in store.py.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import dataclasses
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import filelock
import numpy as np
import torch

from .. import _files, _host, _stats, _targets, _torch_compat, _trt, _trust
from .._options import Options
from .._types import EngineData, OnnxRegion, Profile, TensorSpec
from ..export.model import OnnxModel, as_bytes
from . import store
from .store import (
    GRAPH_SUFFIX,
    MAGIC,
    SUFFIX,
    VALIDATED_MAGIC,
    VALIDATED_SUFFIX,
    CorruptEntry,
    Key,
    flush,
    framed_header,
    is_our_name,
    is_ours,
    our_files,
    read_header,
    read_limit,
    write_behind,
)

log = logging.getLogger("rtx_backend")

PARALLEL_HASH_BYTES = 8 << 20  # below this, a thread pool costs about what it saves
FORMAT = 2  # 2: in-memory models stored as skeleton and raw weights
_DEVICE = re.compile(r"device\(type='\w+'(, index=\d+)?\)")


@dataclasses.dataclass(frozen=True)
class EngineEntry:
    """What a hit gives back: everything compile_region would otherwise export and build."""

    region: OnnxRegion
    engine: EngineData
    profile: Profile


def fetch_ahead(cache: EngineCache, keys: Sequence[Key]) -> list[concurrent.futures.Future[EngineEntry | None]]:
    """Begin `cache.fetch` of each key on reader threads: reading a file and checking its sums let
    go of the GIL, so a graph-cache hit reads its engines while it unpickles its graph, and a
    graph of several regions reads their engines at once. Pass each future to `load`."""
    return store.THREADS.read(cache.fetch, keys)


@dataclasses.dataclass(frozen=True)
class Validation:
    """An entry's validation record on this GPU, for the runtime module of its engine: an engine
    that agreed with PyTorch here before is not checked again in later processes."""

    cache: EngineCache
    key: Key

    def done(self) -> bool:
        return self.cache.validated_here(self.key)

    def mark(self) -> None:
        write_behind(self.key, self.cache.mark_validated, self.key)  # after its entry's pending write


# ---- the key -----------------------------------------------------------------------------------


def graph_digest(gm: torch.fx.GraphModule) -> str | None:
    """SHA-256 of a region graph: its code, its inputs and its constants' bytes (each constant
    copied to the host and hashed on its own, in parallel: the copy and hashlib let go of the GIL,
    and a large model's weights take a core-second to hash; the graph's digest covers those
    digests in graph order).

    None when the graph holds something whose content cannot be hashed (a submodule call, a
    tensor without data): such a region is not cached rather than risk a stale hit.
    """
    h = hashlib.sha256()
    h.update(_DEVICE.sub("device(...)", gm.code).encode())  # engines do not depend on the device
    constants: list[torch.Tensor] = []
    for node in gm.graph.nodes:
        if node.op == "call_module":
            return None
        if node.op == "placeholder":
            h.update(repr((node.name, _describe(node.meta.get("val")))).encode())
        elif node.op == "get_attr":
            value = fetch_attr(gm, str(node.target))
            if not isinstance(value, torch.Tensor):
                return None
            h.update(repr((node.target, str(value.dtype), tuple(value.shape))).encode())
            constants.append(value)
    digests = tensor_digests(constants)
    for digest in digests:
        if digest is None:
            return None
        h.update(digest)
    return h.hexdigest()


def tensor_digests(tensors: Sequence[torch.Tensor], *, remember: bool = False) -> list[bytes | None]:
    """SHA-256 of each tensor's bytes (None: no data), in parallel when they are large. Within a
    `digest_scope`, digests known from earlier in the scope are reused, and `remember` adds these:
    only for tensors that stay alive for the whole scope (Dynamo's inputs and the graph's
    constants), so that no freed memory is mistaken for one of them. Nothing writes to weights
    during a compile."""
    known = _KNOWN.get()
    copies = _host.current()  # (the pool's threads do not see the compile's scope)
    places = [_host.place(t) for t in tensors]
    digests = [known.get(p) if known and p is not None else None for p in places]
    todo = [t for t, d in zip(tensors, digests) if d is None]
    if sum(t.numel() * t.element_size() for t in todo) >= PARALLEL_HASH_BYTES and len(todo) > 1:
        with concurrent.futures.ThreadPoolExecutor(min(len(todo), os.cpu_count() or 1, 8)) as pool:
            hashed = iter(list(pool.map(lambda t: _tensor_digest(t, copies), todo)))
    else:
        hashed = iter([_tensor_digest(t, copies) for t in todo])
    digests = [d if d is not None else next(hashed) for d in digests]
    if remember and known is not None:
        for place, digest in zip(places, digests):
            if digest is not None and place is not None:
                known[place] = digest
    return digests


_KNOWN: contextvars.ContextVar[dict[tuple[Any, ...], bytes] | None] = contextvars.ContextVar(
    "rtx_backend_known_digests", default=None
)


@contextlib.contextmanager
def digest_scope() -> Iterator[None]:
    """A compile's scope in which remembered tensor digests are reused (see tensor_digests)."""
    token = _KNOWN.set({})
    try:
        yield
    finally:
        _KNOWN.reset(token)


def _tensor_digest(t: torch.Tensor, copies: _host.Copies | None = None) -> bytes | None:
    data = _tensor_bytes(t, copies)
    return None if data is None else hashlib.sha256(data).digest()


def key_fields(digest: str, profile: Profile, options: Options) -> dict[str, Any]:
    """Everything besides the graph that changes the engine, as JSON-able values."""
    targets = options.target_compute_capabilities
    return {
        "format": FORMAT,
        "graph": digest,
        "profile": _profile_fields(profile),
        "targets": [list(t) for t in targets] if targets is not None else {"current": current_gpu()},
        "tensorrt_rtx": _trt.version(),
        "software": {
            "torch": torch.__version__.split("+")[0],
            "onnxscript": _version("onnxscript"),
            "trtrtx": _version("trtrtx"),
            "package": store.package_fingerprint(),
        },
        "options": options.cache_key_fields(),
    }


def _profile_fields(profile: Profile) -> dict[str, Any]:
    return {name: [list(lo), list(opt), list(hi)] for name, (lo, opt, hi) in sorted(profile.items())}


def with_profile(key: Key, profile: Profile) -> Key:
    """The key of the same region's engine for another optimization profile (a widened one)."""
    fields = {**key.fields, "profile": _profile_fields(profile)}
    return Key(make_key(fields), fields)


def entry_path(directory: Path, key: Key) -> Path:
    """Where the engine-cache entry of `key` lives in `directory` (graph entries name theirs)."""
    return directory / f"{key.name}{SUFFIX}"


def make_key(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def validation_identity() -> str | None:
    """This GPU and driver, as validation records name them; None without a usable GPU."""
    if not torch.cuda.is_available():
        return None
    try:
        driver = _torch_compat.cuda_driver_version()
        return f"{_targets.gpu_identity()} driver {driver}"
    except Exception as exc:  # a GPU that cannot be queried is not one we can vouch for
        log.debug("trtrtx: no GPU identity for validation records: %s", exc)
        return None


def current_gpu() -> list[Any]:
    """The GPU that ComputeCapability.CURRENT builds for: its capability and name."""
    capability = _targets.current_capability()
    name = torch.cuda.get_device_name() if capability is not None else None
    return [list(capability) if capability else None, name]


# ---- the cache ---------------------------------------------------------------------------------


class EngineCache:
    """A directory of entries with a size limit; least recently used entries go first."""

    def __init__(self, directory: Path, size_limit: int) -> None:
        self.directory = directory
        self.size_limit = size_limit

    @classmethod
    def for_options(cls, options: Options) -> EngineCache | None:
        directory = options.engine_cache_path
        if directory is None or not _trust.trusted_directory(directory, "engine cache"):
            return None
        return cls(directory, options.engine_cache_size_mb * 2**20)

    def key(self, gm: torch.fx.GraphModule, profile: Profile, options: Options) -> Key | None:
        """The key of the engine for region graph `gm` (before export edits it); None: not cacheable."""
        digest = graph_digest(gm)
        if digest is None:
            return None
        fields = key_fields(digest, profile, options)
        return Key(make_key(fields), fields)

    def path(self, key: Key) -> Path:
        return entry_path(self.directory, key)

    def fetch(self, key: Key) -> EngineEntry | None:
        """Read and check the entry's file, and nothing else (no statistics, no use recorded):
        None when there is none; raises OSError or CorruptEntry. `load` accounts for it, so a
        caller may fetch ahead (on another thread) and pass the result to `load` when it knows
        that it needs the entry."""
        flush(key)  # an entry this process is still writing is a hit, not a second build
        limit, what = read_limit(SUFFIX, self.size_limit)
        data = _files.read_buffer(self.path(key), limit=limit, what=what)
        return decode(data, key) if data is not None else None

    def load(
        self, key: Key, inputs: Sequence[TensorSpec] | None = None,
        fetched: concurrent.futures.Future[EngineEntry | None] | None = None,
    ) -> EngineEntry | None:
        """The entry for `key`, or None (a miss; unusable files are a warning). `fetched`: the
        entry's `fetch`, begun earlier."""
        path = self.path(key)
        entry = None
        try:
            entry = fetched.result() if fetched is not None else self.fetch(key)
            if entry is not None and inputs is not None and entry.region.inputs != tuple(inputs):
                raise CorruptEntry("its input specs differ from this region's")
        except (OSError, CorruptEntry) as exc:
            log.warning("trtrtx: engine cache entry %s is unusable (%s); building the engine again", path, exc)
            entry = None
        if entry is None:
            _stats.count("engine_cache_misses")
            return None
        _stats.count("engine_cache_hits")
        with contextlib.suppress(OSError):
            os.utime(path)  # least recently used = oldest mtime
        log.info("trtrtx: engine cache hit %s", path.name)
        return entry

    def store_later(self, key: Key, entry: EngineEntry) -> concurrent.futures.Future[Any]:
        """`store` on the writer thread: the first result need not wait for a large engine's
        (and its ONNX model's) bytes to reach the disk."""
        # with the compile's host copies: its weights cross to the host once (_host.py)
        return write_behind(key, _host.within(_host.current(), self.store), key, entry)

    def store(self, key: Key, entry: EngineEntry) -> bool:
        """Write an entry (atomically, under the directory's lock) and evict beyond the limit."""
        path = self.path(key)
        try:
            chunks = encode(key, entry)
        except (TypeError, ValueError) as exc:
            log.warning("trtrtx: this engine is not cached (%s)", exc)
            return False
        size = sum(len(c) for c in chunks)
        if size > self.size_limit:
            log.info("trtrtx: an engine of %d MB exceeds engine_cache_size_mb; not cached", size >> 20)
            return False
        lock = self.directory / ".lock"
        try:
            _files.atomic_write(path, chunks, lock=lock)
        except OSError as exc:
            log.warning("trtrtx: cannot write to the engine cache %s (%s); engines are not cached", self.directory, exc)
            return False
        try:
            self.evict(keep=path, lock=lock)
        except OSError as exc:
            log.warning("trtrtx: engine cache eviction in %s failed (%s)", self.directory, exc)
        return True

    def validation_path(self, key: Key) -> Path:
        return self.directory / f"{key.name}{VALIDATED_SUFFIX}"

    def validated_on(self, key: Key) -> list[str]:
        """The GPUs and drivers this entry's engine passed first-call validation on; none when
        the record is missing or unreadable (then the engine is checked again)."""
        loaded = self._record(key).get("validated_on")
        return [s for s in loaded if isinstance(s, str)] if isinstance(loaded, list) else []

    def _record(self, key: Key) -> dict[str, Any]:
        """The entry's record beside its engine (validations, choices); empty when missing or
        unreadable (then what it held is found again)."""
        try:
            limit, what = read_limit(VALIDATED_SUFFIX, self.size_limit)
            data = _files.read_bytes(self.validation_path(key), limit=limit, what=what)
            if data is None:
                return {}
            record = read_header(data, VALIDATED_MAGIC, key, FORMAT)[0]
        except (OSError, CorruptEntry, KeyError, TypeError) as exc:
            log.warning("trtrtx: the validation record of engine cache entry %s is not used (%s); its engine "
                        "is checked again", key.name, exc)
            return {}
        return record if isinstance(record, dict) else {}

    def _update_record(self, key: Key, change: Callable[[dict[str, Any]], bool]) -> None:
        """Read the entry's record, let `change` edit it (False: nothing to write), write it."""
        if not self.path(key).exists():
            return
        record = {"validated_on": [], **self._record(key), "format": FORMAT, "key": key.name, "fields": key.fields}
        if not change(record):
            return
        try:  # two processes recording at once may keep one of the two: it is found again
            _files.atomic_write(self.validation_path(key), framed_header(VALIDATED_MAGIC, record),
                                lock=self.directory / ".lock")
        except (OSError, filelock.Timeout, ValueError) as exc:
            log.debug("trtrtx: cannot update the record of %s: %s", key.name, exc)

    def validated_here(self, key: Key) -> bool:
        """Whether this entry's engine has passed first-call validation on this GPU and driver
        before (then a later process need not check it again)."""
        here = validation_identity()
        return here is not None and here in self.validated_on(key)

    def mark_validated(self, key: Key) -> None:
        """Record that this entry's engine agreed with PyTorch on this GPU and driver."""
        here = validation_identity()
        if here is None:
            return

        def add(record: dict[str, Any]) -> bool:
            loaded = record.get("validated_on")
            seen = [s for s in loaded if isinstance(s, str)] if isinstance(loaded, list) else []
            record["validated_on"] = [*seen, here] if here not in seen else seen
            return here not in seen

        self._update_record(key, add)

    def choice(self, key: Key, here: str) -> dict[str, Any] | None:
        """What was recorded for this entry on machine `here` by `record_choice`, or None."""
        choices = self._record(key).get("choices")
        found = choices.get(here) if isinstance(choices, dict) else None
        return found if isinstance(found, dict) else None

    def record_choice(self, key: Key, here: str, value: dict[str, Any]) -> None:
        """Keep `value` (plain JSON) for this entry on machine `here` (see `_choices`)."""

        def put(record: dict[str, Any]) -> bool:
            choices = record.get("choices")
            record["choices"] = {**(choices if isinstance(choices, dict) else {}), here: value}
            return True

        self._update_record(key, put)

    def evict(self, keep: Path, lock: Path) -> None:
        """Remove the least recently used entries until the directory fits the size limit. Only
        entries of ours (names and magic); the temps of writers still at work count too."""
        with _files.file_lock(lock):
            in_temps = _files.remove_stale_temps(self.directory, ours=is_our_name)
            entries = []
            for path in our_files(self.directory, (SUFFIX, GRAPH_SUFFIX)):
                with contextlib.suppress(OSError):
                    st = path.stat()
                    entries.append((st.st_mtime, st.st_size, path))
            total = in_temps + sum(size for _, size, _ in entries)
            for _, size, path in sorted(entries, key=lambda e: e[0]):
                if total <= self.size_limit:
                    break
                if path == keep:
                    continue
                with contextlib.suppress(OSError):
                    path.unlink()
                    total -= size
                    record = path.with_suffix(VALIDATED_SUFFIX)
                    if is_ours(record):
                        with contextlib.suppress(OSError):
                            record.unlink()
                    _stats.count("engine_cache_evictions")
                    log.info("trtrtx: engine cache full, evicted %s", path.name)


# ---- the entry file ----------------------------------------------------------------------------


def encode(key: Key, entry: EngineEntry) -> list[Any]:
    """The entry file's chunks: magic, header length, header, the ONNX model, the engine. An
    in-memory model is stored as its skeleton and raw weights (see export/model.py), not serialized."""
    source = entry.region.source
    parts = source.parts() if isinstance(source, OnnxModel) else None
    onnx_meta: dict[str, Any]
    if parts is None:
        chunks: list[Any] = [as_bytes(source, keep=False)]  # the region keeps less
        onnx_meta = {}
    else:
        skeleton, weights = parts
        chunks = [skeleton, *(data for _, data in weights)]
        onnx_meta = {"skeleton": len(skeleton), "weights": [[name, len(data)] for name, data in weights]}
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)  # hashlib lets go of the GIL on large buffers
    engine = entry.engine
    header = {
        "format": FORMAT,
        "key": key.name,
        "fields": key.fields,
        "region": _region_to_json(entry.region),
        "profile": {n: [list(lo), list(opt), list(hi)] for n, (lo, opt, hi) in entry.profile.items()},
        "onnx": {"size": sum(len(c) for c in chunks), "sha256": digest.hexdigest(), **onnx_meta},
        "engine": {"size": len(engine), "sha256": hashlib.sha256(engine).hexdigest()},
    }
    return [*framed_header(MAGIC, header), *chunks, engine]  # the region metadata and profile are served too


def decode(data: Any, key: Key) -> EngineEntry:
    """The entry in `data`; raises CorruptEntry naming the first check that failed."""
    header, onnx_at = read_header(data, MAGIC, key, FORMAT)
    try:
        engine_at = onnx_at + int(header["onnx"]["size"])
        if engine_at + int(header["engine"]["size"]) != len(data):
            raise CorruptEntry("truncated or padded payload")
        view = memoryview(data)
        engine = view[engine_at:]  # no copy of the engine
        onnx_sum, engine_sum = sha256s([view[onnx_at:engine_at], engine])
        if onnx_sum != header["onnx"]["sha256"]:
            raise CorruptEntry("ONNX checksum mismatch")
        if engine_sum != header["engine"]["sha256"]:
            raise CorruptEntry("engine checksum mismatch")
        source = _onnx_source(data, onnx_at, engine_at, header["onnx"])
        region = _region_from_json(header["region"], source)
        profile = {n: (tuple(lo), tuple(opt), tuple(hi)) for n, (lo, opt, hi) in header["profile"].items()}
    except CorruptEntry:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise CorruptEntry(f"unreadable header ({type(exc).__name__}: {exc})") from exc
    return EngineEntry(region, engine, profile)


def _onnx_source(data: Any, start: int, end: int, meta: dict[str, Any]) -> bytes | OnnxModel:
    """The stored ONNX model: its bytes, or its skeleton and weights (views into `data`, no copy)."""
    if "weights" not in meta:
        return data[start:end]
    at = start + int(meta["skeleton"])
    skeleton, weights = data[start:at], {}
    for name, size in meta["weights"]:
        if not isinstance(name, str) or not 0 <= int(size) <= end - at:
            raise CorruptEntry("the weight table does not match the ONNX section")
        weights[name] = np.frombuffer(data, dtype=np.uint8, count=int(size), offset=at)
        at += int(size)
    if at != end or not start <= start + int(meta["skeleton"]) <= end:
        raise CorruptEntry("the weight table does not match the ONNX section")
    return OnnxModel(skeleton=skeleton, weights=weights)


def _region_to_json(region: OnnxRegion) -> dict[str, Any]:
    return {
        f.name: _to_json(getattr(region, f.name))
        for f in dataclasses.fields(region)
        if f.name != "source"
    }


def _region_from_json(data: dict[str, Any], model: bytes | OnnxModel) -> OnnxRegion:
    values = {name: _from_json(value) for name, value in data.items()}
    for name in ("inputs", "outputs"):
        values[name] = tuple(TensorSpec(**spec) for spec in values[name])
    return OnnxRegion(source=model, **values)


def _to_json(value: Any) -> Any:
    """Dataclasses, tuples and dtypes as JSON; the inverse is _from_json."""
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"fields": {f.name: _to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, (tuple, list)):
        return [_to_json(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"cannot store a {type(value).__name__} in the engine cache")


def _from_json(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"dtype"}:
        dtype = getattr(torch, value["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {value['dtype']!r}")
        return dtype
    if isinstance(value, dict) and set(value) == {"fields"}:
        return {k: _from_json(v) for k, v in value["fields"].items()}
    if isinstance(value, list):
        return tuple(_from_json(v) for v in value)
    return value


# ---- helpers -----------------------------------------------------------------------------------


def _describe(val: Any) -> Any:
    if isinstance(val, torch.Tensor):
        return ("tensor", str(val.dtype), tuple(str(s) for s in val.shape))
    if isinstance(val, torch.SymInt):
        return ("symint", str(val.node.expr))
    if val is None or isinstance(val, (int, float, bool)):
        return val
    return type(val).__name__


def fetch_attr(gm: torch.nn.Module, target: str) -> Any:
    """What a get_attr node's dotted `target` names under `gm` (None where a part is missing)."""
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part, None)
    return value


def _tensor_bytes(t: torch.Tensor, copies: _host.Copies | None = None) -> memoryview | None:
    try:
        flat = _host.host_copy(t, copies).reshape(-1)
        return flat.view(torch.uint8).numpy().data
    except Exception:  # meta or fake tensors, sparse or quantized layouts
        return None


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


def sha256s(buffers: Sequence[memoryview]) -> list[str]:
    """The SHA-256 of each buffer, computed at once when they are large (hashlib lets go of the
    GIL): a warm start checks both the ONNX model and the engine of every entry it loads."""
    if len(buffers) < 2 or sum(len(b) for b in buffers) < PARALLEL_HASH_BYTES:
        return [hashlib.sha256(b).hexdigest() for b in buffers]
    with concurrent.futures.ThreadPoolExecutor(len(buffers) - 1) as pool:
        rest = [pool.submit(lambda b: hashlib.sha256(b).hexdigest(), b) for b in buffers[1:]]
        return [hashlib.sha256(buffers[0]).hexdigest(), *(f.result() for f in rest)]
