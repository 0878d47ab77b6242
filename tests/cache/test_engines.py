"""Engine cache: keys, hits across processes, corruption, eviction, concurrent writers."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

import rtx_backend
from rtx_backend import _files, _stats, _trt
from rtx_backend._options import Options
from rtx_backend._types import OnnxRegion, TensorSpec
from rtx_backend.assemble import region as _region
from rtx_backend.cache import engines as _engine_cache
from rtx_backend.cache import store
from rtx_backend.cache.engines import EngineCache, EngineEntry, Key
from rtx_backend.run import executors as _executors

from ..helpers import compile_and_run, regions
from ..models import MLP, eval_model

SM86 = [(8, 6)]
ROOT = Path(__file__).resolve().parents[2]


def _options(**kw) -> Options:
    return Options.from_dict({"target_compute_capabilities": SM86, **kw})


def _linear_graph(seed: int = 0) -> torch.fx.GraphModule:
    torch.manual_seed(seed)
    return torch.fx.symbolic_trace(torch.nn.Linear(4, 3))


def _entry(payload: bytes = b"engine" * 100) -> EngineEntry:
    spec_in = TensorSpec("input_0", ("s0", 4), torch.float16, (2, 4), ((2, None), (4, 4)))
    spec_out = TensorSpec("output_0", ("s0", 3), torch.float16, (2, 3), ((2, None), (3, 3)))
    region = OnnxRegion(b"onnx-model-bytes", (0,), (spec_in,), (spec_out,))
    return EngineEntry(region, payload, {"input_0": ((1, 4), (2, 4), (64, 4))})


def _write_record(path: Path, key: Key, gpus: object) -> None:
    """A validation record as the cache writes it (signed with this user's key), holding `gpus`."""
    header = {"format": _engine_cache.FORMAT, "key": key.name, "fields": key.fields, "validated_on": gpus}
    path.write_bytes(b"".join(store.framed_header(store.VALIDATED_MAGIC, header)))


def _recorded(path: Path) -> object:
    """The GPUs a validation record file lists."""
    data = path.read_bytes()
    return store.read_header(data, store.VALIDATED_MAGIC, None, _engine_cache.FORMAT)[0]["validated_on"]


def _key(name: str = "k") -> Key:
    """A key named as the cache names them (a SHA-256 in hex: only such files are the cache's)."""
    return Key((name.encode().hex() * 64)[:64], {"graph": name})


# ---- the key -----------------------------------------------------------------------------------


PROFILE = {"input_0": ((1, 4), (8, 4), (64, 4))}


def test_same_graph_same_key_and_weights_change_it():
    cache = EngineCache(Path("unused"), 1 << 30)
    a = cache.key(_linear_graph(0), PROFILE, _options())
    assert a == cache.key(_linear_graph(0), PROFILE, _options())
    assert a != cache.key(_linear_graph(1), PROFILE, _options())  # same code, other weights


def test_key_changes_with_targets_profile_options_and_version(monkeypatch):
    cache = EngineCache(Path("unused"), 1 << 30)
    gm = _linear_graph()
    base = cache.key(gm, PROFILE, _options())
    assert base is not None
    others = [
        cache.key(gm, PROFILE, _options(target_compute_capabilities=[(7, 5)])),
        cache.key(gm, PROFILE, _options(target_compute_capabilities=[(7, 5), (8, 6)])),
        cache.key(gm, {"input_0": ((1, 4), (8, 4), (128, 4))}, _options()),
        cache.key(gm, {}, _options()),
        cache.key(gm, PROFILE, _options(optimize_onnx=False)),
    ]
    monkeypatch.setattr(_trt, "version", lambda: "1.4.0.76")
    others.append(cache.key(gm, PROFILE, _options()))
    monkeypatch.setattr(store, "package_fingerprint", lambda: "an edited ONNX bridge")
    others.append(cache.key(gm, PROFILE, _options()))
    names = {base.name} | {k.name for k in others if k is not None}
    assert len(names) == len(others) + 1


def test_declared_targets_make_the_key_independent_of_the_build_machine(monkeypatch):
    cache = EngineCache(Path("unused"), 1 << 30)
    gm = _linear_graph()
    monkeypatch.setattr(_engine_cache, "current_gpu", lambda: [None, None])  # a laptop without GPU
    laptop = cache.key(gm, PROFILE, _options())
    monkeypatch.setattr(_engine_cache, "current_gpu", lambda: [[8, 6], "NVIDIA GeForce RTX 3090"])
    assert cache.key(gm, PROFILE, _options()) == laptop
    # without declared targets the current GPU is the target, so it is part of the key
    bare = Options.from_dict({})
    on_3090 = cache.key(gm, PROFILE, bare)
    monkeypatch.setattr(_engine_cache, "current_gpu", lambda: [[8, 9], "NVIDIA GeForce RTX 4090"])
    assert on_3090 != cache.key(gm, PROFILE, bare)


def test_device_of_the_traced_graph_does_not_change_the_key():
    def graph(device: str) -> torch.fx.GraphModule:
        g = torch.fx.Graph()
        x = g.placeholder("x")
        y = g.call_function(torch.ones, (3,), {"device": torch.device(device)})
        g.output(g.call_function(torch.add, (x, y)))
        return torch.fx.GraphModule(torch.nn.Module(), g)

    cache = EngineCache(Path("unused"), 1 << 30)
    assert "device" in graph("cuda:0").code
    assert cache.key(graph("cpu"), {}, _options()) == cache.key(graph("cuda:0"), {}, _options())


def test_graph_with_unhashable_content_is_not_cached():
    class Outer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.inner(x)

    gm = torch.fx.symbolic_trace(Outer())  # nn.Linear stays a call_module: its weights are not in the code
    assert EngineCache(Path("unused"), 1 << 30).key(gm, {}, _options()) is None


# ---- entries on disk ---------------------------------------------------------------------------


def test_store_then_load_round_trips_region_metadata(tmp_path):
    cache = EngineCache(tmp_path, 1 << 30)
    entry = _entry()
    assert cache.store(_key(), entry)
    loaded = cache.load(_key(), entry.region.inputs)
    assert loaded == entry
    assert rtx_backend.stats()["engine_cache_hits"] == 1
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGES = {
    "zero_length": lambda p: p.write_bytes(b""),
    "garbage": lambda p: p.write_bytes(os.urandom(5000)),
    "truncated": _truncate,
    "flipped_engine_byte": _flip_last_byte,
    "bad_json": lambda p: p.write_bytes(store.MAGIC + (10).to_bytes(8, "little") + b"{not json}"),
}


@pytest.mark.parametrize("damage", DAMAGES.values(), ids=DAMAGES.keys())
def test_corrupt_entry_is_a_warning_and_a_miss_then_overwritten(damage, tmp_path, caplog):
    cache = EngineCache(tmp_path, 1 << 30)
    entry = _entry()
    cache.store(_key(), entry)
    damage(cache.path(_key()))
    with caplog.at_level(logging.WARNING, "rtx_backend"):
        assert cache.load(_key()) is None
    assert "unusable" in caplog.text
    assert rtx_backend.stats()["engine_cache_misses"] == 1
    assert cache.store(_key(), entry)
    assert cache.load(_key()) == entry


@pytest.mark.parametrize("threshold", [1 << 62, 0], ids=["serial", "parallel"])
@pytest.mark.parametrize(("section", "message"), [("onnx", "ONNX checksum"), ("engine", "engine checksum")])
def test_each_section_is_checked_when_both_are_hashed_at_once(tmp_path, caplog, monkeypatch, threshold, section, message):
    monkeypatch.setattr(_engine_cache, "PARALLEL_HASH_BYTES", threshold)
    cache = EngineCache(tmp_path, 1 << 30)
    entry = _entry()
    cache.store(_key(), entry)
    assert cache.load(_key()) == entry  # both checksums pass, either way
    path = cache.path(_key())
    data = bytearray(path.read_bytes())
    at = data.index(b"onnx-model-bytes") if section == "onnx" else len(data) - 1
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, "rtx_backend"):
        assert cache.load(_key()) is None
    assert message in caplog.text


