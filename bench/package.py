"""A saved package (`rtx_backend.save` / `load`) against the compiled model it comes from.

    python bench/package.py            # GPU: ResNet-18 FP16 batch 1, saved for this GPU
    python bench/package.py --smoke    # CPU: a small conv net for (8, 6) and (8, 9), ONNX Runtime

Measures, each in fresh processes (median of --rounds, after one process that fills the runtime
cache): the time to the first result from process start (interpreter, imports, load, first call)
and from the start of `rtx_backend.load`, and the same for the backend's own warm start
(torch.compile with warm engine, graph and runtime caches); which of Dynamo, aot_autograd and the
ONNX exporter each imported; steady-state latency of the loaded package and of the compiled model
(one process, interleaved rounds); the archive's size against its engines' and ONNX models'.
Results: bench/results/<date>-<gpu>-<TensorRT-RTX version>-package.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
HEAVY = ("torch._dynamo", "torch._functorch.aot_autograd", "torch.onnx._internal.exporter", "onnxscript", "sympy")


def model_and_input(smoke: bool) -> tuple[Any, Any]:
    import torch

    sys.path.insert(0, str(HERE))
    import bench

    torch.manual_seed(0)
    if smoke or not torch.cuda.is_available():
        model = bench.SmallConv() if hasattr(bench, "SmallConv") else _small()
        return model.eval(), torch.randn(1, 3, 32, 32)
    model = bench.resnet(18).eval().cuda().half().requires_grad_(False)
    return model, torch.randn(1, 3, 224, 224, device="cuda", dtype=torch.half)


def _small() -> Any:
    from torch import nn

    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def child_load(path: str, runtime_cache: str) -> None:
    """A fresh process: import, load, first result. Prints one JSON line."""
    t0 = time.perf_counter()
    import torch

    t1 = time.perf_counter()
    import rtx_backend

    t1b = time.perf_counter()
    before = [m for m in HEAVY if m in sys.modules]
    cuda = torch.cuda.is_available()
    # the input exists before `load`, as a user's does: CUDA's own start is counted apart (the
    # backend's warm start below makes its model and input before torch.compile too)
    x = torch.randn(*json.loads(os.environ["PACKAGE_SHAPE"]), device="cuda" if cuda else "cpu",
                    dtype=torch.half if cuda else torch.float32)
    if cuda:
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    profile = None
    if os.environ.get("PACKAGE_PROFILE"):
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    model = rtx_backend.load(path, options={"runtime_cache_path": runtime_cache})
    t3 = time.perf_counter()
    heavy_after_load = [m for m in HEAVY if m in sys.modules]
    with torch.inference_mode():
        model(x)
        if cuda:
            torch.cuda.synchronize()
    t4 = time.perf_counter()
    heavy_after_call = [m for m in HEAVY if m in sys.modules]
    if profile is not None:
        import pstats

        profile.disable()
        with open(os.environ["PACKAGE_PROFILE"], "w") as f:
            pstats.Stats(profile, stream=f).sort_stats("cumulative").print_stats(45)
    with torch.inference_mode():
        model(x)
        if cuda:
            torch.cuda.synchronize()
    t5 = time.perf_counter()
    rtx_backend.save_runtime_cache()
    print(json.dumps({"end_wall": time.time() - (time.perf_counter() - t4), "import_torch_s": t1 - t0,
                      "import_rtx_backend_s": t1b - t1, "cuda_start_s": t2 - t1b, "load_s": t3 - t2, "first_call_s": t4 - t3,
                      "load_to_first_result_s": t4 - t2, "second_call_s": t5 - t4,
                      "heavy_after_import": before, "heavy_after_load": heavy_after_load,
                      "heavy_after_first_call": heavy_after_call,
                      "kinds": sorted({m.kind for m in model.modules() if isinstance(getattr(m, "kind", None), str)})}))


def child_compile(cache_dir: str, smoke: bool) -> None:
    """A fresh process: the backend's own start (warm when cache_dir holds its caches)."""
    t0 = time.perf_counter()
    import torch

    import rtx_backend

    t1 = time.perf_counter()
    model, x = model_and_input(smoke)
    fn = torch.compile(model, backend="trtrtx", options=compile_options(cache_dir, smoke))
    t2 = time.perf_counter()
    with torch.inference_mode():
        fn(x)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    t3 = time.perf_counter()
    rtx_backend.save_runtime_cache()
    print(json.dumps({"end_wall": time.time() - (time.perf_counter() - t3), "import_s": t1 - t0,
                      "compile_to_first_result_s": t3 - t2, "model_s": t2 - t1, "stats": rtx_backend.stats()}))


