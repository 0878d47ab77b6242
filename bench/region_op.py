"""What the region op (`torch.ops.trtrtx.region`) adds to a region call.

    python bench/region_op.py            # CPU: regions in ONNX Runtime
    python bench/region_op.py --gpu      # GPU: regions on TensorRT-RTX

Times, per call, a compiled region's module called directly (what rest="pytorch" does) and the
same module through the op, bare and through the runner that rest="inductor" gives it (what
inductor's code calls), in interleaved rounds, median of the rounds; plus the dispatcher's own
cost (an op whose kernel returns its input). Prints JSON and saves it under bench/results (see bench.result_path).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import environment, result_path


def per_call_us(fn: Any, n: int, sync: bool) -> float:
    for _ in range(200):
        fn()
    if sync:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    if sync:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="CUDA tensors, regions on TensorRT-RTX")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--out", type=Path, default=None, help="results folder (default bench/results)")
    args = parser.parse_args(argv)

    import rtx_backend
    from rtx_backend._options import Options
    from rtx_backend._record import recording
    from rtx_backend.assemble import rest
    from rtx_backend.run.region_op import REGION, RegionCall

    device = "cuda" if args.gpu else "cpu"
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU()).eval().to(device)
    x = torch.randn(8, 16, device=device)
    options: dict[str, Any] = {"min_block_size": 1, "engine_cache_dir": "", "runtime_cache_path": ""}
    if args.gpu:
        options["runtime"] = "tensorrt_rtx"
    compiled = torch.compile(model, backend="trtrtx", options=options)
    with torch.no_grad(), recording() as graphs:
        compiled(x)
    (region,) = graphs[0].regions
    call = RegionCall(region, [("t", 0)])
    with_runner = RegionCall(region, [("t", 0)], rest._runner(region, Options(rest="inductor")))

    identity = torch.library.Library("trtrtx_bench", "DEF")
    identity.define("same(str key, Tensor[] tensors) -> Tensor[]")
    identity.impl("same", lambda key, tensors: tensors, "CompositeExplicitAutograd")
    same = torch.ops.trtrtx_bench.same.default

    cases = {
        "region_module": lambda: region(x),
        "region_op": lambda: REGION(call.key, [x]),
        "region_op_rest": lambda: REGION(with_runner.key, [x]),
        "dispatcher_only": lambda: same("k", [x]),
    }
    samples: dict[str, list[float]] = {k: [] for k in cases}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for name, fn in cases.items():
                samples[name].append(per_call_us(fn, args.n, args.gpu))
    result = {k: round(statistics.median(v), 3) for k, v in samples.items()}
    result["op_adds_us"] = round(result["region_op"] - result["region_module"], 3)
    result["op_rest_adds_us"] = round(result["region_op_rest"] - result["region_module"], 3)
    env = environment()
    record = {"environment": env, "device": device, "region_kind": region.kind, "per_call_us": result,
              "rounds": args.rounds, "calls_per_round": args.n, "rtx_backend": rtx_backend.__version__}
    print(json.dumps(record["per_call_us"], indent=1))
    path = result_path("region-op" + ("-gpu" if args.gpu else "-cpu"), env, args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