def test_sha256s_equals_hashlib_serial_and_parallel(monkeypatch):
    buffers = [memoryview(os.urandom(n)) for n in (0, 10, 1 << 16)]
    expected = [hashlib.sha256(b).hexdigest() for b in buffers]
    for threshold in (1 << 62, 0):
        monkeypatch.setattr(_engine_cache, "PARALLEL_HASH_BYTES", threshold)
        assert _engine_cache.sha256s(buffers) == expected


def test_entry_of_another_key_is_never_served(tmp_path, caplog):
    cache = EngineCache(tmp_path, 1 << 30)
    cache.store(_key("a"), _entry())
    cache.path(_key("a")).rename(cache.path(_key("b")))  # e.g. a file copied under the wrong name
    assert cache.load(_key("b")) is None
    assert "another key" in caplog.text


def test_entry_whose_inputs_differ_is_never_served(tmp_path, caplog):
    cache = EngineCache(tmp_path, 1 << 30)
    entry = _entry()
    cache.store(_key(), entry)
    other = (TensorSpec("input_0", ("s0", 4), torch.float32, (2, 4), ((2, None), (4, 4))),)
    assert cache.load(_key(), other) is None
    assert "input specs differ" in caplog.text


def test_least_recently_used_entries_are_evicted(tmp_path):
    cache = EngineCache(tmp_path, 1 << 20)  # 1 MiB: room for two 400 kB entries, not three
    big = _entry(b"x" * 400_000)
    for age, name in ((1000, "a"), (1001, "b")):
        cache.store(_key(name), big)
        os.utime(cache.path(_key(name)), (age, age))
    assert cache.load(_key("a")) is not None  # a hit refreshes a: b is now the least recently used
    cache.store(_key("c"), big)
    assert {p.name for p in tmp_path.glob("*.engine")} == {cache.path(_key(n)).name for n in "ac"}
    assert rtx_backend.stats()["engine_cache_evictions"] == 1


