"""The benchmark script still runs (CPU smoke: tiny models, ONNX Runtime path) and saves its results."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

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
    merged = json.loads((tmp_path / "2026-11-30-GPU-X-1.4.0-m.json").read_text())  # date, GPU, version, kind
    assert [c["model"] for c in merged["configs"]] == ["mlp", "resnet18"]
    assert merged["backends"] == ["eager", "inductor", "trtrtx", "trtrtx-cg"]
    assert merged["dynamic_sweep"] == {"lengths": [8]} and merged["overhead"] == {"x": 1}
    assert "| resnet18 |" in (tmp_path / "2026-11-30-GPU-X-1.4.0-m.md").read_text()
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


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_script", ROOT / "bench" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_peak_memory_is_the_polled_peak_above_the_start(bench):
    """Device memory is polled on a thread: a peak inside the block counts, what stood before
    does not, and what the block still holds at its end counts when it is the most."""
    level = {"bytes": 100 << 20}
    polled_high = threading.Event()

    def used() -> int:
        if level["bytes"] == 300 << 20:
            polled_high.set()
        return level["bytes"]

    with bench.PeakMemory(used, interval=0.001) as peak:
        level["bytes"] = 300 << 20
        assert polled_high.wait(10)  # the poller has seen the high point
        level["bytes"] = 150 << 20
    assert peak.device_mb == 200
    with bench.PeakMemory(used, interval=60) as held:  # no poll falls inside: the end is read
        level["bytes"] = 180 << 20
    assert held.device_mb == 30


def test_memory_cells_read_both_counts_and_older_results(bench):
    assert bench.memory_cell({"peak_device_mb": 412.4, "peak_torch_mb": 343.0}) == "412 (343)"
    assert bench.memory_cell({"peak_mem_mb": 61.2}) == "61"  # saved before the device count
    assert bench.memory_cell({"peak_device_mb": None, "peak_torch_mb": None}) == "-"


@pytest.mark.parametrize("others, verdict", [
    ({}, False),  # one backend alone (a cold-compile run): nothing says what FP16's error is here
    ({"eager": 0.08}, False),  # within ten times eager's
    ({"eager": 0.01}, True),
    ({"eager": 0.08, "inductor": 0.001}, True),  # the peers' error is the yardstick before eager's
])
def test_a_result_is_judged_wrong_only_against_what_ran_beside_it(bench, others, verdict):
    report = _report_module()
    rows = {"trtrtx": {"max_err_vs_fp32": 0.144}, **{k: {"max_err_vs_fp32": v} for k, v in others.items()}}
    config = {"model": "m", "shape": [1], "dtype": "float16", "backends": rows}
    assert bench.wrong(config, "trtrtx") is verdict
    assert report.wrong(config, "trtrtx") is verdict


def test_ratio_table_ends_with_each_peers_geometric_mean_and_how_many_are_at_most_one(bench):
    row = {"cold_compile_s": 1.0, "max_err_vs_fp32": 0.01}

    def config(model: str, ours: float, inductor_ro: float, **more: dict) -> dict:
        return {"model": model, "shape": [1], "dtype": "float16", "backends": {
            "inductor-ro": {"median_ms": inductor_ro, "p90_ms": inductor_ro, **row},
            "trtrtx-cg": {"median_ms": ours, "p90_ms": ours, **row}, **more}}

    results = {"env": {}, "backends": ["inductor-ro", "torch_tensorrt", "trtrtx-cg"], "configs": [
        config("a", 1.0, 2.0), config("b", 2.0, 1.0),
        config("c", 3.0, 3.0, torch_tensorrt={"median_ms": 6.0, "p90_ms": 6.0, **row})]}
    line = next(x for x in bench.table(results).splitlines() if x.startswith("| geometric mean"))
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert cells[3:6] == ["0.50 (1; 1)", "1.00 (3; 2)", "-"]  # vs torch_tensorrt, inductor-ro, inductor


def _report_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("report_script", ROOT / "bench" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_refit_bench_smoke_runs_and_saves(tmp_path):
    """bench/refit.py on CPU: both variants compile, the weights change twice, results are saved."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "refit.py"), "--smoke", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (saved,) = tmp_path.glob("*-refit-smoke.json")
    rows = json.loads(saved.read_text())["models"]["mlp-2x256"]
    assert [r["refittable"] for r in rows] == [True, False]
    for row in rows:
        assert row["stats"]["weight_refits"] == 2  # ONNX Runtime: a new session per change
        assert row["change_1_rel_err_vs_eager"] < 1e-5 and row["change_2_rel_err_vs_eager"] < 1e-5
        assert row["cold_build_s"] > 0 and row["median_ms"] > 0
    assert "| mlp-2x256 | refittable |" in saved.with_suffix(".md").read_text()


def test_the_weight_check_cost_grows_with_the_weights(bench):
    """The check is measured on the guard itself: ResNet-50's 320 weights cost more than an MLP's 4."""
    import torch

    small = bench.weight_check_us(bench.mlp(16, 2).eval(), torch.zeros(1, 16), rounds=3, n=300)
    large = bench.weight_check_us(bench.resnet50_like().eval(), torch.zeros(1, 3, 8, 8), rounds=3, n=300)
    assert large > small


def test_report_tables_take_the_kinds_they_name_latest_date_first_then_the_later_kind():
    report = _report_module()
    assert report.kind("2026-12-03-NVIDIA-H200-1.6.1-zoo-cold-trtrtx-threads") == "zoo-cold-trtrtx-threads"
    assert report.kind("2026-12-03-cpu-1.7.1-zoo") == "zoo"

    def result(date: str, ms: float) -> dict:
        row = {"median_ms": ms, "cold_compile_s": 1.0, "max_err_vs_fp32": 0.0, "regions": 1, "regions_in_pytorch": 0}
        return {"env": {"date": date, "gpu": "GPU X", "tensorrt_rtx": "1.6.1.1", "torch": "2.11"},
                "configs": [{"model": "hf-bert", "shape": [16], "dtype": "float16",
                             "backends": {"inductor-ro": {**row, "median_ms": 2.0}, "trtrtx-cg": row}}]}

    results = [("2026-12-02-GPU-X-1.6.1-zoo-small-batch", result("2026-12-02", 1.0)),
               ("2026-12-02-GPU-X-1.6.1-zoo", result("2026-12-02", 3.0)),
               ("2026-12-01-GPU-X-1.6.1-zoo-small-batch", result("2026-12-01", 5.0)),
               ("2026-12-02-GPU-X-1.6.1-other", result("2026-12-02", 7.0))]
    table = report.zoo_gpu_table(results)
    assert table.startswith("GPU X (not an RTX GPU), TensorRT-RTX 1.6.1, torch 2.11")
    row = next(x for x in table.splitlines() if x.startswith("| BERT-base"))
    assert "| 1.000 | 0.50 |" in row  # the same date: zoo-small-batch is named after zoo, so it wins
    assert "other" not in table
