"""RSS across compile/discard cycles on the graph-cache-hit path (CPU: ONNX Runtime regions,
engines built for a declared target), so that a server that recompiles stays bounded.

    python bench/graph_cache_memory.py [--cycles 100] [--width 1024] [--depth 4]

Prints each cycle's RSS and saves bench/results/<date>-<device>-<TensorRT-RTX version>-graph-cache-memory.json: RSS after the
first cycle, after the last, and the growth as a share of the first cycle's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch import nn

import bench
import rtx_backend


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.depth):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*layers).eval()
    x = torch.randn(8, args.width)
    cache = tempfile.mkdtemp(prefix="trtrtx-memory-")
    options = {"target_compute_capabilities": [(8, 6)], "engine_cache_dir": cache, "runtime_cache_path": "",
               "min_block_size": 1, "progress": False}
    rss: list[float] = []
    start = time.perf_counter()
    with torch.no_grad():
        for cycle in range(args.cycles + 1):  # cycle 0 builds and stores: not a hit
            torch._dynamo.reset()
            compiled = torch.compile(model, backend="trtrtx", options=options)
            compiled(x)
            del compiled
            torch._dynamo.reset()
            gc.collect()
            if cycle == 0:
                rtx_backend.cache.store.flush()
                rtx_backend.reset_stats()
                continue
            rss.append(rss_mb())
            print(f"cycle {cycle:3d}: RSS {rss[-1]:.1f} MB", flush=True)
    stats = rtx_backend.stats()
    growth = rss[-1] - rss[0]
    result = {
        "what": "RSS after each graph-cache-hit compile/discard cycle",
        "model": f"MLP {args.depth}x{args.width} (fp32, {sum(p.numel() for p in model.parameters()) * 4 / 2**20:.1f} MB of weights)",
        "cycles": args.cycles,
        "rss_first_mb": round(rss[0], 1),
        "rss_last_mb": round(rss[-1], 1),
        "growth_mb": round(growth, 1),
        "growth_share_of_first": round(growth / rss[0], 4),
        "per_cycle_mb": round(growth / max(1, len(rss) - 1), 3),
        "graph_cache_hits": stats.get("graph_cache_hits", 0),
        "seconds": round(time.perf_counter() - start, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "rss_mb": [round(r, 1) for r in rss],
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rss_mb"}, indent=2))
    if not args.no_save:
        env = bench.environment()
        out = bench.result_path("graph-cache-memory", env)
        out.write_text(json.dumps({"env": env, **result}, indent=2) + "\n")
        print(f"saved {out}")


if __name__ == "__main__":
    main()
