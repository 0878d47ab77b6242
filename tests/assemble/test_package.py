"""rtx_backend.save / load: a .pt2 of the compiled model that runs with no trace, export or build.

On this CPU machine the ONNX Runtime path runs (the engines are built for declared targets and
shipped); the GPU tests load and run the engines on TensorRT-RTX."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

import rtx_backend
from rtx_backend import PackageError, RuntimeUnavailableError, _targets, _trt
from rtx_backend.assemble import package as _package

TARGETS = [(8, 6), (8, 9)]
ROOT = Path(__file__).resolve().parents[2]


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.relu(self.conv2(y)) + y
        return self.fc(y.mean((2, 3))).softmax(-1)


def net() -> Net:
    torch.manual_seed(0)
    return Net().eval()


OPTIONS = {"target_compute_capabilities": TARGETS, "min_block_size": 1, "engine_cache_dir": None}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("pkg") / "net.pt2"
    info = rtx_backend.save(net(), (torch.randn(4, 3, 16, 16),), path, options=OPTIONS)
    return path, info


@pytest.fixture(scope="module")
def saved_dynamic(tmp_path_factory):
    path = tmp_path_factory.mktemp("pkg") / "dyn.pt2"
    rtx_backend.save(net(), (torch.randn(4, 3, 16, 16),), path, options=OPTIONS,
                     dynamic_shapes={"x": {0: (1, 4, 8)}})
    return path


def check(module, x, model=None):
    with torch.no_grad():
        ref = (model or net())(x)
        out = module(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_round_trip_static_matches_eager(saved):
    path, info = saved
    module = rtx_backend.load(path)
    check(module, torch.randn(4, 3, 16, 16))
    assert info.regions and info.engine_bytes > 0 and info.onnx_bytes > 0
    # the weights are in the engines and the ONNX models, not a third time as parameters
    assert info.size < (info.engine_bytes + info.onnx_bytes) * 1.05 + 64 * 1024
    assert not [n for n, _ in module.named_buffers() if "plan" in n or "onnx" in n]
    assert not list(module.named_parameters())


def test_round_trip_dynamic_matches_eager_inside_and_outside_the_profile(saved_dynamic):
    module = rtx_backend.load(saved_dynamic)
    for batch in (4, 1, 3, 8, 13):  # 13: outside the declared range; ONNX Runtime runs any shape
        check(module, torch.randn(batch, 3, 16, 16))
    meta = _metas(saved_dynamic)[0]
    (lo, opt, hi), = meta["profile"].values()
    assert (lo[0], opt[0], hi[0]) == (1, 4, 8)


def test_torch_export_load_runs_it_after_import_rtx_backend(saved):
    path, _ = saved
    module = torch.export.load(str(path)).module()
    check(module, torch.randn(4, 3, 16, 16))
    assert "trtrtx.engine" in module.code


def test_a_fresh_process_loads_without_the_compiler_and_with_plain_torch_export_load(saved):
    path, _ = saved
    code = (
        "import sys, torch, rtx_backend\n"
        f"m = rtx_backend.load({str(path)!r}); y = m(torch.randn(4, 3, 16, 16)); print(tuple(y.shape))\n"
        "heavy = ['torch._dynamo', 'torch._functorch.aot_autograd', 'torch.onnx._internal.exporter', 'sympy']\n"
        "print([h for h in heavy if h in sys.modules])\n"
        f"m = torch.export.load({str(path)!r}).module()\n"
        "y = m(torch.randn(4, 3, 16, 16)); print(tuple(y.shape))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["(4, 5)", "[]", "(4, 5)"], out.stdout


def test_import_rtx_backend_does_not_import_the_compiler():
    code = ("import sys, torch; before = set(sys.modules); import rtx_backend\n"
            "heavy = ['torch._dynamo', 'torch._functorch.aot_autograd', 'torch.onnx._internal.exporter', 'onnxscript']\n"
            "print([m for m in heavy if m in sys.modules and m not in before])\n"
            "rtx_backend.load; print(torch.ops.trtrtx.engine.default)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[0] == "[]", out.stdout
    assert "trtrtx.engine" in out.stdout


def test_the_compiler_is_still_there_on_first_use():
    assert callable(rtx_backend.trtrtx) and callable(rtx_backend.save) and callable(rtx_backend.explain)
    assert {"save", "load", "trtrtx", "explain"} <= set(dir(rtx_backend))
    with pytest.raises(AttributeError):
        rtx_backend.no_such_name  # noqa: B018


def _copy(path, tmp_path, name="copy.pt2"):
    target = tmp_path / name
    target.write_bytes(Path(path).read_bytes())
    return target


def _rewrite(path, target, change):
    """The archive with `change(member name, data) -> data` applied to its members."""
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(target, "w") as dst:
        for item in src.infolist():
            dst.writestr(item, change(item.filename, src.read(item.filename)))
    return target


def _metas(path):
    module = torch.export.load(str(path)).module()
    return [json.loads(n.args[2]) for n in module.graph.nodes if n.target is torch.ops.trtrtx.engine.default]


def test_truncated_archive_is_a_clear_error(saved, tmp_path):
    path, _ = saved
    data = Path(path).read_bytes()
    for size in (0, 100, len(data) // 2, len(data) - 10):
        target = tmp_path / f"t{size}.pt2"
        target.write_bytes(data[:size])
        with pytest.raises(PackageError, match=r"truncated|cannot be read"):
            rtx_backend.load(target)


def test_altered_member_is_refused_before_torch_export_load(saved, tmp_path, monkeypatch):
    path, _ = saved
    called = []
    monkeypatch.setattr(torch.export, "load", lambda *a, **k: called.append(a))

    def flip(name, data):
        return bytes([data[0] ^ 1]) + data[1:] if name.endswith("weights/weight_0") else data

    with pytest.raises(PackageError, match="altered"):
        rtx_backend.load(_rewrite(path, tmp_path / "flip.pt2", flip))
    with pytest.raises(PackageError, match="altered"):
        rtx_backend.load(_rewrite(path, tmp_path / "manifest.pt2", lambda n, d: d.replace(b'"format": 1', b'"format": 1 ') if n.endswith("trtrtx.json") else d.replace(b"relu", b"tanh")))
    assert called == []


def test_a_pt2_we_did_not_write_is_refused(tmp_path):
    path = tmp_path / "plain.pt2"
    torch.export.save(torch.export.export(net(), (torch.randn(2, 3, 8, 8),)), str(path))
    with pytest.raises(PackageError, match=r"not a package saved by rtx_backend\.save"):
        rtx_backend.load(path)
    (tmp_path / "text.pt2").write_text("hello")
    with pytest.raises(PackageError, match="cannot be read"):
        rtx_backend.load(tmp_path / "text.pt2")


def test_signed_package_checks_the_key(tmp_path):
    path = tmp_path / "signed.pt2"
    rtx_backend.save(net(), (torch.randn(2, 3, 8, 8),), path, options={**OPTIONS, "runtime": "onnxruntime"}, key=b"k" * 32)
    check(rtx_backend.load(path, key=b"k" * 32), torch.randn(2, 3, 8, 8))
    with pytest.raises(PackageError, match="not signed with the given key"):
        rtx_backend.load(path, key=b"x" * 32)


def test_engine_bytes_are_checked_when_the_op_runs(saved):
    path, _ = saved
    module = torch.export.load(str(path)).module()
    plan = next(b for n, b in module.named_buffers() if n.endswith("_plan"))
    plan[0] ^= 1  # the buffer changed after loading: the op's first call refuses it
    with pytest.raises(PackageError, match="not the one the package was saved with"):
        module(torch.randn(4, 3, 16, 16))


def test_other_tensorrt_rtx_version_runs_in_onnx_runtime_or_raises(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(_trt, "version", lambda: "1.6.1")
    with_onnx, without = tmp_path / "a.pt2", tmp_path / "b.pt2"
    rtx_backend.save(net(), (torch.randn(2, 3, 8, 8),), with_onnx, options=OPTIONS)
    rtx_backend.save(net(), (torch.randn(2, 3, 8, 8),), without, options=OPTIONS, onnx=False)
    monkeypatch.undo()
    assert _package.verify(with_onnx)["tensorrt_rtx"] == "1.6.1"
    _package._WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        check(rtx_backend.load(with_onnx), torch.randn(2, 3, 8, 8))
    assert "built by TensorRT-RTX 1.6.1" in caplog.text and "ONNX Runtime" in caplog.text
    with pytest.raises(RuntimeUnavailableError, match=r"1\.6\.1"):
        rtx_backend.load(with_onnx, options={"runtime": "tensorrt_rtx"})
    with pytest.raises(PackageError, match=r"1\.6\.1.*without its ONNX models"):
        rtx_backend.load(without)


def test_other_targets_are_named(monkeypatch):
    info = {"plan": {"size": 1}, "tensorrt_rtx": _trt.version() if _trt.available() else None, "targets": TARGETS}
    if not _trt.available():
        pytest.skip("TensorRT-RTX is not importable")
    monkeypatch.setattr(_targets, "current_capability", lambda: (12, 0))
    monkeypatch.setattr(_targets, "no_cuda_reason", lambda: None)
    why = _package.why_not_tensorrt(info, torch.device("cuda", 0))
    assert why is not None and "SM8.6, SM8.9" in why and "SM12.0" in why
    monkeypatch.setattr(_targets, "current_capability", lambda: (8, 9))
    assert _package.why_not_tensorrt(info, torch.device("cuda", 0)) is None


def test_without_onnx_a_shape_outside_the_profile_is_a_clear_error():
    region = _package.region_specs({"region": json.loads(json.dumps(_region_json())), "name": "r"})
    stand_in = _package._NoPyTorch("r", region, lambda args: f"region r has no engine for {tuple(args[0].shape)}")
    with pytest.raises(PackageError, match=r"no engine for \(3, 2\)"):
        stand_in(torch.randn(3, 2))


def _region_json():
    from rtx_backend._types import OnnxRegion, TensorSpec
    from rtx_backend.cache.engines import _region_to_json

    spec = TensorSpec("input_0", ("s0", 2), torch.float32, (4, 2))
    return _region_to_json(OnnxRegion(b"", (0,), (spec,), (TensorSpec("output_0", ("s0", 2), torch.float32, (4, 2)),)))


def test_fake_kernel_gives_shapes_from_the_inputs_symbols():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from rtx_backend._types import OnnxRegion, TensorSpec
    from rtx_backend.cache.engines import _region_to_json

    specs = (TensorSpec("input_0", ("s0", "s1", 4), torch.float16, (2, 3, 4)),)
    outs = (TensorSpec("output_0", ("s0*s1", "(s0//2)", 4), torch.float16, (6, 1, 4)),
            TensorSpec("output_1", ("Max(1,s0)+2", 1), torch.float32, (4, 1)))
    meta = json.dumps({"format": 1, "name": "r", "region": _region_to_json(OnnxRegion(b"", (0,), specs, outs)),
                       "profile": {}, "plan": {}, "onnx": {}, "options": {}})
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        x = mode.from_tensor(torch.empty(6, 5, 4, dtype=torch.float16))
        a, b = _package._engine_fake(torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.uint8), meta, [x])
    assert tuple(a.shape) == (30, 3, 4) and a.dtype == torch.float16
    assert tuple(b.shape) == (8, 1) and b.dtype == torch.float32


def test_loading_touches_no_cache(saved, tmp_path):
    path, _ = saved
    root = Path(__import__("os").environ["RTX_BACKEND_CACHE_DIR"])
    before = sorted(p for p in root.rglob("*")) if root.exists() else []
    module = rtx_backend.load(path)
    check(module, torch.randn(4, 3, 16, 16))
    rtx_backend.stats()
    after = sorted(p for p in root.rglob("*")) if root.exists() else []
    assert after == before
    counts = rtx_backend.stats()
    assert not any(counts.get(k) for k in ("engine_cache_hits", "engine_cache_misses", "graph_cache_hits",
                                           "engine_builds"))


def test_options_that_do_not_apply_to_a_package_are_refused(saved):
    path, _ = saved
    with pytest.raises(PackageError, match="do not apply"):
        rtx_backend.load(path, options={"min_block_size": 3})


def test_save_rejects_a_training_model_and_non_tensor_inputs(tmp_path):
    with pytest.raises(PackageError, match="eval"):
        rtx_backend.save(Net().train(), (torch.randn(2, 3, 8, 8),), tmp_path / "x.pt2", options=OPTIONS)
    with pytest.raises(PackageError, match="tuple of tensors"):
        rtx_backend.save(net(), (torch.randn(2, 3, 8, 8), 3), tmp_path / "x.pt2", options=OPTIONS)


# ---- on a GPU that TensorRT-RTX runs -----------------------------------------------------------


def _gpu_targets():
    return None  # this GPU (ComputeCapability.CURRENT): the H200 (SM 9.0) is no declared target


@pytest.mark.gpu
def test_gpu_package_runs_on_tensorrt_rtx_and_widens(tmp_path):
    model = net().cuda().half()
    x = torch.randn(4, 3, 16, 16, device="cuda", dtype=torch.half)
    path = tmp_path / "gpu.pt2"
    rtx_backend.save(model, (x,), path, options={"min_block_size": 1, "engine_cache_dir": None,
                                                 "target_compute_capabilities": _gpu_targets()},
                     dynamic_shapes={"x": {0: (1, 4, 8)}})
    module = rtx_backend.load(path)
    kinds = [m.kind for m in module.modules() if hasattr(m, "executor")]
    assert kinds and set(kinds) == {"tensorrt_rtx"}, kinds
    with torch.no_grad():
        for batch in (4, 2, 8, 16):  # 16: outside the profile, a wider engine is built from the ONNX model
            xb = torch.randn(batch, 3, 16, 16, device="cuda", dtype=torch.half)
            torch.testing.assert_close(module(xb).float(), model(xb).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_gpu_fresh_process_runs_the_package_on_tensorrt_rtx_without_the_compiler(tmp_path):
    model = net().cuda().half()
    x = torch.randn(4, 3, 16, 16, device="cuda", dtype=torch.half)
    path = tmp_path / "gpu.pt2"
    rtx_backend.save(model, (x,), path, options={"min_block_size": 1, "engine_cache_dir": None,
                                                 "target_compute_capabilities": _gpu_targets()})
    code = (
        "import sys, torch, rtx_backend\n"
        "x = torch.randn(4, 3, 16, 16, device='cuda', dtype=torch.half)\n"
        f"m = rtx_backend.load({str(path)!r})\n"
        "print(sorted({r.kind for r in m.modules() if hasattr(r, 'executor')}))\n"
        "y = m(x); torch.cuda.synchronize(); print(tuple(y.shape))\n"
        "heavy = ['torch._dynamo', 'torch._functorch.aot_autograd', 'torch.onnx._internal.exporter', 'sympy']\n"
        "print([h for h in heavy if h in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["['tensorrt_rtx']", "(4, 5)", "[]"], out.stdout


@pytest.mark.gpu
def test_gpu_package_without_onnx_refuses_shapes_outside_the_profile(tmp_path):
    model = net().cuda().half()
    x = torch.randn(4, 3, 16, 16, device="cuda", dtype=torch.half)
    path = tmp_path / "gpu.pt2"
    rtx_backend.save(model, (x,), path, onnx=False, dynamic_shapes={"x": {0: (1, 4, 8)}},
                     options={"min_block_size": 1, "engine_cache_dir": None,
                              "target_compute_capabilities": _gpu_targets()})
    module = rtx_backend.load(path)
    with torch.no_grad():
        module(x)
        with pytest.raises(PackageError, match="onnx=False"):
            module(torch.randn(16, 3, 16, 16, device="cuda", dtype=torch.half))


@pytest.mark.gpu
def test_gpu_package_steady_state_latency_matches_the_compiled_model(tmp_path):
    model = net().cuda().half()
    x = torch.randn(8, 3, 16, 16, device="cuda", dtype=torch.half)
    options = {"min_block_size": 1, "target_compute_capabilities": _gpu_targets()}
    path = tmp_path / "gpu.pt2"
    rtx_backend.save(model, (x,), path, options={**options, "engine_cache_dir": None})
    loaded = rtx_backend.load(path)
    compiled = torch.compile(model, backend="trtrtx", options={**options, "weights": "frozen"})

    def median_us(fn):
        with torch.inference_mode():
            for _ in range(20):
                fn(x)
            torch.cuda.synchronize()
            times = []
            for _ in range(200):
                start = time.perf_counter()
                fn(x)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
        return sorted(times)[len(times) // 2] * 1e6

    package, reference = median_us(loaded), median_us(compiled)
    assert package < reference * 1.25 + 20, (package, reference)


class Mixed(torch.nn.Module):
    """Regions with PyTorch between them (relu kept there) and sizes computed from the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(12, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        h = torch.relu(self.a(x.reshape(x.shape[0], -1)) * 2.0)
        out = self.b(h).sigmoid() + 1.0
        return out, {"h": h.reshape(-1, 4, 4)[:, 1] + y}


def test_mixed_graph_with_dynamic_sizes_and_nested_outputs(tmp_path):
    torch.manual_seed(0)
    model = Mixed().eval()
    x, y = torch.randn(5, 3, 4), torch.randn(1, 4)
    path = tmp_path / "mixed.pt2"
    saved = rtx_backend.save(model, (x, y), path, dynamic_shapes={"x": {0: (1, 5, 64)}},
                             options={**OPTIONS, "torch_executed_ops": ["aten.relu"]})
    assert saved.eager_ops >= 1 and len(saved.regions) == 2
    assert _package.verify(path)["graph"] is not None  # load rebuilds it without torch.export.load
    for module in (rtx_backend.load(path), torch.export.load(str(path)).module()):
        for batch in (5, 2, 9):
            xb = torch.randn(batch, 3, 4)
            with torch.no_grad():
                (out, rest), (ref, ref_rest) = module(xb, y), model(xb, y)
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(rest["h"], ref_rest["h"], rtol=1e-4, atol=1e-5)
    with pytest.raises(PackageError, match=r"argument 0 must be a torch\.float32 tensor"):
        rtx_backend.load(path)(torch.randn(5, 3, 5), y)
