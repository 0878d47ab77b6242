"""Graph cache: a compiled graph reused ahead of aot_autograd, in this process and in others."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

import rtx_backend
from rtx_backend._options import Options
from rtx_backend.assemble import region as _region
from rtx_backend.assemble import reuse as _reuse
from rtx_backend.cache import engines as _engine_cache
from rtx_backend.cache import graphs as _graph_cache
from rtx_backend.cache import store

from ..helpers import _LAST, compile_and_run, regions
from ..models import MLP, ConvNet, WithEagerOp, eval_model

SM86 = [(8, 6)]
ROOT = Path(__file__).resolve().parents[2]


def _opts(tmp_path: Path, **kw) -> dict:
    return {"target_compute_capabilities": SM86, "engine_cache_dir": str(tmp_path / "engines"), "min_block_size": 1,
            **kw}


def _files(tmp_path: Path, suffix: str) -> list[Path]:
    return sorted((tmp_path / "engines").glob(f"*{suffix}"))


def _again(model, x, options):
    """Compile in a fresh Dynamo state (as a new process would) and return the result."""
    torch._dynamo.reset()
    rtx_backend.reset_stats()
    return compile_and_run(model, x, **options)


class _NoLowering:
    """Replaces aot_autograd's lowering: a hit must not reach it."""

    calls = 0

    def __call__(self, *args, **kwargs):
        type(self).calls += 1
        raise AssertionError("the graph was lowered on a graph-cache hit")


def test_hit_skips_lowering_and_gives_the_same_results(tmp_path, monkeypatch):
    model, x = eval_model(ConvNet()), torch.randn(2, 3, 16, 16)
    options = _opts(tmp_path)
    first = compile_and_run(model, x, **options)
    stats = rtx_backend.stats()
    assert stats["graph_cache_misses"] == 1 and stats["graph_cache_stores"] == 1
    assert len(_files(tmp_path, ".graph")) == 1
    plan = _LAST[0].plan
    monkeypatch.setattr(_reuse, "lower", _NoLowering())
    second = _again(model, x, options)
    stats = rtx_backend.stats()
    assert stats["graph_cache_hits"] == 1 and stats["engine_cache_hits"] == 1
    assert "engine_builds" not in stats and _NoLowering.calls == 0
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    torch.testing.assert_close(second, model(x), rtol=1e-4, atol=1e-5)
    assert [r.kind for r in regions()] == ["onnxruntime"]
    assert _LAST[0].plan.regions == plan.regions and _LAST[0].plan.eager_ops == plan.eager_ops


def test_weights_are_references_not_copies(tmp_path):
    model, x = eval_model(MLP(64, 256, 64)), torch.randn(4, 64)
    compile_and_run(model, x, **_opts(tmp_path))
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert _files(tmp_path, ".graph")[0].stat().st_size < weight_bytes / 20
    _again(model, x, _opts(tmp_path))
    assert rtx_backend.stats()["graph_cache_hits"] == 1
    reference = regions()[0].graph_module  # the region's ATen graph, for validation and fallback
    frozen = {t.data_ptr() for t in reference.__dict__.values() if isinstance(t, torch.Tensor)}
    frozen |= {t.data_ptr() for t in reference.buffers()}
    assert {p.data_ptr() for p in model.parameters()} <= frozen  # the model's own weights, bound again


def test_a_hit_marks_the_entry_recently_used(tmp_path):
    """Eviction takes the least recently used files first: a hit refreshes the graph entry's
    modification time, as one refreshes an engine's."""
    model, x = eval_model(MLP()), torch.randn(2, 16)
    compile_and_run(model, x, **_opts(tmp_path))
    (path,) = _files(tmp_path, ".graph")
    os.utime(path, (1_000_000, 1_000_000))
    _again(model, x, _opts(tmp_path))
    assert rtx_backend.stats()["graph_cache_hits"] == 1 and path.stat().st_mtime > 1_000_000