def test_entry_larger_than_the_limit_is_not_stored(tmp_path):
    assert not EngineCache(tmp_path, 100).store(_key(), _entry())
    assert not list(tmp_path.glob("*.engine"))


def test_unwritable_directory_is_a_warning(tmp_path, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    cache = EngineCache(blocker / "engines", 1 << 30)
    assert not cache.store(_key(), _entry())
    assert cache.load(_key()) is None
    assert "cannot write to the engine cache" in caplog.text


# ---- options -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("engine_cache_size_mb", -1),
        ("engine_cache_size_mb", 1.5),
        ("engine_cache_size_mb", True),
        ("engine_cache_dir", 5),
        ("runtime_cache_path", ["a"]),
    ],
)
def test_bad_cache_options_are_rejected(key, value):
    with pytest.raises(rtx_backend.OptionsError, match=key):
        Options.from_dict({key: value})


def test_cache_directory_options(tmp_path):
    assert EngineCache.for_options(Options.from_dict({"engine_cache_dir": ""})) is None
    default = EngineCache.for_options(Options.from_dict({}))
    assert default is not None and default.directory == tmp_path / "cache" / "engines"  # conftest's root
    chosen = EngineCache.for_options(Options.from_dict({"engine_cache_dir": tmp_path / "e", "engine_cache_size_mb": 3}))
    assert chosen is not None and chosen.directory == tmp_path / "e" and chosen.size_limit == 3 << 20


# ---- through torch.compile ---------------------------------------------------------------------


def test_hit_skips_export_and_build(monkeypatch):
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86)
    assert rtx_backend.stats()["engine_builds"] == 1
    assert rtx_backend.stats()["engine_cache_misses"] == 1

    def forbidden(*args, **kwargs):
        raise AssertionError("a cache hit must not export or build")

    monkeypatch.setattr(_region, "export_region", forbidden)
    monkeypatch.setattr(_region, "build", forbidden)
    torch._dynamo.reset()
    rtx_backend.reset_stats()
    y = compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86)
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    assert rtx_backend.stats()["engine_cache_hits"] == 1
    assert rtx_backend.stats().get("engine_builds", 0) == 0


def test_engines_are_not_copied_from_the_builder_or_out_of_a_hit():
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86)
    (built,) = regions()
    assert isinstance(built.engine, memoryview) and type(built.engine.obj).__name__ == "IHostMemory"
    torch._dynamo.reset()
    compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86)
    (hit,) = regions()
    assert rtx_backend.stats()["engine_cache_hits"] == 1
    assert isinstance(hit.engine, memoryview) and isinstance(hit.engine.obj, bytes)  # the file's data
    assert hit.engine == built.engine and len(hit.engine) < len(hit.engine.obj)


