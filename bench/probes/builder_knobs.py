"""GPU probe: do TensorRT-RTX's builder knobs change a zoo model's engine time or build time?

trtrtx leaves the builder config at TensorRT-RTX's defaults (builder optimization level 3, no
tiling optimization, auxiliary streams as the builder likes). For each model and each variant
below, the model is compiled with native CUDA graphs into a fresh engine cache (so the engine is
built with that variant) and timed: the compiled call and the engine alone (CUDA events,
median), the build's seconds, and the largest difference from the default variant's output.

    python bench/probes/builder_knobs.py --models tv-vit_b_16,tv-resnet50 [--variants default,opt5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

import zoo  # noqa: E402

import rtx_backend  # noqa: E402
from rtx_backend import _trt  # noqa: E402
from rtx_backend._record import recording  # noqa: E402
from rtx_backend.build import engine as _engine  # noqa: E402

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "opt1": {"builder_optimization_level": 1},
    "opt5": {"builder_optimization_level": 5},
    "tiling-moderate": {"tiling_optimization_level": "MODERATE"},
    "tiling-full": {"tiling_optimization_level": "FULL"},
    "aux0": {"max_aux_streams": 0},
}


def with_variant(knobs: dict[str, Any]) -> Any:
    """engine.configure_targets, then the variant's settings on the same builder config."""
    original = _engine.configure_targets

    def configure(config: Any, targets: Any) -> None:
        original(config, targets)
        trt = _trt.trt()
        for name, value in knobs.items():
            if name == "tiling_optimization_level":
                value = getattr(trt.TilingOptimizationLevel, value)
            setattr(config, name, value)

    return configure


def run(name: str, variants: list[str], iters: int) -> list[dict[str, Any]]:
    bench = zoo._bench_module()
    entry = zoo.ZOO[name]
    batch = (zoo.LLM_BATCHES if name == "hf-llama-gqa" else zoo.BATCHES[entry.source])[-1]
    torch.manual_seed(0)
    base = entry.build("full").cuda()
    zoo.prepare(base, lambda b: entry.inputs("full", b))
    model = base.half().requires_grad_(False)
    x = zoo.cast(entry.inputs("full", batch), torch.float16, "cuda")
    rows, reference = [], None
    original = _engine.configure_targets
    for variant in variants:
        row: dict[str, Any] = {"model": name, "batch": batch, "variant": variant}
        with tempfile.TemporaryDirectory() as cache:
            options: dict[str, Any] = {"min_block_size": 1, "engine_cache_dir": f"{cache}/engines",
                       "runtime_cache_path": f"{cache}/runtime.cache", "cuda_graph_strategy": "whole_graph_capture"}
            _engine.configure_targets = with_variant(VARIANTS[variant])  # type: ignore[assignment]
            try:
                torch._dynamo.reset()
                rtx_backend.reset_stats()
                compiled = torch.compile(model, backend="trtrtx", dynamic=False, options=options)
                with torch.inference_mode():
                    with recording() as graphs:
                        out = compiled(*x)
                    for _ in range(5):
                        out = compiled(*x)
                    regions = [r for g in graphs for r in g.regions]
                    stats = rtx_backend.stats()
                    row["engine_builds"] = stats.get("engine_builds", 0)
                    row["build_s"] = round(stats.get("build_ms", 0) / 1e3, 2)
                    row["regions"] = [r.kind for r in regions]
                    row["call_ms"] = statistics.median(bench.latencies(lambda fn=compiled: fn(*x), iters))
                    row["engine_ms"] = bench.engine_ms(lambda _x, fn=compiled: fn(*x), None, regions, iters)
                    if isinstance(out, torch.Tensor):
                        first = out
                    elif isinstance(out, (tuple, list)):
                        first = out[0]
                    else:  # a Hugging Face output
                        first = next(iter(out.values()))
                    first = first.float()
                    if reference is None:
                        reference = first
                    row["max_diff_vs_default"] = (first - reference).abs().max().item()
            except Exception as exc:  # a variant this TensorRT-RTX refuses is a result too
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            finally:
                _engine.configure_targets = original  # type: ignore[assignment]
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tv-vit_b_16,tv-resnet50")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("builder_knobs: needs a CUDA GPU")
        return 0
    rows = []
    for name in args.models.split(","):
        rows += run(name, args.variants.split(","), args.iters)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