def test_eager_ops_and_reasons_are_kept(tmp_path):
    model, x = eval_model(WithEagerOp()), torch.randn(3, 16)
    options = _opts(tmp_path, torch_executed_ops=["aten.sigmoid.default"])
    first = compile_and_run(model, x, **options)
    plan = _LAST[0].plan
    assert plan.eager_ops and len(plan.regions) == 2
    second = _again(model, x, options)
    assert rtx_backend.stats()["graph_cache_hits"] == 1
    hit = _LAST[0].plan
    assert hit.eager_ops == plan.eager_ops and hit.regions == plan.regions
    assert {k: str(v) for k, v in hit.reasons.items()} == {k: str(v) for k, v in plan.reasons.items()}
    torch.testing.assert_close(second, first, rtol=0, atol=0)


def test_changed_weights_miss(tmp_path):
    model, x = eval_model(MLP()), torch.randn(2, 16)
    compile_and_run(model, x, **_opts(tmp_path))
    with torch.no_grad():
        model.net[0].weight.add_(0.5)
    out = _again(model, x, _opts(tmp_path))
    stats = rtx_backend.stats()
    assert stats["graph_cache_misses"] == 1 and stats["engine_builds"] == 1
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)


def test_the_region_engine_keys_do_not_change(tmp_path):
    """The engine keys reuse the graph key's weight digests: without the graph entry, the
    engine-cache entries that it wrote are hits."""
    model, x = eval_model(ConvNet()), torch.randn(2, 3, 16, 16)
    compile_and_run(model, x, **_opts(tmp_path))
    for path in _files(tmp_path, ".graph"):
        path.unlink()
    _again(model, x, _opts(tmp_path))
    stats = rtx_backend.stats()
    assert stats["graph_cache_misses"] == 1 and stats["engine_cache_hits"] == 1 and "engine_builds" not in stats


def test_key_covers_shapes_modes_options_and_weights(tmp_path):
    def key(model, x, options=None, **flags):
        graphs: list = []

        def backend(gm, example_inputs):
            graphs.append(_graph_cache.graph_key(gm, example_inputs, Options.from_dict(options or {"target_compute_capabilities": SM86})))
            return gm.forward

        torch._dynamo.reset()
        with torch.no_grad():
            if flags.get("autocast"):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    torch.compile(model, backend=backend)(x)
            else:
                torch.compile(model, backend=backend, dynamic=flags.get("dynamic", False))(x)
        return graphs[0].name

    torch.manual_seed(0)
    a, b = eval_model(MLP()), eval_model(MLP())
    base = key(a, torch.randn(2, 16))
    assert base == key(a, torch.randn(2, 16))  # other values, same spec
    assert base != key(b, torch.randn(2, 16))  # other weights
    assert base != key(a, torch.randn(3, 16))
    assert base != key(a, torch.randn(2, 16, dtype=torch.float64).float()[:, :16].t().contiguous().t())  # strides
    assert base != key(a, torch.randn(2, 16), autocast=True)
    assert base != key(a, torch.randn(2, 16), dynamic=True)
    assert base != key(a, torch.randn(2, 16), {"target_compute_capabilities": SM86, "min_block_size": 3})
    assert base != key(a, torch.randn(2, 16), {"target_compute_capabilities": [(8, 9)]})
    assert base == key(a, torch.randn(2, 16), {"target_compute_capabilities": SM86, "engine_cache_dir": "elsewhere"})


@pytest.mark.parametrize("damage", ["truncate", "garble", "foreign"])
def test_damaged_entry_is_a_warning_a_compile_and_a_rewrite(tmp_path, caplog, damage):
    model, x = eval_model(ConvNet()), torch.randn(2, 3, 16, 16)
    expected = compile_and_run(model, x, **_opts(tmp_path))
    path = _files(tmp_path, ".graph")[0]
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garble":
        path.write_bytes(data[:-40] + bytes(b ^ 0x5A for b in data[-40:]))
    else:
        path.write_bytes(b"not a graph cache entry at all")
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        out = _again(model, x, _opts(tmp_path))
    assert "graph cache entry" in caplog.text and "unusable" in caplog.text
    assert rtx_backend.stats()["graph_cache_misses"] == 1
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    store.flush()
    assert path.read_bytes() == data  # written again by the full compile
    _again(model, x, _opts(tmp_path))
    assert rtx_backend.stats()["graph_cache_hits"] == 1


