"""Weights that change: refit time against a cold build, and engine time refittable against not.

    python bench/refit.py                       # GPU: ResNet-50 and the encoder, FP16, batch 1
    python bench/refit.py --models resnet50     # one model
    python bench/refit.py --smoke               # CPU: a small MLP, ONNX Runtime path (runs anywhere)

For each model, two compiles from empty caches: weights="refit" (engines built refittable) and
weights="checked", the default (engines built as for frozen weights). Each measures its cold
build (the first call: export, build, first run), the call time of its engine (interleaved
rounds, CUDA events), and the first call after every weight changed in place: a refit for the
first, a rebuild for the second. The results after the change are compared with eager PyTorch.
Results go to bench/results/<date>-<gpu>-<TensorRT-RTX>-refit.json and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench

HERE = Path(__file__).resolve().parent


def models(smoke: bool) -> dict[str, tuple[Any, tuple[int, ...], torch.dtype]]:
    if smoke:
        return {"mlp-2x256": (lambda: bench.mlp(256, 2), (8, 256), torch.float32)}

    def resnet50() -> torch.nn.Module:
        try:
            return bench.resnet(50)
        except Exception:  # torchvision missing or not loadable: the same layers without it
            return bench.resnet50_like()

    return {"resnet50": (resnet50, (1, 3, 224, 224), torch.float16),
            "encoder-6x768": (bench.encoder, (1, 256, 768), torch.float16)}


def change_weights(model: torch.nn.Module, step: float) -> None:
    """Every floating-point parameter and buffer changed in place (as an optimizer step does)."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.is_floating_point():
                t.mul_(1.0 - step)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6))


def timed_call(fn: Any, x: torch.Tensor) -> tuple[float, torch.Tensor]:
    bench.sync()
    t = time.perf_counter()
    with torch.inference_mode():
        out = fn(x)
    bench.sync()
    return time.perf_counter() - t, out


def variant(name: str, factory: Any, shape: tuple[int, ...], dtype: torch.dtype, refittable: bool,
            cache_dir: str) -> dict[str, Any]:
    import rtx_backend

    torch.manual_seed(0)
    model = factory().eval().to(bench.DEVICE, dtype).requires_grad_(False)
    x = torch.randn(shape, device=bench.DEVICE, dtype=dtype)
    options = {"min_block_size": 1, "engine_cache_dir": str(Path(cache_dir) / f"{name}-{refittable}"),
               "runtime_cache_path": str(Path(cache_dir) / f"{name}-{refittable}.cache"),
               "weights": "refit" if refittable else "checked"}
    if not bench.CUDA:
        options["target_compute_capabilities"] = [(8, 6)]
    rtx_backend.reset_stats()
    fn = torch.compile(model, backend="trtrtx", dynamic=False, options=options)
    cold, _ = timed_call(fn, x)
    for _ in range(3):
        timed_call(fn, x)
    steady = statistics.median(timed_call(fn, x)[0] for _ in range(10))
    rows: dict[str, Any] = {"refittable": refittable, "cold_build_s": round(cold, 3), "steady_call_ms": round(steady * 1e3, 3)}
    for k, step in enumerate((1e-3, 2e-3)):
        change_weights(model, step)
        seconds, out = timed_call(fn, x)
        with torch.inference_mode():
            ref = model(x)
        rows[f"change_{k + 1}_s"] = round(seconds - steady, 3)
        rows[f"change_{k + 1}_rel_err_vs_eager"] = rel_err(out, ref)
    rows["stats"] = {k: v for k, v in rtx_backend.stats().items() if k.startswith(("weight_", "engine_"))}
    rows["fn"] = fn
    rows["x"] = x
    return rows


def engine_times(rows: list[dict[str, Any]], rounds: int, iters: int) -> None:
    """Call time of each variant's compiled model, interleaved rounds (the GPU is shared)."""
    samples: list[list[float]] = [[] for _ in rows]
    for _ in range(rounds):
        for row, sink in zip(rows, samples):
            fn, x = row["fn"], row["x"]
            with torch.inference_mode():
                sink.extend(bench.latencies(lambda fn=fn, x=x: fn(x), iters))
    for row, sink in zip(rows, samples):
        row["median_ms"] = round(statistics.median(sink), 4)


def markdown(results: dict[str, Any]) -> str:
    lines = ["| model | engines | cold build s | median call ms | first change s | second change s | "
             "refit / cold build | rel. err after change |", "|---|---|---|---|---|---|---|---|"]
    for name, rows in results["models"].items():
        for row in rows:
            ratio = row["change_2_s"] / row["cold_build_s"] if row["cold_build_s"] else float("nan")
            lines.append(f"| {name} | {'refittable' if row['refittable'] else 'not refittable'} | "
                         f"{row['cold_build_s']} | {row['median_ms']} | {row['change_1_s']} | {row['change_2_s']} | "
                         f"{ratio:.1%} | {max(row['change_1_rel_err_vs_eager'], row['change_2_rel_err_vs_eager']):.2e} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a small MLP on CPU (ONNX Runtime path)")
    parser.add_argument("--models", default="", help="comma-separated subset: resnet50,encoder-6x768")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    smoke = args.smoke or not bench.CUDA
    torch._dynamo.config.cache_size_limit = 64
    table = models(smoke)
    if args.models:
        table = {k: v for k, v in table.items() if k in args.models.split(",")}
    cache_dir = tempfile.mkdtemp(prefix="trtrtx-refit-")
    results: dict[str, Any] = {"env": bench.environment(), "models": {}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = bench.result_path("refit-smoke" if smoke else "refit", results["env"], out).with_suffix("")
    for name, (factory, shape, dtype) in table.items():
        print(f"-- {name} {shape} {dtype}", flush=True)
        rows = [variant(name, factory, shape, dtype, refittable, cache_dir) for refittable in (True, False)]
        engine_times(rows, 2 if smoke else args.rounds, 5 if smoke else args.iters)
        for row in rows:
            row.pop("fn"), row.pop("x")
        results["models"][name] = rows
        torch._dynamo.reset()
        save(results, stem)
    print(save(results, stem))
    print(f"saved {stem}.json/.md")


def save(results: dict[str, Any], stem: Path) -> str:
    text = markdown(results)
    stem.with_name(stem.name + ".json").write_text(json.dumps(results, indent=1))
    stem.with_name(stem.name + ".md").write_text(
        f"# {stem.name}\n\n```\n{json.dumps(results['env'], indent=1)}\n```\n\n{text}\n\n"
        "refit / cold build: the second change's time over the cold build's. Engines that are not "
        "refittable (weights=\"checked\") are built again on every change.\n")
    return text


if __name__ == "__main__":
    main()