def test_disabled_cache_writes_nothing(tmp_path):
    model = eval_model(MLP())
    compile_and_run(model, torch.randn(4, 16), min_block_size=1, target_compute_capabilities=SM86,
                    engine_cache_dir="")
    assert not (tmp_path / "cache" / "engines").exists()
    assert "engine_cache_misses" not in rtx_backend.stats()


def test_truncated_entry_is_rebuilt_and_replaced(caplog):
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86)
    (entry,) = Options().engine_cache_path.glob("*.engine")  # type: ignore[union-attr]
    _truncate(entry)
    torch._dynamo.reset()
    y = compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86)
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    assert "unusable" in caplog.text
    assert rtx_backend.stats()["engine_builds"] == 2
    torch._dynamo.reset()
    compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86)
    assert rtx_backend.stats()["engine_cache_hits"] == 1  # the rebuilt entry replaced the bad one


def test_unwritable_engine_cache_dir_still_compiles(tmp_path, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    y = compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86,
                        engine_cache_dir=str(blocker / "engines"))
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    assert "cannot write to the engine cache" in caplog.text


SECOND_PROCESS = textwrap.dedent(
    """
    import json, sys, torch
    sys.path.insert(0, sys.argv[1])
    import rtx_backend
    from tests.models import MLP, eval_model
    torch.manual_seed(0)
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    compiled = torch.compile(model, backend="trtrtx",
                             options={"min_block_size": 1, "target_compute_capabilities": [(8, 6)]})
    with torch.no_grad():
        err = (compiled(x) - model(x)).abs().max().item()
    print(json.dumps({"stats": rtx_backend.stats(), "err": err}))
    """
)


def test_hit_in_a_second_process_skips_the_build():
    torch.manual_seed(0)
    model = eval_model(MLP())  # the same weights as the second process's model
    compile_and_run(model, torch.randn(4, 16), min_block_size=1, target_compute_capabilities=SM86)
    assert rtx_backend.stats()["engine_builds"] == 1
    out = subprocess.run([sys.executable, "-c", SECOND_PROCESS, str(ROOT)], capture_output=True, text=True,
                         timeout=300, env=os.environ.copy())
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["stats"].get("engine_builds", 0) == 0, result
    assert result["stats"]["engine_cache_hits"] == 1
    assert result["err"] < 1e-5


# ---- concurrent writers ------------------------------------------------------------------------


WRITER = textwrap.dedent(
    """
    import logging, os, random, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    import rtx_backend
    from tests.cache.test_engines import _entry, _key
    from rtx_backend.cache.engines import EngineCache

    warnings = []
    class Count(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())
    logging.getLogger("rtx_backend").addHandler(Count())
    cache = EngineCache(Path(sys.argv[2]), 600_000)  # room for about two entries: eviction races too
    rng = random.Random(int(sys.argv[3]))
    bad = 0
    for _ in range(int(sys.argv[4])):
        name = rng.choice("abc")
        payload = name.encode() * rng.randrange(1_000, 250_000)
        cache.store(_key(name), _entry(payload))
        loaded = cache.load(_key(rng.choice("abc")))
        if loaded is not None and set(loaded.engine) - set(loaded.engine[:1]):
            bad += 1  # an entry mixing two writers' payloads
    print(bad, len(warnings), warnings[:3])
    """
)


def test_concurrent_writers_never_leave_an_unreadable_entry(tmp_path):
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(ROOT), str(tmp_path), str(seed), "60"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for seed in range(4)
    ]
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        bad, warnings, examples = stdout.strip().split(" ", 2)
        assert (bad, warnings) == ("0", "0"), examples
    cache = EngineCache(tmp_path, 600_000)
    for name in "abc":
        path = cache.path(_key(name))
        if path.exists():
            assert cache.load(_key(name)) is not None
    assert not list(tmp_path.glob(".*.tmp"))


# ---- validation records ------------------------------------------------------------------------


class _EngineStandIn(_executors.TrtExecutor):
    """Runs the region in ONNX Runtime but counts as the TensorRT-RTX executor of the cached engine."""

    kind = "tensorrt_rtx"

    def __init__(self, onnx_region: OnnxRegion) -> None:  # no GPU here: no engine to load
        self.ort = _executors.OrtExecutor(onnx_region)
        self._pending = None  # no contexts being made

    def run(self, args, tensors=(), shapes=None):
        return self.ort.run(args, tensors)


