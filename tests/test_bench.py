"""The benchmark script still runs (CPU smoke: tiny models, ONNX Runtime path) and saves its results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_smoke_runs_and_saves(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench.py"), "--smoke", "--parts", "sweep,models",
         "--models", "mlp-4x64", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    saved = list(tmp_path.glob("*-smoke.json"))
    assert len(saved) == 1
    results = json.loads(saved[0].read_text())
    backends = results["configs"][0]["backends"]
    assert set(backends) == {"eager", "trtrtx"}
    assert backends["trtrtx"]["max_err_vs_fp32"] < 1e-4
    assert backends["trtrtx"]["median_ms"] > 0
    sweep = results["dynamic_sweep"]["trtrtx"]
    assert len(sweep["per_length"]) == 8
    assert sweep["recompiles"] == 0 and sweep["compiled_graphs"] == 1
    assert all(p["max_err_vs_eager"] < 1e-3 for p in sweep["per_length"])
    assert "| mlp-4x64 |" in saved[0].with_suffix(".md").read_text()