def test_a_hit_reads_its_engines_while_it_unpickles_its_graph(tmp_path, monkeypatch):
    """The engine entries named by the graph entry's header are read on the cache's reader
    threads, begun before the graph's payload is unpickled; each is accounted once."""
    model, x = eval_model(WithEagerOp()), torch.randn(3, 16)
    options = _opts(tmp_path, torch_executed_ops=["aten.sigmoid.default"])
    first = compile_and_run(model, x, **options)
    assert len(_LAST[0].plan.regions) == 2
    events: list[str] = []
    readers: list[str] = []
    fetch_ahead, unpickle, fetch = _engine_cache.fetch_ahead, _graph_cache._Unpickler.load, _engine_cache.EngineCache.fetch

    def spy_fetch_ahead(cache, keys):
        events.append(f"fetch_ahead {len(keys)}")
        return fetch_ahead(cache, keys)

    def spy_unpickle(self):
        events.append("unpickle")
        return unpickle(self)

    def spy_fetch(self, key):
        readers.append(threading.current_thread().name)
        return fetch(self, key)

    monkeypatch.setattr(_engine_cache, "fetch_ahead", spy_fetch_ahead)
    monkeypatch.setattr(_graph_cache._Unpickler, "load", spy_unpickle)
    monkeypatch.setattr(_engine_cache.EngineCache, "fetch", spy_fetch)
    second = _again(model, x, options)
    stats = rtx_backend.stats()
    assert stats["graph_cache_hits"] == 1 and stats["engine_cache_hits"] == 2 and "engine_cache_misses" not in stats
    assert events == ["fetch_ahead 2", "unpickle"]
    assert len(readers) == 2 and all(name.startswith("trtrtx-cache-read") for name in readers)
    torch.testing.assert_close(second, first, rtol=0, atol=0)


def test_a_hit_without_reader_threads_reads_its_engines_in_turn(tmp_path, monkeypatch):
    """When no thread can be started (the interpreter is exiting), the hit loads its engines on
    the calling thread."""
    model, x = eval_model(ConvNet()), torch.randn(2, 3, 16, 16)
    first = compile_and_run(model, x, **_opts(tmp_path))

    def no_threads(cache, keys):
        raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    monkeypatch.setattr(_engine_cache, "fetch_ahead", no_threads)
    second = _again(model, x, _opts(tmp_path))
    stats = rtx_backend.stats()
    assert stats["graph_cache_hits"] == 1 and stats["engine_cache_hits"] == 1 and "engine_builds" not in stats
    torch.testing.assert_close(second, first, rtol=0, atol=0)


def test_an_engine_read_ahead_that_fails_its_check_is_rebuilt(tmp_path, caplog):
    """A damaged engine entry found by the read ahead of a graph-cache hit: a warning, a build."""
    model, x = eval_model(ConvNet()), torch.randn(2, 3, 16, 16)
    expected = compile_and_run(model, x, **_opts(tmp_path))
    (engine,) = _files(tmp_path, ".engine")
    data = engine.read_bytes()
    engine.write_bytes(data[:-40] + bytes(b ^ 0x5A for b in data[-40:]))
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        out = _again(model, x, _opts(tmp_path))
    assert "engine cache entry" in caplog.text and "checksum" in caplog.text
    assert rtx_backend.stats()["engine_builds"] == 1
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_a_damaged_graph_entry_does_not_count_the_engines_it_read_ahead(tmp_path):
    """Engines read ahead for a graph entry whose payload then fails its check are not hits: the
    compile that follows loads (and counts) them itself."""
    model, x = eval_model(ConvNet()), torch.randn(2, 3, 16, 16)
    compile_and_run(model, x, **_opts(tmp_path))
    path = _files(tmp_path, ".graph")[0]
    data = path.read_bytes()
    path.write_bytes(data[:-40] + bytes(b ^ 0x5A for b in data[-40:]))  # the header checks out
    _again(model, x, _opts(tmp_path))
    stats = rtx_backend.stats()
    assert stats["graph_cache_misses"] == 1 and stats["engine_cache_hits"] == 1 and "engine_builds" not in stats


