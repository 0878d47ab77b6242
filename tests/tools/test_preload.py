"""rtx_backend.preload(): the first compile's one-time costs, paid up front (in a fresh process,
where nothing is imported or indexed yet)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CHILD = r"""
import json, sys, time
import torch
import rtx_backend
from rtx_backend.export import bridge as _onnx_bridge
from rtx_backend.lower import registry as _registry
exports = []
original = _onnx_bridge.export_region
_onnx_bridge.export_region = lambda gm, **kw: exports.append(1) or original(gm, **kw)
before = {m: m in sys.modules for m in ("onnxscript.function_libs.torch_lib.ops",)}
indexed_before = bool(_registry.REGISTRIES.indexes)
seconds = rtx_backend.preload()
warm_up_exports = len(exports)
after = {m: m in sys.modules for m in before}
root = __import__("pathlib").Path(sys.argv[1]) / "rtx_backend"
cache_files = sorted(str(p) for d in ("engines", "runtime") for p in (root / d).rglob("*"))
device = sys.argv[2]
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval().to(device)
x = torch.randn(2, 8, device=device)
runtime = "onnxruntime" if device == "cpu" else "tensorrt_rtx"
fn = torch.compile(model, backend="trtrtx", options={"runtime": runtime, "engine_cache_dir": "", "min_block_size": 1})
tolerance = 1e-5 if device == "cpu" else 2e-3  # TensorRT-RTX's FP32 GEMMs may use TF32
with torch.no_grad():
    ok = torch.allclose(fn(x), model(x), atol=tolerance, rtol=tolerance)
index = _registry.index()
print(json.dumps({"before": before, "after": after, "indexed_before": indexed_before,
                  "indexed_after": bool(_registry.REGISTRIES.indexes), "same_index": index is _registry.index(),
                  "seconds": seconds, "ok": ok, "cache_files": cache_files, "warm_up_exports": warm_up_exports, "kinds": [k for k in rtx_backend.stats()]}))
"""


def _preload_in_a_fresh_process(tmp_path, device: str) -> dict:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}  # where default caches would go
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), device],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert not any(result["before"].values()) and not result["indexed_before"]
    assert all(result["after"].values()) and result["indexed_after"] and result["same_index"]
    assert all(v >= 0 for v in result["seconds"].values()) and result["seconds"]["exporter"] > 0
    assert result["warm_up_exports"] == 1
    assert result["ok"], "the compiled model's result after preload differs from eager"
    assert result["cache_files"] == []  # the warm-up writes no engine or runtime cache file
    return result


def test_preload_imports_and_indexes_the_exporter_once_and_compiles_still_work(tmp_path):
    result = _preload_in_a_fresh_process(tmp_path, "cpu")
    expected = {"decompositions", "exporter", "first_export", "tensorrt_rtx"}
    import torch

    if torch.cuda.is_available():
        expected.add("tensorrt_rtx_runtime")
    assert set(result["seconds"]) == expected


@pytest.mark.gpu
def test_preload_runs_a_warm_up_engine_on_the_gpu_and_compiles_still_work(tmp_path):
    result = _preload_in_a_fresh_process(tmp_path, "cuda")
    assert set(result["seconds"]) == {"decompositions", "exporter", "first_export", "tensorrt_rtx",
                                      "tensorrt_rtx_runtime"}
    assert result["seconds"]["tensorrt_rtx_runtime"] > 0