@pytest.fixture
def gpu_named(monkeypatch):
    """The GPU and driver validation records name, switchable; engines "run" in ONNX Runtime."""
    here = {"id": "GPU A sm86 driver 1"}
    monkeypatch.setattr(_engine_cache, "validation_identity", lambda: here["id"])
    monkeypatch.setattr(_region, "choose_executor", lambda name, onnx_region, *a: _EngineStandIn(onnx_region))
    return here


def test_a_validated_cached_engine_is_not_checked_again_on_the_same_gpu(gpu_named):
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86)
    assert rtx_backend.stats()["validations"] == 1
    (record,) = Options().engine_cache_path.glob("*.validated")  # type: ignore[union-attr]
    assert _recorded(record) == ["GPU A sm86 driver 1"]
    for gpu, checked in (("GPU A sm86 driver 1", False), ("GPU B sm89 driver 1", True),
                         ("GPU A sm86 driver 2", True), ("GPU B sm89 driver 1", False)):
        gpu_named["id"] = gpu
        torch._dynamo.reset()
        rtx_backend.reset_stats()
        y = compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86)
        torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
        stats = rtx_backend.stats()
        assert stats["engine_cache_hits"] == 1
        assert (stats.get("validations", 0), stats.get("validations_skipped", 0)) == ((1, 0) if checked else (0, 1)), gpu
    assert _recorded(record) == ["GPU A sm86 driver 1", "GPU B sm89 driver 1", "GPU A sm86 driver 2"]


def test_a_failed_check_is_not_recorded_and_an_unreadable_record_means_check_again(gpu_named, monkeypatch):
    from rtx_backend.run import validation as _validation

    model = eval_model(MLP())
    x = torch.randn(4, 16)
    right = _EngineStandIn.run
    monkeypatch.setattr(_EngineStandIn, "run", lambda self, args, tensors=(), shapes=None: [t * 0 for t in self.ort.run(args, tensors)])
    y = compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86)
    torch.testing.assert_close(y, model(x))  # the wrong engine was caught
    assert rtx_backend.stats()["validation_failures"] == 1
    assert not list(Options().engine_cache_path.glob("*.validated"))  # type: ignore[union-attr]
    monkeypatch.setattr(_EngineStandIn, "run", right)
    assert _validation.first_call  # (the module the check lives in)
    (entry,) = Options().engine_cache_path.glob("*.engine")  # type: ignore[union-attr]
    entry.with_suffix(".validated").write_text("{not json")
    torch._dynamo.reset()
    rtx_backend.reset_stats()
    compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86)
    assert rtx_backend.stats()["validations"] == 1 and "validations_skipped" not in rtx_backend.stats()
    assert _recorded(entry.with_suffix(".validated")) == [gpu_named["id"]]


def test_eviction_removes_the_validation_record(tmp_path):
    cache = EngineCache(tmp_path, 1 << 30)
    old, new = _key("a"), _key("b")
    assert cache.store(old, _entry())
    _write_record(cache.validation_path(old), old, [])
    cache.size_limit = len(b"".join(_engine_cache.encode(new, _entry()))) + 10
    assert cache.store(new, _entry())
    assert not cache.path(old).exists() and not cache.validation_path(old).exists()


def test_entries_are_written_behind_the_compile_and_still_hit_in_the_same_process(monkeypatch):
    """The first result does not wait for the entry's bytes to reach the disk; a compile of the
    same region meanwhile waits for that write and loads it rather than building again."""
    import threading

    release = threading.Event()
    store = EngineCache.store

    def slow_store(self, key, entry):
        assert release.wait(60), "the write was never released"
        return store(self, key, entry)

    monkeypatch.setattr(EngineCache, "store", slow_store)
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    compiled = torch.compile(model, backend="trtrtx", options={"min_block_size": 1, "target_compute_capabilities": SM86})
    with torch.no_grad():
        compiled(x)  # returns while the entry waits to be written
    directory = Options().engine_cache_path
    assert directory is not None and not list(directory.glob("*.engine"))
    assert _stats.stats()["engine_builds"] == 1  # the counters now: the public stats() would wait for the write
    threading.Timer(0.5, release.set).start()
    torch._dynamo.reset()
    y = compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86)
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    assert rtx_backend.stats()["engine_builds"] == 1 and rtx_backend.stats()["engine_cache_hits"] == 1
    assert len(list(directory.glob("*.engine"))) == 1