def test_payload_that_unpickles_wrong_is_rejected(tmp_path, caplog):
    """A header that checks out over a payload that is not a compiled graph: a warning, not a crash."""
    model, x = eval_model(MLP()), torch.randn(2, 16)
    expected = compile_and_run(model, x, **_opts(tmp_path))
    path = _files(tmp_path, ".graph")[0]
    header = _header(path.read_bytes())
    bad = pickle.dumps({"graph_module": None})
    header["payload"] = {"size": len(bad), "sha256": hashlib.sha256(bad).hexdigest()}
    header.pop("header_sha256")
    path.write_bytes(b"".join([*store.framed_header(_graph_cache.MAGIC, header), bad]))
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        out = _again(model, x, _opts(tmp_path))
    assert "cannot be rebuilt" in caplog.text
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def _header(data: bytes) -> dict:
    start = len(_graph_cache.MAGIC) + 8
    size = int.from_bytes(data[len(_graph_cache.MAGIC):start], "little")
    return json.loads(data[start:start + size])


def test_missing_engine_means_a_full_compile(tmp_path):
    model, x = eval_model(ConvNet()), torch.randn(2, 3, 16, 16)
    expected = compile_and_run(model, x, **_opts(tmp_path))
    for path in _files(tmp_path, ".engine"):
        path.unlink()  # evicted, or deleted by the user
    out = _again(model, x, _opts(tmp_path))
    stats = rtx_backend.stats()
    assert stats["graph_cache_misses"] == 1 and stats["engine_builds"] == 1
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_a_region_left_in_pytorch_is_not_cached(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("no executor today")

    monkeypatch.setattr(_region, "choose_executor", fail)
    model, x = eval_model(MLP()), torch.randn(2, 16)
    out = compile_and_run(model, x, **_opts(tmp_path))
    assert [r.kind for r in regions()] == ["pytorch"]
    assert "graph_cache_stores" not in rtx_backend.stats() and not _files(tmp_path, ".graph")
    torch.testing.assert_close(out, model(x))


def test_no_graph_cache_without_engine_cache_or_with_onnx_dumps(tmp_path):
    model, x = eval_model(MLP()), torch.randn(2, 16)
    compile_and_run(model, x, **_opts(tmp_path, engine_cache_dir=""))
    assert not any(k.startswith("graph_cache") for k in rtx_backend.stats())
    _again(model, x, _opts(tmp_path, dump_onnx_dir=str(tmp_path / "dump")))
    assert not any(k.startswith("graph_cache") for k in rtx_backend.stats())
    assert list((tmp_path / "dump").glob("*.onnx"))


def test_dynamic_graph_hit_runs_other_sizes_without_recompiles(tmp_path):
    model = eval_model(MLP())
    options = _opts(tmp_path)

    def run(batches):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="trtrtx", options=options, dynamic=True)
        with torch.no_grad():
            outs = [compiled(torch.ones(b, 16) * b / 7) for b in batches]
        store.flush()
        return outs

    run([3])
    rtx_backend.reset_stats()
    outs = run([5, 9, 3])
    stats = rtx_backend.stats()
    assert stats["graph_cache_hits"] == 1 and stats["backend_calls"] == 1
    for b, out in zip([5, 9, 3], outs):
        torch.testing.assert_close(out, model(torch.ones(b, 16) * b / 7), rtol=1e-4, atol=1e-5)


