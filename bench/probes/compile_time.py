"""GPU probe: where a cold compile's time goes, stage by stage, for the benchmark's MLP (4x4096,
FP32 batch 256 by default: 268 MB of weights). Dynamo is warmed up first on another model (as in
the benchmark, where other backends compile before trtrtx); then one trtrtx compile runs under
stage timers and cProfile.
    python bench/probes/compile_time.py [float16|float32] [batch]"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench
from rtx_backend import _backend, _engine_cache, _executors, _runtime

SECONDS: dict[str, float] = defaultdict(float)


def timed(owner: object, name: str, label: str) -> None:
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            SECONDS[label] += time.perf_counter() - start

    setattr(owner, name, wrapper)


def main() -> None:
    dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "float32")
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    for owner, name, label in (
        (_backend, "export_region", "export"), (_backend, "parse_network", "parse"),
        (_backend, "check_region", "screen"), (_backend, "_build_for", "build"),
        (_engine_cache.EngineCache, "key", "cache key"), (_engine_cache.EngineCache, "load", "cache load"),
        (_executors.TrtExecutor, "__init__", "executor (deserialize, contexts)"),
        (_runtime, "first_call", "validation (first call)"),
    ):
        timed(owner, name, label)
    warm = torch.nn.Linear(8, 8).cuda()
    torch.compile(warm, backend="eager")(torch.randn(2, 8, device="cuda"))  # Dynamo's own first-use costs
    torch.manual_seed(0)
    model = bench.mlp().eval().to("cuda", dtype).requires_grad_(False)
    x = torch.randn(batch, 4096, device="cuda", dtype=dtype)
    fn = torch.compile(model, backend="trtrtx", options={"engine_cache_dir": str(Path.cwd() / "probe-engines")})
    profile = cProfile.Profile()
    start = time.perf_counter()
    with torch.inference_mode():
        profile.enable()
        fn(x)
        torch.cuda.synchronize()
        profile.disable()
    total = time.perf_counter() - start
    print(f"{dtype} batch {batch}: first call {total:.2f} s; stages:",
          {k: round(v, 3) for k, v in SECONDS.items()}, flush=True)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(45)
    print(text.getvalue()[-9000:])


if __name__ == "__main__":
    main()
