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


def _part(env: dict, backends: list[str], model: str, **extra) -> dict:
    rows = {b: {"median_ms": 1.0 + k, "p90_ms": 2.0, "cold_compile_s": 0.5, "peak_mem_mb": 1.0,
                "max_err_vs_fp32": 0.0} for k, b in enumerate(backends)}
    return {"env": env, "backends": backends, "configs": [{"model": model, "shape": [1, 4], "dtype": "float16",
                                                           "backends": rows}], **extra}


def test_bench_merge_joins_parallel_parts_and_refuses_other_versions(tmp_path):
    env = {"date": "2026-11-30", "gpu": "GPU X", "tensorrt_rtx": "1.4.0", "torch": "2.11"}
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    a.write_text(json.dumps(_part(env, ["eager", "inductor", "trtrtx"], "mlp", dynamic_sweep={"lengths": [8]})))
    b.write_text(json.dumps(_part(env, ["eager", "trtrtx", "trtrtx-cg"], "resnet18", overhead={"x": 1})))
    script = [sys.executable, str(ROOT / "bench" / "bench.py")]
    out = subprocess.run([*script, "--merge", str(a), str(b), "--out", str(tmp_path), "--tag", "m"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    merged = json.loads((tmp_path / "2026-11-30-GPU-X-m.json").read_text())
    assert [c["model"] for c in merged["configs"]] == ["mlp", "resnet18"]
    assert merged["backends"] == ["eager", "inductor", "trtrtx", "trtrtx-cg"]
    assert merged["dynamic_sweep"] == {"lengths": [8]} and merged["overhead"] == {"x": 1}
    assert "| resnet18 |" in (tmp_path / "2026-11-30-GPU-X-m.md").read_text()
    b.write_text(json.dumps(_part({**env, "tensorrt_rtx": "1.6.1"}, ["eager"], "resnet18")))
    out = subprocess.run([*script, "--merge", str(a), str(b), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "differ in tensorrt_rtx" in out.stderr


def test_bench_starts_take_the_median_of_rounds_of_fresh_processes(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench.py"), "--smoke", "--parts", "starts", "--start-rounds", "2",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (saved,) = tmp_path.glob("*-smoke.json")
    starts = json.loads(saved.read_text())["fresh_process"]
    assert list(starts) == ["cold", "warm", "warm_engine_cache_only", "warm_no_runtime_cache"]
    for kind, row in starts.items():
        samples = row["first_result_samples_s"]
        assert len(samples) == 2 and all(s > 0 for s in samples), kind
        assert abs(row["first_result_s"] - sum(samples) / 2) < 2e-3, kind  # the median of two
    assert starts["cold"]["stats"]["validations"] == 1  # a cold start checks its region once