def test_a_compile_that_adds_size_guards_is_not_cached(tmp_path, monkeypatch):
    """Dynamo guards the compiled graph on what lowering learnt about the symbolic sizes; a hit
    would skip the lowering, and with it those guards."""
    compile_graph = _reuse.compile_graph

    def guarding(aten_gm, args, *rest, **kw):
        for node in aten_gm.graph.nodes:
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor) and val.dim() and isinstance(val.shape[0], torch.SymInt):
                assert not bool(val.shape[0] > 4)  # as a size-dependent decomposition would
                break
        return compile_graph(aten_gm, args, *rest, **kw)

    monkeypatch.setattr(_reuse, "compile_graph", guarding)
    model = eval_model(MLP())
    compiled = torch.compile(model, backend="trtrtx", options=_opts(tmp_path), dynamic=True)
    with torch.no_grad():
        out = compiled(torch.ones(3, 16))
    store.flush()
    assert rtx_backend.stats()["engine_builds"] == 1 and not _files(tmp_path, ".graph")
    torch.testing.assert_close(out, model(torch.ones(3, 16)), rtol=1e-4, atol=1e-5)
    monkeypatch.setattr(_reuse, "compile_graph", compile_graph)
    _again(model, torch.ones(3, 16), _opts(tmp_path))  # no size guard: stored
    assert rtx_backend.stats().get("graph_cache_stores") == 1


_CHILD = textwrap.dedent("""
    import json, sys, torch, rtx_backend
    sys.path.insert(0, {root!r})
    from tests.models import ConvNet, eval_model
    torch.manual_seed(0)
    model, x = eval_model(ConvNet()), torch.linspace(-1, 1, 2 * 3 * 16 * 16).reshape(2, 3, 16, 16)
    compiled = torch.compile(model, backend="trtrtx", options={{
        "target_compute_capabilities": [(8, 6)], "engine_cache_dir": {cache!r}, "min_block_size": 1}})
    with torch.no_grad():
        out = compiled(x)
    print(json.dumps({{"stats": rtx_backend.stats(), "out": out.flatten()[:8].tolist(),
                       "error": (out - model(x)).abs().max().item()}}))
""")


def test_hit_in_a_fresh_process(tmp_path):
    code = _CHILD.format(root=str(ROOT), cache=str(tmp_path / "engines"))
    env = {**os.environ, "RTX_BACKEND_CACHE_DIR": str(tmp_path / "cache")}
    runs = []
    for _ in range(2):
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
        assert res.returncode == 0, res.stderr[-2000:]
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    assert runs[0]["stats"]["graph_cache_stores"] == 1 and runs[1]["stats"]["graph_cache_hits"] == 1
    assert runs[0]["out"] == runs[1]["out"] and runs[1]["error"] < 1e-5


@pytest.mark.gpu
def test_gpu_hit_in_a_fresh_process_skips_validation(tmp_path):
    code = textwrap.dedent(f"""
        import json, sys, time, torch, rtx_backend
        sys.path.insert(0, {str(ROOT)!r})
        from tests.models import ConvNet, eval_model
        torch.manual_seed(0)
        model = eval_model(ConvNet(), torch.float16, "cuda")
        x = torch.linspace(-1, 1, 2 * 3 * 16 * 16, device="cuda", dtype=torch.float16).reshape(2, 3, 16, 16)
        compiled = torch.compile(model, backend="trtrtx", options={{
            "engine_cache_dir": {str(tmp_path / "engines")!r}, "min_block_size": 1,
            "runtime_cache_path": {str(tmp_path / "runtime.cache")!r}}})
        t = time.perf_counter()
        with torch.no_grad():
            out = compiled(x)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t
        rtx_backend.save_runtime_cache()
        print(json.dumps({{"stats": rtx_backend.stats(), "seconds": seconds,
                           "error": (out - model(x)).abs().max().item()}}))
    """)
    runs = []
    for _ in range(3):
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    print("graph cache, fresh processes:", [(round(r["seconds"], 3), r["stats"]) for r in runs])
    assert runs[0]["stats"]["graph_cache_stores"] == 1 and runs[0]["stats"]["validations"] == 1
    assert runs[1]["stats"]["graph_cache_hits"] == 1 and runs[2]["stats"]["graph_cache_hits"] == 1
    assert runs[2]["stats"]["validations_skipped"] == 1 and "validations" not in runs[2]["stats"]
    assert all(r["error"] < 1e-2 for r in runs)