def test_a_load_waits_only_for_its_own_keys_pending_write(tmp_path):
    """A multi-region graph: the next region's lookup does not wait for an earlier region's write."""
    import threading
    import time

    release = threading.Event()
    cache = EngineCache(tmp_path, 1 << 30)
    slow, other = _key("a"), _key("b")
    store.write_behind(slow, lambda: release.wait(60))
    try:
        start = time.perf_counter()
        assert cache.load(other) is None
        assert time.perf_counter() - start < 5
    finally:
        release.set()
    store.flush(slow, timeout=60)


def test_stats_wait_for_the_writes_behind_so_store_counts_are_complete():
    """A store is counted on the writer thread: the public stats() must not be read before it."""
    import threading

    release = threading.Event()

    def store_after_release() -> None:
        release.wait(60)
        _stats.count("engine_cache_stores")

    rtx_backend.reset_stats()
    store.write_behind(_key("w"), store_after_release)
    threading.Timer(0.2, release.set).start()
    assert rtx_backend.stats().get("engine_cache_stores") == 1


@pytest.mark.parametrize("record", ['"GPU A sm86 driver 1 and more"', '{"GPU A sm86 driver 1": 1}', "[1, 2]"])
def test_a_record_that_is_not_a_list_of_gpus_vouches_for_none(tmp_path, monkeypatch, record):
    monkeypatch.setattr(_engine_cache, "validation_identity", lambda: "GPU A sm86 driver 1")
    cache = EngineCache(tmp_path, 1 << 30)
    key = _key("v")
    assert cache.store(key, _entry())
    _write_record(cache.validation_path(key), key, json.loads(record))  # signed, but not a list of GPUs
    assert not cache.validated_here(key)
    cache.mark_validated(key)
    assert cache.validated_here(key)
    assert _recorded(cache.validation_path(key)) == ["GPU A sm86 driver 1"]


