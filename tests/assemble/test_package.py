"""rtx_backend.load: a .pt2 of the compiled model that runs with no trace, export or build.

On this CPU machine the ONNX Runtime path runs (the engines are built for declared targets and
shipped); the GPU tests load and run the engines on TensorRT-RTX."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import rtx_backend
from rtx_backend import PackageError
from rtx_backend.assemble import package_archive as _archive

from .packages import OPTIONS, Net, check, metas, net


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
    meta = metas(saved_dynamic)[0]
    (lo, opt, hi), = meta["profile"].values()
    assert (lo[0], opt[0], hi[0]) == (1, 4, 8)


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


def _gpu_package(tmp_path, batch=4, **save_kwargs):
    """The test net in FP16 on the GPU, an input of `batch`, and the path of its package, saved
    for this GPU (`save_kwargs`: onnx, dynamic_shapes)."""
    model = net().cuda().half()
    x = torch.randn(batch, 3, 16, 16, device="cuda", dtype=torch.half)
    path = tmp_path / "gpu.pt2"
    rtx_backend.save(model, (x,), path, options={"min_block_size": 1, "engine_cache_dir": None,
                                                 "target_compute_capabilities": _gpu_targets()}, **save_kwargs)
    return model, x, path


@pytest.mark.gpu
def test_gpu_package_runs_on_tensorrt_rtx_and_widens(tmp_path):
    model, _, path = _gpu_package(tmp_path, dynamic_shapes={"x": {0: (1, 4, 8)}})
    module = rtx_backend.load(path)
    kinds = [m.kind for m in module.modules() if hasattr(m, "executor")]
    assert kinds and set(kinds) == {"tensorrt_rtx"}, kinds
    with torch.no_grad():
        for batch in (4, 2, 8, 16):  # 16: outside the profile, a wider engine is built from the ONNX model
            xb = torch.randn(batch, 3, 16, 16, device="cuda", dtype=torch.half)
            torch.testing.assert_close(module(xb).float(), model(xb).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_gpu_fresh_process_runs_the_package_on_tensorrt_rtx_without_the_compiler(tmp_path):
    _, _, path = _gpu_package(tmp_path)
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
    _, x, path = _gpu_package(tmp_path, onnx=False, dynamic_shapes={"x": {0: (1, 4, 8)}})
    module = rtx_backend.load(path)
    with torch.no_grad():
        module(x)
        with pytest.raises(PackageError, match="onnx=False"):
            module(torch.randn(16, 3, 16, 16, device="cuda", dtype=torch.half))


@pytest.mark.gpu
def test_gpu_package_steady_state_latency_matches_the_compiled_model(tmp_path):
    model, x, path = _gpu_package(tmp_path, batch=8)
    loaded = rtx_backend.load(path)
    compiled = torch.compile(model, backend="trtrtx", options={
        "min_block_size": 1, "target_compute_capabilities": _gpu_targets(), "weights": "frozen"})

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
    assert _archive.verify(path)["graph"] is not None  # load rebuilds it without torch.export.load
    for module in (rtx_backend.load(path), torch.export.load(str(path)).module()):
        for batch in (5, 2, 9):
            xb = torch.randn(batch, 3, 4)
            with torch.no_grad():
                (out, rest), (ref, ref_rest) = module(xb, y), model(xb, y)
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(rest["h"], ref_rest["h"], rtol=1e-4, atol=1e-5)
    with pytest.raises(PackageError, match=r"argument 0 must be a torch\.float32 tensor"):
        rtx_backend.load(path)(torch.randn(5, 3, 5), y)
