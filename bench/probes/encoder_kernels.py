"""GPU probe: where the encoder's engine time goes at batch 16 FP16 (6x768, sequence 256), kernel
by kernel, next to inductor's and eager PyTorch's kernels for the same model: torch.profiler's
CUDA kernel times (CUPTI), summed per kernel name over `--calls` calls, microseconds per call.
Also prints the region's ONNX op counts (what the exporter handed TensorRT-RTX).

    python bench/probes/encoder_kernels.py [--calls 50] [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench
from rtx_backend._record import recording


def kernels(fn: Callable[[], object], calls: int) -> tuple[float, list[tuple[str, float, int]]]:
    """Total and per-kernel-name device microseconds per call of fn."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per: dict[str, list[float]] = collections.defaultdict(list)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per[event.name].append(event.device_time)
    rows = sorted(((name, sum(t) / calls, len(t) // calls) for name, t in per.items()), key=lambda r: -r[1])
    return sum(r[1] for r in rows), rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = bench.encoder().eval().cuda().half().requires_grad_(False)
    x = torch.randn(16, 256, 768, device="cuda", dtype=torch.float16)
    ours = torch.compile(model, backend="trtrtx", options={"engine_cache_dir": "", "validate": False})
    with torch.inference_mode(), recording() as graphs:
        ours(x)
    try:
        import onnx

        ops = collections.Counter(n.op_type for r in graphs[0].regions
                                  for n in onnx.load_from_string(r.onnx.model).graph.node)
        print("region ONNX ops:", dict(ops.most_common()))
    except Exception as exc:
        print("region ONNX ops: not read:", exc)
    inductor = torch.compile(model)
    for name, fn in (("trtrtx", lambda: ours(x)), ("inductor", lambda: inductor(x)), ("eager", lambda: model(x))):
        with torch.inference_mode():
            total, rows = kernels(fn, args.calls)
        print(f"\n== {name}: {total:.1f} us of kernels per call, {sum(r[2] for r in rows)} launches")
        for kernel, us, count in rows[: args.top]:
            print(f"{us:9.1f} us  x{count:<3d} {kernel[:150]}")


if __name__ == "__main__":
    main()