class _TwoConstants(torch.nn.Module):
    def __init__(self, a: torch.Tensor, b: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("a", a)
        self.register_buffer("b", b)

    def forward(self, x):
        return x * self.a + self.b


def test_graph_digest_hashes_constants_in_parallel_to_the_same_key(monkeypatch):
    from rtx_backend.cache import engines as _engine_cache

    a, b = torch.arange(16.0), torch.arange(16.0) + 100
    digests = {}
    for threshold in (1 << 62, 0):  # serial, then every graph "large" (thread pool)
        monkeypatch.setattr(_engine_cache, "PARALLEL_HASH_BYTES", threshold)
        digests[threshold] = _engine_cache.graph_digest(torch.fx.symbolic_trace(_TwoConstants(a, b)))
        swapped = _engine_cache.graph_digest(torch.fx.symbolic_trace(_TwoConstants(b, a)))
        changed = _engine_cache.graph_digest(torch.fx.symbolic_trace(_TwoConstants(a, b + 1)))
        assert len({digests[threshold], swapped, changed}) == 3
        no_data = _engine_cache.graph_digest(torch.fx.symbolic_trace(_TwoConstants(a, torch.empty(16, device="meta"))))
        assert no_data is None  # not cacheable, in the pool as in the serial loop
    assert digests[1 << 62] == digests[0] is not None


def test_the_package_fingerprint_covers_every_file_by_content_and_path(tmp_path, monkeypatch):
    """Any edit, move, addition or removal of a file of the package changes every cache key;
    compiled bytecode does not."""
    import shutil

    from rtx_backend.cache import store

    copy = tmp_path / "rtx_backend"
    shutil.copytree(store.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(store, "PACKAGE", copy)

    def fingerprint() -> str:
        store.package_fingerprint.cache_clear()
        return store.package_fingerprint()

    try:
        first = fingerprint()
        (copy / "run" / "__pycache__").mkdir()
        (copy / "run" / "__pycache__" / "region.cpython-311.pyc").write_bytes(b"bytecode")
        assert fingerprint() == first
        bridge = copy / "export" / "bridge.py"
        original = bridge.read_bytes()
        bridge.write_bytes(original + b"# an edit\n")
        assert fingerprint() != first
        bridge.write_bytes(original)
        assert fingerprint() == first
        (copy / "plan" / "partition.py").rename(copy / "plan" / "partitions.py")  # a move, same content
        assert fingerprint() != first
        (copy / "plan" / "partitions.py").rename(copy / "plan" / "partition.py")
        (copy / "build" / "table.json").write_text("{}")  # not only Python files
        assert fingerprint() != first
    finally:
        store.package_fingerprint.cache_clear()


# ---- trust: only this user's files are served, only our own files are deleted --------------------


def _poison_weights(path: Path) -> None:
    """Scale the first stored weight of an entry's ONNX model by 1.5 and recompute every checksum
    (what anyone who can write to the cache directory can do)."""
    import numpy as np

    data = bytearray(path.read_bytes())
    start = len(store.MAGIC) + 8
    head_len = int.from_bytes(data[len(store.MAGIC):start], "little")
    header = json.loads(data[start:start + head_len])
    onnx_at = start + head_len
    at = onnx_at + header["onnx"]["skeleton"]
    _, size = header["onnx"]["weights"][0]
    weight = np.frombuffer(data, dtype=np.float32, count=size // 4, offset=at) * 1.5
    data[at:at + size] = weight.astype(np.float32).tobytes()
    payload = bytes(data[onnx_at:])
    onnx_size = header["onnx"]["size"]
    header["onnx"]["sha256"] = hashlib.sha256(payload[:onnx_size]).hexdigest()
    header.pop("header_sha256", None)
    mac = header.pop("mac", None)
    header["header_sha256"] = store._header_digest(header)
    if mac is not None:
        header["mac"] = mac  # the old signature, which no longer matches
    head = json.dumps(header, sort_keys=True).encode()
    path.write_bytes(store.MAGIC + len(head).to_bytes(8, "little") + head + payload)


def test_a_poisoned_engine_entry_is_a_miss_not_a_wrong_result(tmp_path, caplog):
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    options = {"min_block_size": 1, "target_compute_capabilities": SM86, "validate": False,
               "engine_cache_dir": str(tmp_path / "engines")}
    compile_and_run(model, x, **options)
    (entry,) = (tmp_path / "engines").glob("*.engine")
    for graph in (tmp_path / "engines").glob("*.graph"):
        graph.unlink()  # through the engine cache alone
    _poison_weights(entry)
    torch._dynamo.reset()
    rtx_backend.reset_stats()
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        y = compile_and_run(model, x, **options)
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    assert "not signed with your cache key" in caplog.text
    assert rtx_backend.stats()["engine_builds"] == 1


def test_a_planted_validation_record_does_not_skip_validation(gpu_named):
    model = eval_model(MLP())
    x = torch.randn(4, 16)
    compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86, validate=True)
    directory = Options().engine_cache_path
    assert directory is not None
    (record,) = directory.glob("*.validated")
    record.write_text(json.dumps([gpu_named["id"]]))  # planted: "this GPU checked it"
    for graph in directory.glob("*.graph"):
        graph.unlink()
    torch._dynamo.reset()
    rtx_backend.reset_stats()
    compile_and_run(model, x, min_block_size=1, target_compute_capabilities=SM86, validate=True)
    stats = rtx_backend.stats()
    assert stats["engine_cache_hits"] == 1 and stats["validations"] == 1 and "validations_skipped" not in stats


def test_a_validation_record_signed_with_another_key_vouches_for_nothing(gpu_named, tmp_path, caplog):
    cache = EngineCache(tmp_path, 1 << 30)
    key = _key("v")
    assert cache.store(key, _entry())
    header = {"format": _engine_cache.FORMAT, "key": key.name, "fields": key.fields, "validated_on": [gpu_named["id"]]}
    cache.validation_path(key).write_bytes(b"".join(store.framed_header(
        store.VALIDATED_MAGIC, header, b"someone else's key".ljust(32, b"!"))))
    assert not cache.validated_here(key)
    assert "not signed with your cache key" in caplog.text


def test_eviction_deletes_only_the_caches_own_files(tmp_path, caplog):
    """A user's files in the cache directory survive eviction: their names or their first bytes
    are not ours."""
    cache = EngineCache(tmp_path, 1 << 20)
    users = {"my_own_model.engine": os.urandom(3 << 20), "notes.graph": b"n" * 2000,
             "ab" * 32 + ".engine": b"not an entry" * 1000, "cd" * 32 + ".validated": b"[]"}
    for name, content in users.items():
        (tmp_path / name).write_bytes(content)
        os.utime(tmp_path / name, (1000, 1000))  # older than any entry: first in line
    unsaved = tmp_path / ".my_unsaved_work.tmp"
    unsaved.write_bytes(b"draft")
    os.utime(unsaved, (1000, 1000))
    for name in "abc":
        assert cache.store(_key(name), _entry(b"x" * 400_000))
    for name, content in users.items():
        assert (tmp_path / name).read_bytes() == content, name
    assert unsaved.read_bytes() == b"draft"
    assert not cache.path(_key("a")).exists() and cache.path(_key("c")).exists()  # our own entries were evicted


def _temp_of(path: Path, pid: int) -> Path:
    return path.with_name(f".{path.name}.{_files._host()}-{pid}.abc123{_files.TEMP_SUFFIX}")


def test_temps_of_a_killed_writer_are_removed_at_the_next_write_and_count_meanwhile(tmp_path):
    import subprocess as sp

    dead = sp.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    cache = EngineCache(tmp_path, 1 << 20)
    assert cache.store(_key("a"), _entry(b"x" * 300_000))
    live = _temp_of(cache.path(_key("w")), os.getppid())  # a writer still at work (a live process)
    live.write_bytes(b"t" * 500_000)
    killed = _temp_of(cache.path(_key("k")), dead.pid)
    killed.write_bytes(b"t" * 100_000)
    assert cache.store(_key("b"), _entry(b"x" * 300_000))
    assert not killed.exists()  # its process is gone: removed now, not an hour later
    assert live.exists()
    # the live temp's 500 kB count against the 1 MiB: a and b do not both fit beside it
    assert not cache.path(_key("a")).exists() and cache.path(_key("b")).exists()


def test_an_entry_others_could_have_written_or_too_large_is_a_miss_naming_why(tmp_path, caplog):
    cache = EngineCache(tmp_path, 1 << 20)
    key = _key("w")
    assert cache.store(key, _entry(b"x" * 1000))
    path = cache.path(key)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o666)
    assert cache.load(key) is None
    assert f"{path} is writable by group or others (mode 0666)" in caplog.text and f"chmod 600 {path}" in caplog.text
    path.chmod(0o600)
    assert cache.load(key) is not None
    with open(path, "r+b") as f:
        f.truncate(3 << 20)  # larger than the cache's size limit: never written by it
    assert cache.load(key) is None
    assert f"{path} is 3.0 MiB ({3 << 20} bytes), more than the 1.0 MiB" in caplog.text
    assert "engine_cache_size_mb=1" in caplog.text and f"rm {path}" in caplog.text
    if os.geteuid() == 0:
        assert cache.store(key, _entry(b"x" * 1000))
        os.chown(path, 65534, 65534)
        assert cache.load(key) is None
        assert f"{path} is owned by uid 65534" in caplog.text


def test_an_engine_entry_that_is_a_fifo_or_a_device_is_a_miss_not_a_hang(tmp_path, caplog):
    cache = EngineCache(tmp_path, 1 << 30)
    key = _key("f")
    os.mkfifo(cache.path(key))
    done: list = []
    thread = threading.Thread(target=lambda: done.append(cache.load(key)), daemon=True)
    thread.start()
    thread.join(60)
    assert done == [None], "reading a FIFO in the engine cache blocked"
    assert "a FIFO" in caplog.text
    cache.path(key).unlink()
    os.symlink("/dev/zero", cache.path(key))  # endless: reading it would never finish
    assert cache.load(key) is None
    assert "a symbolic link" in caplog.text  # never followed: the device is not even opened
    if os.geteuid() == 0:  # only root makes device nodes
        cache.path(key).unlink()
        os.mknod(cache.path(key), 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's
        assert cache.load(key) is None
        assert "a device" in caplog.text
    cache.path(key).unlink()
    cache.path(key).mkdir()
    assert cache.load(key) is None
    assert "a directory" in caplog.text
