"""Weights that change: refit time against a cold build, and engine time refittable against not.

    python bench/refit.py                       # GPU: ResNet-50 and the encoder, FP16, batch 1
    python bench/refit.py --models resnet50     # one model
    python bench/refit.py --smoke               # CPU: a small MLP, ONNX Runtime path (runs anywhere)
    python bench/refit.py --profile             # also a cProfile of each second change

For each model, two compiles from empty caches: weights="refit" (engines built refittable) and
weights="checked", the default (engines built as for frozen weights). Each measures its cold
build (the first call: export, build, first run), the call time of its engine (interleaved
rounds, CUDA events), and the first call after every weight changed in place: a refit for the
first, a rebuild for the second, on the update thread while PyTorch serves the call (the default
weight_update="background"). The results after the change are compared with eager PyTorch.
Results go to bench/results/<date>-<gpu>-<TensorRT-RTX>-refit.json and .md.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
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


@contextlib.contextmanager
def profiled(on: bool, title: str, lines: int = 40) -> Iterator[None]:
    """cProfile the block and print its `lines` costliest calls by cumulative time (when `on`)."""
    if not on:
        yield
        return
    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        print(f"-- profile: {title}")
        pstats.Stats(profile, stream=sys.stdout).sort_stats("cumulative").print_stats(lines)


def variant(name: str, factory: Any, shape: tuple[int, ...], dtype: torch.dtype, refittable: bool,
            cache_dir: str, profile: bool = False) -> dict[str, Any]:
    import rtx_backend
    from rtx_backend._stats import stage_seconds

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
    rows: dict[str, Any] = {"refittable": refittable, "cold_build_s": round(cold, 3), "steady_call_ms": round(steady * 1e3, 3),
                            "cold_stage_s": stage_seconds({}, rtx_backend.stats())}
    for k, step in enumerate((1e-3, 2e-3)):
        change_weights(model, step)
        with torch.inference_mode():
            ref = model(x)
        before = rtx_backend.stats()
        with profiled(profile and k == 1, f"{name}, {'refittable' if refittable else 'not refittable'}, "
                      "second change"):
            start = time.perf_counter()
            seconds, out = timed_call(fn, x)  # PyTorch runs the changed regions while engines update
            rtx_backend.wait_for_updates()
            updated = time.perf_counter() - start
        rows[f"change_{k + 1}_stage_s"] = stage_seconds(before, rtx_backend.stats())
        rows[f"change_{k + 1}_call_s"] = round(seconds, 4)
        rows[f"change_{k + 1}_s"] = round(updated, 3)
        rows[f"change_{k + 1}_rel_err_vs_eager"] = rel_err(out, ref)
        _, out = timed_call(fn, x)  # the engines, up to date
        rows[f"change_{k + 1}_engine_rel_err_vs_eager"] = rel_err(out, ref)
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
             "update / cold build | call after a change ms | rel. err after change (engine) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, rows in results["models"].items():
        for row in rows:
            ratio = row["change_2_s"] / row["cold_build_s"] if row["cold_build_s"] else float("nan")
            call = max(row.get("change_1_call_s", 0), row.get("change_2_call_s", 0)) * 1e3
            err = max(row["change_1_rel_err_vs_eager"], row["change_2_rel_err_vs_eager"])
            engine = max(row.get("change_1_engine_rel_err_vs_eager", err), row.get("change_2_engine_rel_err_vs_eager", err))
            lines.append(f"| {name} | {'refittable' if row['refittable'] else 'not refittable'} | "
                         f"{row['cold_build_s']} | {row['median_ms']} | {row['change_1_s']} | {row['change_2_s']} | "
                         f"{ratio:.1%} | {call:.1f} | {err:.2e} ({engine:.2e}) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a small MLP on CPU (ONNX Runtime path)")
    parser.add_argument("--models", default="", help="comma-separated subset: resnet50,encoder-6x768")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--profile", action="store_true", help="print a cProfile of each variant's second change")
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
        rows = [variant(name, factory, shape, dtype, refittable, cache_dir, args.profile)
                for refittable in (True, False)]
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
        "A change: the weights of every layer changed in place, then one call. The changed regions "
        "run in PyTorch on that call (option weight_update=\"background\") while their engines are "
        "refitted or built again on the update thread. first/second change s: from that call until "
        "the engines have the new weights (rtx_backend.wait_for_updates()); update / cold build: the "
        "second change's over the cold build's; call after a change: the slower of the two calls "
        "that saw a change; rel. err: that call's result against eager (in brackets: the engines', "
        "after the update). Engines that are not refittable (weights=\"checked\") are built again "
        "on every change.\n")
    return text


if __name__ == "__main__":
    main()