# ---- trust: nothing unpickled from a file this user did not write --------------------------------


class _RunsCode:
    """What a planted pickle holds: unpickling it runs a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant(path: Path, payload: bytes, sign_with: bytes | None = None) -> None:
    """Replace a graph entry's payload, its checksums recomputed (what anyone who can write to the
    directory can do); `sign_with`: also sign it with that key (the attacker's own key by default)."""
    header = _header(path.read_bytes())
    header["payload"] = {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    key = sign_with if sign_with is not None else b"an attacker's key".ljust(32, b"!")
    path.write_bytes(b"".join([*store.framed_header(_graph_cache.MAGIC, header, key), payload]))


def test_a_planted_graph_entry_does_not_run_its_code(tmp_path, caplog):
    """A real header, a payload whose pickle runs a command before the real graph, checksums
    recomputed: a miss with a warning, the command never runs, the result is right."""
    model, x = eval_model(MLP()), torch.randn(2, 16)
    expected = compile_and_run(model, x, **_opts(tmp_path))
    path = _files(tmp_path, ".graph")[0]
    marker = tmp_path / "the-planted-code-ran"
    data = path.read_bytes()
    real = bytes(memoryview(data)[len(data) - _header(data)["payload"]["size"]:])
    _plant(path, pickle.dumps([_RunsCode(marker)])[:-1] + real)  # the stealthy variant: the real graph follows
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        out = _again(model, x, _opts(tmp_path))
    assert not marker.exists()
    assert "not signed with your cache key" in caplog.text
    assert rtx_backend.stats()["graph_cache_misses"] == 1
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_a_signed_graph_entry_naming_other_code_is_refused(tmp_path, caplog):
    """Defence in depth behind the signature: the unpickler takes only what compiled graphs hold."""
    from rtx_backend import _trust

    model, x = eval_model(MLP()), torch.randn(2, 16)
    expected = compile_and_run(model, x, **_opts(tmp_path))
    path = _files(tmp_path, ".graph")[0]
    marker = tmp_path / "the-planted-code-ran"
    _plant(path, pickle.dumps({"graph_module": _RunsCode(marker)}), sign_with=_trust.secret())
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        out = _again(model, x, _opts(tmp_path))
    assert not marker.exists()
    assert "system, which no compiled graph holds" in caplog.text
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_graph_entries_of_real_graphs_name_only_allowed_globals(tmp_path):
    """What adopt-cache's opcode scan and the load's allow-list accept covers what we write."""
    for model, x in ((eval_model(ConvNet()), torch.randn(2, 3, 16, 16)), (eval_model(WithEagerOp()), torch.randn(2, 16))):
        torch._dynamo.reset()
        compile_and_run(model, x, **_opts(tmp_path))
    entries = _files(tmp_path, ".graph")
    assert len(entries) == 2
    for path in entries:
        data = path.read_bytes()
        payload = data[len(data) - _header(data)["payload"]["size"]:]
        assert _graph_cache.scan_globals(payload) == []


def test_a_graph_entry_that_is_a_fifo_is_a_miss_not_a_hang(tmp_path, caplog):
    model, x = eval_model(MLP()), torch.randn(2, 16)
    compile_and_run(model, x, **_opts(tmp_path))
    path = _files(tmp_path, ".graph")[0]
    path.unlink()
    os.mkfifo(path)
    done: list = []
    thread = threading.Thread(target=lambda: done.append(_again(model, x, _opts(tmp_path))), daemon=True)
    thread.start()
    thread.join(120)
    assert done, "the compile blocked on a FIFO in the graph cache"
    assert "is a FIFO, not a regular file" in caplog.text