def compile_options(cache_dir: str, smoke: bool) -> dict[str, Any]:
    options: dict[str, Any] = {"min_block_size": 1, "weights": "frozen",
                               "engine_cache_dir": os.path.join(cache_dir, "engines"),
                               "runtime_cache_path": os.path.join(cache_dir, "runtime.cache")}
    if smoke:
        options["target_compute_capabilities"] = [(8, 6), (8, 9)]
    return options


def fresh(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    start = time.time()
    out = subprocess.run([sys.executable, str(Path(__file__)), *args], capture_output=True, text=True,
                         timeout=600, env={**os.environ, **env})
    try:
        row = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": out.stderr[-2000:]}
    row["from_process_start_s"] = row.pop("end_wall") - start
    return row


def medians(rows: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in rows if "error" not in r]
    if not good:
        return rows[-1] if rows else {}
    out = dict(good[-1])
    for key, value in good[-1].items():
        if isinstance(value, float):
            out[key] = round(statistics.median(r[key] for r in good), 4)
    out["samples_from_process_start_s"] = [round(r["from_process_start_s"], 3) for r in good]
    return out


def steady_state(loaded: Any, compiled: Any, x: Any, rounds: int, iters: int) -> dict[str, Any]:
    import torch

    sys.path.insert(0, str(HERE))
    import bench

    samples: dict[str, list[float]] = {"package": [], "compiled": []}
    with torch.inference_mode():
        for fn in (loaded, compiled):
            for _ in range(20):
                fn(x)
        bench.sync()
        for _ in range(rounds):
            for name, fn in (("package", loaded), ("compiled", compiled)):
                samples[name] += bench.latencies(lambda fn=fn: fn(x), iters)
    return {name: {"median_ms": round(statistics.median(v), 4), "p90_ms": round(bench.p90(v), 4)}
            for name, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--child-load", nargs=2, metavar=("PT2", "RUNTIME_CACHE"))
    parser.add_argument("--child-compile", metavar="CACHE_DIR")
    args = parser.parse_args()
    if args.child_load:
        child_load(*args.child_load)
        return
    if args.child_compile:
        child_compile(args.child_compile, args.smoke)
        return

    import torch

    import rtx_backend

    sys.path.insert(0, str(HERE))
    import bench

    smoke = args.smoke or not torch.cuda.is_available()
    model, x = model_and_input(smoke)
    work = Path(tempfile.mkdtemp(prefix="trtrtx-package-"))
    targets = [(8, 6), (8, 9)] if smoke else None  # None: built for this GPU (ComputeCapability.CURRENT)
    save_options = {"min_block_size": 1, "target_compute_capabilities": targets, "engine_cache_dir": None}
    results: dict[str, Any] = {"env": bench.environment(), "model": "small-conv" if smoke else "resnet18",
                               "shape": list(x.shape), "dtype": str(x.dtype), "targets": targets}
    start = time.perf_counter()
    saved = rtx_backend.save(model, (x,), work / "model.pt2", options=save_options)
    results["save_s"] = round(time.perf_counter() - start, 2)
    lean = rtx_backend.save(model, (x,), work / "model-no-onnx.pt2", options=save_options, onnx=False)
    results["archive"] = {"size_bytes": saved.size, "engine_bytes": saved.engine_bytes,
                          "onnx_bytes": saved.onnx_bytes, "size_without_onnx_bytes": lean.size,
                          "size_over_engines": round(saved.size / max(saved.engine_bytes, 1), 3),
                          "size_without_onnx_over_engines": round(lean.size / max(lean.engine_bytes, 1), 3)}
    print(json.dumps(results["archive"]), flush=True)

    env = {"PACKAGE_SHAPE": json.dumps(list(x.shape))}
    cache = str(work / "runtime.cache")
    flag = ["--smoke"] if smoke else []
    first = fresh(["--child-load", str(work / "model.pt2"), cache], env)  # fills the runtime cache
    loads = [fresh(["--child-load", str(work / "model.pt2"), cache], env) for _ in range(args.rounds)]
    if os.environ.get("PACKAGE_PROFILE"):  # one more process, profiled from `load` to the first result
        fresh(["--child-load", str(work / "model.pt2"), cache], env)
    results["load_first_process"] = first
    results["load"] = medians(loads)
    compile_dir = str(work / "caches")
    results["compile_cold_process"] = fresh(["--child-compile", compile_dir, *flag], env)  # fills every cache
    results["compile_warm"] = medians([fresh(["--child-compile", compile_dir, *flag], env)
                                       for _ in range(args.rounds)])
    print(json.dumps({k: results[k] for k in ("load", "compile_warm")}, indent=1), flush=True)

    loaded = rtx_backend.load(work / "model.pt2", options={"runtime_cache_path": cache})
    compiled = torch.compile(model, backend="trtrtx", options=compile_options(compile_dir, smoke))
    results["steady_state"] = steady_state(loaded, compiled, x, 3 if smoke else 10, 50 if smoke else 200)
    with torch.inference_mode():
        results["max_abs_diff_package_vs_compiled"] = float((loaded(x).float() - compiled(x).float()).abs().max())
    results["summary"] = summary(results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = bench.result_path("package" + ("-smoke" if smoke else ""), results["env"], out)
    path.write_text(json.dumps(results, indent=1))
    path.with_suffix(".md").write_text(f"# {path.stem}\n\n```\n{json.dumps(results['env'], indent=1)}\n```\n\n"
                                       f"{results['summary']}\n\n```json\n{json.dumps(results, indent=1)}\n```\n")
    print(results["summary"])
    print(f"saved {path}")


def summary(results: dict[str, Any]) -> str:
    load, warm, steady, archive = results["load"], results["compile_warm"], results["steady_state"], results["archive"]
    rows = [
        "| | package (`rtx_backend.load`) | compiled model, warm caches |",
        "|---|---|---|",
        f"| first result from process start (s) | {load.get('from_process_start_s')} | {warm.get('from_process_start_s')} |",
        f"| first result from `load` / `torch.compile` (s) | {load.get('load_to_first_result_s')} | "
        f"{warm.get('compile_to_first_result_s')} |",
        f"| imports (s) | torch {load.get('import_torch_s')}, rtx_backend {load.get('import_rtx_backend_s')}, CUDA start "
        f"{load.get('cuda_start_s')} | "
        f"{warm.get('import_s')} |",
        f"| steady state median (p90) ms | {steady['package']['median_ms']} ({steady['package']['p90_ms']}) | "
        f"{steady['compiled']['median_ms']} ({steady['compiled']['p90_ms']}) |",
        f"| runs on | {', '.join(load.get('kinds', []))} | |",
    ]
    rows.append("")
    rows.append(f"archive {archive['size_bytes'] / 1e6:.2f} MB = {archive['size_over_engines']} x its engines' "
                f"{archive['engine_bytes'] / 1e6:.2f} MB (ONNX models {archive['onnx_bytes'] / 1e6:.2f} MB); "
                f"saved without ONNX models {archive['size_without_onnx_bytes'] / 1e6:.2f} MB "
                f"({archive['size_without_onnx_over_engines']} x). Imported after import rtx_backend: "
                f"{load.get('heavy_after_import')}; after load: {load.get('heavy_after_load')}; after the first call: "
                f"{load.get('heavy_after_first_call')}")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
