"""Three-way cross-check (PyTorch, ONNX Runtime, TensorRT-RTX) of every region of the benchmark
models, FP16 and FP32: `rtx_backend.crosscheck` on each, one summary table.

    python bench/crosscheck_models.py [--out DIR] [--models a,b]   # GPU: all three runtimes

Prints each model's full report and a summary (per model, dtype, region and runtime: worst max
abs/rel error, agreement); writes the summary to DIR/crosscheck.md. Exits 1 if a report fails.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench
import rtx_backend

# model -> input shape (small batches: every region runs three times, on the host for ONNX Runtime)
SHAPES = {"mlp-4x4096": (8, 4096), "resnet18": (2, 3, 224, 224), "resnet50": (2, 3, 224, 224),
          "encoder-6x768": (2, 64, 768), "conv3d": (1, 3, 16, 64, 64)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--models", default=",".join(SHAPES))
    args = parser.parse_args()
    table = bench.model_table(smoke=False)
    rows = ["| model | dtype | region | runtime | outputs | max abs err | max rel err | agrees |",
            "|---|---|---|---|---|---|---|---|"]
    ok = True
    for name in args.models.split(","):
        factory = table[name][0]
        for dtype in (torch.float16, torch.float32):
            torch.manual_seed(0)
            torch._dynamo.reset()
            model = factory().eval().to(bench.DEVICE, dtype).requires_grad_(False)
            x = torch.randn(*SHAPES[name], device=bench.DEVICE, dtype=dtype)
            report = rtx_backend.crosscheck(model, x, options={"min_block_size": 1, "engine_cache_dir": ""})
            print(f"===== {name} {dtype}\n{report}", flush=True)
            ok = ok and bool(report)
            for check in report.checks:
                outs = check.outputs
                worst_abs = max((o.max_abs for o in outs), default=float("nan"))
                worst_rel = max((o.max_rel for o in outs), default=float("nan"))
                verdict = "skipped: " + check.skipped if check.skipped else (
                    "yes" if check.passed else f"NO: {check.error or '; '.join(o.problem for o in outs if o.problem)}")
                rows.append(f"| {name} | {str(dtype).removeprefix('torch.')} | {check.region} | "
                            f"{check.runtime} vs {check.reference} | {len(outs)} | {worst_abs:.3g} | "
                            f"{worst_rel:.3g} | {verdict} |")
    summary = "\n".join(rows)
    print(summary)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "crosscheck.md").write_text(summary + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
