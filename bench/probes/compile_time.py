"""GPU probe: where a cold compile's time goes, stage by stage, for the benchmark's MLP (4x4096,
FP32 batch 256 by default: 268 MB of weights). As in the benchmark, Dynamo is warmed up first on
another model, trtrtx is preloaded and the model runs eagerly once; then each listed
configuration compiles under stage timers (one process, in order).
    python bench/probes/compile_time.py [float16 1 float32 256 ...] [--profile]"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from probes.warmstart import wrap

import bench
import rtx_backend

DEV = "cuda" if torch.cuda.is_available() else "cpu"
def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


SECONDS: dict[str, float] = defaultdict(float)


def compile_once(dtype: torch.dtype, batch: int, profile: bool) -> None:
    SECONDS.clear()
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = bench.mlp().eval().to(DEV, dtype).requires_grad_(False)
    x = torch.randn(batch, 4096, device=DEV, dtype=dtype)
    with torch.inference_mode():
        model(x)  # eager first, as in the benchmark (cuBLAS is initialised by then)
    sync()
    fn = torch.compile(model, backend="trtrtx", options={"engine_cache_dir": tempfile.mkdtemp(prefix="probe-engines-")})
    profiler = cProfile.Profile()
    start = time.perf_counter()
    with torch.inference_mode():
        if profile:
            profiler.enable()
        fn(x)
        sync()
        if profile:
            profiler.disable()
    total = time.perf_counter() - start
    print(f"{dtype} batch {batch}: first call {total:.2f} s; stages:",
          {k: round(v, 3) for k, v in SECONDS.items()}, flush=True)
    if profile:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(45)
        print(text.getvalue()[-9000:])


def main() -> None:
    """Args: [dtype batch]... (default float32 256); --profile adds cProfile (which slows Python
    down several times, and in Python 3.12 sees every thread)."""
    args = [a for a in sys.argv[1:] if a != "--profile"]
    configs = [(getattr(torch, args[i]), int(args[i + 1])) for i in range(0, len(args), 2)] or [(torch.float32, 256)]
    for module, name, label in (
        ("rtx_backend._backend", "lower", "lower (aot_autograd and ours)"),
        ("rtx_backend._backend", "compile_graph", "ours (compile_graph)"),
        ("rtx_backend._backend", "export_region", "export"), ("rtx_backend._backend", "parse_network", "parse"),
        ("rtx_backend._backend", "check_region", "screen"), ("rtx_backend._backend", "_build_for", "build"),
        ("rtx_backend._engine_cache", "EngineCache.key", "cache key"),
        ("rtx_backend._engine_cache", "EngineCache.load", "cache load"),
        ("rtx_backend._executors", "TrtExecutor.__init__", "executor (deserialize, contexts)"),
        ("rtx_backend._runtime", "first_call", "validation (first call)"),
    ):
        wrap(SECONDS, module, name, label)
    warm = torch.nn.Linear(8, 8).to(DEV)
    torch.compile(warm, backend="eager")(torch.randn(2, 8, device=DEV))  # Dynamo's own first-use costs
    print("preload", rtx_backend.preload(), flush=True)
    for dtype, batch in configs:
        compile_once(dtype, batch, "--profile" in sys.argv)


if __name__ == "__main__":
    main()
