"""Benchmark trtrtx against eager PyTorch, inductor and Torch-TensorRT-RTX on the same models.

    python bench/bench.py                 # GPU: every model and backend, interleaved rounds
    python bench/bench.py --smoke         # CPU: tiny models, ONNX Runtime path (CI checks it runs)

Backends are measured in one process, in interleaved rounds (the GPU machine is shared and
noisy). Results go to bench/results/<date>-<gpu>-<TensorRT-RTX version>[-<tag>].json and .md, and a
PNG plot; `--tag` names the kind of result (e.g. all-models). bench/report.py makes the tables of
docs/performance.md and the README from them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


# ---- models -------------------------------------------------------------------------------------

def mlp(width: int = 4096, depth: int = 4) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def resnet(depth: int) -> nn.Module:
    import torchvision

    return getattr(torchvision.models, f"resnet{depth}")()


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.down(x))


def resnet50_like() -> nn.Module:
    """ResNet-50's layers, parameters and buffers (torchvision's layout) without torchvision,
    whose wheel does not load next to a CPU build of torch."""
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for k in range(blocks):
            layers.append(Bottleneck(cin, width, stride if k == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    return nn.Sequential(*layers)


def encoder(d: int = 768, layers: int = 6, heads: int = 12) -> nn.Module:
    layer = nn.TransformerEncoderLayer(d, heads, 4 * d, batch_first=True, dropout=0.0)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


class Conv3dNet(nn.Module):
    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv3d(3, c, 3, padding=1), nn.BatchNorm3d(c), nn.ReLU(),
            nn.Conv3d(c, c, 3, stride=2, padding=1), nn.BatchNorm3d(c), nn.ReLU(),
            nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(c, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


# name -> (factory, input shape for a batch, batches, dtypes)
def model_table(smoke: bool) -> dict[str, tuple[Callable[[], nn.Module], Callable[[int], tuple[int, ...]], list[int], list[torch.dtype]]]:
    f16, f32 = torch.float16, torch.float32
    if smoke:
        return {
            "mlp-4x64": (lambda: mlp(64, 4), lambda b: (b, 64), [1, 8], [f32]),
            "encoder-2x64": (lambda: encoder(64, 2, 4), lambda b: (b, 16, 64), [2], [f32]),
        }
    return {
        "mlp-4x4096": (mlp, lambda b: (b, 4096), [1, 256], [f16, f32]),
        "resnet18": (lambda: resnet(18), lambda b: (b, 3, 224, 224), [1, 32], [f16, f32]),
        "resnet50": (lambda: resnet(50), lambda b: (b, 3, 224, 224), [1, 32], [f16, f32]),
        "encoder-6x768": (encoder, lambda b: (b, 256, 768), [1, 16], [f16, f32]),
        "conv3d": (Conv3dNet, lambda b: (b, 3, 16, 64, 64), [1, 8], [f16, f32]),
    }


# ---- backends -----------------------------------------------------------------------------------

def backend_table(smoke: bool, cache_dir: str, background: bool = False,
                  ) -> dict[str, Callable[[nn.Module], Callable[..., Any]]]:
    """Each backend by name, as a function that compiles a model with it. `background`: also
    "trtrtx-bg", trtrtx-cg with its engines built behind the compile (engine_build="background")."""
    trt_opts: dict[str, Any] = {"min_block_size": 1, "engine_cache_dir": os.path.join(cache_dir, "engines"),
                "runtime_cache_path": os.path.join(cache_dir, "runtime.cache")}
    table: dict[str, Callable[[nn.Module], Callable[..., Any]]] = {"eager": lambda m: m}
    if not smoke:
        table["inductor"] = lambda m: torch.compile(m, dynamic=False)
        table["inductor-ro"] = lambda m: torch.compile(m, mode="reduce-overhead", dynamic=False)
        with contextlib.suppress(Exception):
            import torch_tensorrt  # noqa: F401

            table["torch_tensorrt"] = lambda m: torch.compile(
                m, backend="torch_tensorrt", dynamic=False,
                options={"min_block_size": 1, "use_python_runtime": False})
    table["trtrtx"] = lambda m: torch.compile(m, backend="trtrtx", dynamic=False, options=trt_opts)
    if CUDA:
        table["trtrtx-cg"] = lambda m: torch.compile(
            m, backend="trtrtx", dynamic=False,
            options={**trt_opts, "cuda_graph_strategy": "whole_graph_capture"})
        if background:
            table["trtrtx-bg"] = lambda m: torch.compile(
                m, backend="trtrtx", dynamic=False,
                options={**trt_opts, "cuda_graph_strategy": "whole_graph_capture", "engine_build": "background"})
    return table


# ---- measurement --------------------------------------------------------------------------------

def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def latencies(fn: Callable[[], Any], iters: int) -> list[float]:
    """Per-call milliseconds: CUDA events on the GPU, perf_counter on the CPU."""
    out = []
    for _ in range(iters):
        if CUDA:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return out


def device_used() -> int:
    """Bytes in use on the current GPU by the driver's count (every process and allocator)."""
    free, total = torch.cuda.mem_get_info()
    return total - free


class PeakMemory:
    """A block's peak GPU memory above where it stood when the block began, counted two ways:
    - torch_mb: by PyTorch's allocator (max_memory_allocated): what PyTorch allocated, trtrtx's
      engine scratch memory among it, but not what TensorRT-RTX (an engine's weights, a context's
      own memory) or another runtime allocates for itself;
    - device_mb: by the driver (`used`, cudaMemGetInfo by default), polled on a thread every
      `interval` seconds: every allocation of the process, whoever made it. A spike shorter than
      the interval can be missed.
    At the start, garbage is collected and PyTorch's unused cached blocks are returned, so that
    what earlier backends freed is not counted against this one."""

    def __init__(self, used: Callable[[], int] | None = None, interval: float = 0.002) -> None:
        self.used = used if used is not None else (device_used if CUDA else None)
        self.interval = interval
        self.torch_mb: float | None = None
        self.device_mb: float | None = None

    def __enter__(self) -> PeakMemory:
        gc.collect()
        if CUDA:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.torch_base = torch.cuda.memory_allocated()
        self.stop = threading.Event()
        if self.used is not None:
            self.base = self.peak = self.used()
            self.poller = threading.Thread(target=self._poll, daemon=True)
            self.poller.start()
        return self

    def _poll(self) -> None:
        assert self.used is not None
        while not self.stop.wait(self.interval):
            self.peak = max(self.peak, self.used())

    def __exit__(self, *exc: object) -> None:
        sync()
        self.stop.set()
        if self.used is not None:
            self.poller.join()
            self.peak = max(self.peak, self.used())
            self.device_mb = (self.peak - self.base) / 2**20
        if CUDA:
            self.torch_mb = (torch.cuda.max_memory_allocated() - self.torch_base) / 2**20


def p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


def run_config(name: str, factory: Callable[[], nn.Module], shape: tuple[int, ...], dtype: torch.dtype,
               backends: dict[str, Callable[[nn.Module], Callable[..., Any]]], rounds: int, iters: int) -> dict[str, Any]:
    import rtx_backend

    torch.manual_seed(0)
    base = factory().eval()
    x32 = torch.randn(*shape, device=DEVICE)
    with torch.inference_mode():
        ref = base.to(DEVICE)(x32).float()
    model = base.to(DEVICE, dtype).requires_grad_(False)
    x = x32.to(dtype)
    from rtx_backend._record import recording

    results: dict[str, dict[str, Any]] = {}
    compiled: dict[str, Callable[..., Any]] = {}
    regions: dict[str, list[Any]] = {}
    for bname, make in backends.items():
        torch._dynamo.reset()
        rtx_backend.reset_stats()
        row: dict[str, Any] = {}
        try:
            with PeakMemory() as memory:  # the compile and the first calls
                fn = make(model)
                t = time.perf_counter()
                with torch.inference_mode(), recording() as graphs:
                    out = fn(x)
                    sync()
                row["cold_compile_s"] = time.perf_counter() - t
                regions[bname] = [r for g in graphs for r in g.regions]
                with torch.inference_mode():
                    for _ in range(3):
                        out = fn(x)
            row["max_err_vs_fp32"] = (out.float() - ref).abs().max().item()
            row["peak_device_mb"], row["peak_torch_mb"] = memory.device_mb, memory.torch_mb
            row["engine_builds"] = rtx_backend.stats().get("engine_builds", 0) if "trtrtx" in bname else None
            compiled[bname] = fn
            row["lat"] = []
        except Exception as exc:  # a backend that cannot compile this model is a result too
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        results[bname] = row
    # Each compile above began with torch._dynamo.reset(), which drops the earlier backends' code:
    # their first call here compiles again (from the engine cache). Keep the regions in use now.
    for bname, fn in compiled.items():
        with torch.inference_mode(), recording() as graphs:
            fn(x)
        if graphs:
            regions[bname] = [r for g in graphs for r in g.regions]
    sync()
    for _ in range(rounds):  # interleaved rounds
        for bname, fn in compiled.items():
            with torch.inference_mode():
                results[bname]["lat"] += latencies(functools.partial(fn, x), iters)
    for bname, row in results.items():
        lat = row.pop("lat", None)
        if lat:
            row["median_ms"] = statistics.median(lat)
            row["p90_ms"] = p90(lat)
            row["regions"] = len(regions.get(bname, [])) if "trtrtx" in bname else None
            # regions that failed first-call validation (or never built) run in PyTorch: say so
            row["regions_in_pytorch"] = sum(r.kind == "pytorch" for r in regions.get(bname, []))
        if lat and CUDA and regions.get(bname):
            row["engine_ms"] = engine_ms(compiled[bname], x, regions[bname], iters)
    return {"model": name, "shape": list(shape), "dtype": str(dtype).removeprefix("torch."), "backends": results}


def engine_ms(fn: Callable[..., Any], x: torch.Tensor, regions: list[Any], iters: int) -> float | None:
    """Per call, the time of the model's TensorRT-RTX executors alone (CUDA events), on the inputs
    each region receives: at a large batch, the engine time; the rest of a call is everything else."""
    from rtx_backend.run.executors import TrtExecutor

    seen: dict[int, list[torch.Tensor]] = {}

    def keep(module: Any, args: tuple[Any, ...]) -> None:
        if module.onnx is not None:
            seen[id(module)] = [args[i] for i in module.onnx.tensor_args]

    handles = [r.register_forward_pre_hook(keep) for r in regions]
    try:
        with torch.inference_mode():
            fn(x)
    finally:
        for h in handles:
            h.remove()
    runs = [(r.executor, seen[id(r)]) for r in regions if isinstance(r.executor, TrtExecutor) and id(r) in seen]
    if not runs:
        return None
    with torch.inference_mode():
        for ex, tensors in runs:
            ex.run((), tensors)
        lat = latencies(lambda: [ex.run((), tensors) for ex, tensors in runs], iters)
    return statistics.median(lat)


def dynamic_sweep(smoke: bool, cache_dir: str, backends: list[str]) -> dict[str, Any]:
    """One encoder over 8 sequence lengths with dynamic=True: recompiles, engine builds, first-call
    time and error per length, for each backend."""
    import rtx_backend

    d, layers, heads = (64, 2, 4) if smoke else (256, 4, 8)
    dtype = torch.float32 if smoke else torch.float16
    model = encoder(d, layers, heads).eval().to(DEVICE, dtype).requires_grad_(False)
    lengths = [8, 16, 24, 32, 48, 64, 96, 128]
    options: dict[str, dict[str, Any]] = {
        "trtrtx": {"min_block_size": 1, "engine_cache_dir": ""},
        "inductor": {},
        "torch_tensorrt": {"min_block_size": 1, "use_python_runtime": False},
    }

    def make(bname: str) -> Callable[..., Any]:
        backend = "inductor" if bname == "inductor" else bname
        return torch.compile(model, backend=backend, dynamic=True, options=options[bname] or None)

    out: dict[str, Any] = {"lengths": lengths}
    for bname in backends:
        if bname not in options or (smoke and bname != "trtrtx"):
            continue
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        rtx_backend.reset_stats()
        per = []
        try:
            fn = make(bname)
            with torch.inference_mode():
                for n in lengths:
                    x = torch.randn(4, n, d, device=DEVICE, dtype=dtype)
                    t = time.perf_counter()
                    y = fn(x)
                    sync()
                    first = time.perf_counter() - t
                    err = (y.float() - model(x).float()).abs().max().item()
                    per.append({"len": n, "first_call_s": first, "max_err_vs_eager": err})
        except Exception as exc:
            out[bname] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}", "per_length": per}
            continue
        s = rtx_backend.stats()
        graphs = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
        breaks = int(sum(torch._dynamo.utils.counters["graph_break"].values()))
        out[bname] = {"compiled_graphs": graphs, "recompiles": max(0, graphs - 1), "graph_breaks": breaks,
                      "engine_builds": s.get("engine_builds", 0) if bname == "trtrtx" else None,
                      "per_length": per}
    return out


START_KINDS = ("cold", "warm", "warm_engine_cache_only", "warm_no_runtime_cache")


def fresh_process_starts(rounds: int) -> dict[str, Any]:
    """Time to first result in fresh processes: cold, warm (every cache), warm with the engine
    cache alone (no graph-cache entries: the graph is lowered again), warm without the runtime
    cache; `rounds` times, each round in a new cache directory, and the median of each kind
    (one child per sample: a fresh process is noisy on a shared host)."""
    samples: dict[str, list[dict[str, Any]]] = {kind: [] for kind in START_KINDS}
    for _ in range(rounds):
        cache_dir = tempfile.mkdtemp(prefix="trtrtx-starts-")
        child = [sys.executable, str(Path(__file__)), "--child-start", cache_dir]
        for kind in START_KINDS:
            if kind == "warm_engine_cache_only":
                for path in Path(cache_dir, "engines").glob("*.graph"):
                    path.unlink()
            if kind == "warm_no_runtime_cache":
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(cache_dir, "runtime.cache"))
            res = subprocess.run(child, capture_output=True, text=True, timeout=600)
            try:
                samples[kind].append(json.loads(res.stdout.strip().splitlines()[-1]))
            except Exception:
                samples[kind].append({"error": res.stderr[-500:]})
    out: dict[str, Any] = {}
    for kind, runs in samples.items():
        good = [r for r in runs if "first_result_s" in r]
        if not good:
            out[kind] = runs[-1]
            continue
        out[kind] = {**good[-1], "first_result_s": statistics.median(r["first_result_s"] for r in good),
                     "import_s": statistics.median(r["import_s"] for r in good),
                     "first_result_samples_s": [round(r["first_result_s"], 3) for r in good]}
    return out


def child_start(cache_dir: str) -> None:
    t0 = time.perf_counter()
    import rtx_backend

    model_name = "resnet18" if CUDA else "mlp"
    torch.manual_seed(0)  # the same weights in every child: the engine-cache key covers them
    model = (resnet(18) if CUDA else mlp(64, 4)).eval().to(DEVICE, torch.float16 if CUDA else torch.float32)
    model.requires_grad_(False)
    x = torch.randn(1, 3, 224, 224) if CUDA else torch.randn(1, 64)
    x = x.to(DEVICE, next(model.parameters()).dtype)
    t1 = time.perf_counter()
    fn = torch.compile(model, backend="trtrtx", options={
        "min_block_size": 1, "engine_cache_dir": os.path.join(cache_dir, "engines"),
        "runtime_cache_path": os.path.join(cache_dir, "runtime.cache")})
    with torch.inference_mode():
        fn(x)
        sync()
        t2 = time.perf_counter()
        fn(x)
        sync()
    t3 = time.perf_counter()
    with contextlib.suppress(Exception):
        rtx_backend.save_runtime_cache()  # type: ignore[attr-defined]
    print(json.dumps({"model": model_name, "import_s": t1 - t0, "first_result_s": t2 - t1,
                      "second_call_s": t3 - t2, "stats": rtx_backend.stats()}))


def overhead(cache_dir: str) -> dict[str, Any]:
    """Host time per call of a one-engine model (microseconds), split three ways: the engine's own
    enqueue, Dynamo's floor (the same model compiled by a backend whose graph returns a ready
    tensor: Dynamo's frame, guards and wrappers, which any torch.compile backend pays) and ours
    (the rest: the compiled graph, the region module and the executor)."""
    from rtx_backend._record import recording

    model = mlp(256, 2).eval().to(DEVICE, torch.float16).requires_grad_(False)
    x = torch.randn(1, 256, device=DEVICE, dtype=torch.float16)
    n, rounds = 1000, 15

    def per_call(fn: Any) -> float:
        with torch.inference_mode():
            for _ in range(50):
                fn(x)
            sync()
            t = time.perf_counter()
            for _ in range(n):
                fn(x)
            seconds = (time.perf_counter() - t) / n
            sync()
        return seconds * 1e6

    with torch.inference_mode():
        ready = model(x)
    torch._dynamo.reset()
    floor_fn = torch.compile(model, backend=lambda gm, example_inputs: (lambda *args: (ready,)))
    out: dict[str, Any] = {}
    for label, strategy in (("disabled", "disabled"), ("whole_graph_capture", "whole_graph_capture")):
        torch._dynamo.reset()
        fn = torch.compile(model, backend="trtrtx", options={"min_block_size": 1, "engine_cache_dir": "",
                                                             "cuda_graph_strategy": strategy})
        with torch.inference_mode(), recording() as graphs:
            for _ in range(20):
                fn(x)
        sync()
        regions = [r for g in graphs for r in g.regions]
        executor = regions[0].executor if regions else None
        ctx = getattr(executor, "context", None)
        stream = torch.cuda.current_stream().cuda_stream
        timed: dict[str, Any] = {"call_us": fn, "dynamo_floor_us": floor_fn}
        if ctx is not None:
            timed["enqueue_us"] = functools.partial(lambda c, s, _: c.execute_async_v3(s), ctx, stream)
        samples: dict[str, list[float]] = {k: [] for k in timed}
        for _ in range(rounds):  # short interleaved rounds: the host is shared and its speed drifts
            for k, call in timed.items():
                samples[k].append(per_call(call))
        row: dict[str, Any] = {"regions": len(regions), "kind": regions[0].kind if regions else None,
                               "weight_check_us": weight_check_us(model, x)}  # part of ours_us
        row.update({k: statistics.median(v) for k, v in samples.items()})
        if "enqueue_us" in samples:
            # each split is the median of its per-round differences (paired: a drift of the host's
            # speed between rounds cancels out), not a difference of medians
            paired = list(zip(samples["call_us"], samples["enqueue_us"], samples["dynamo_floor_us"]))
            ours = [c - e - f for c, e, f in paired]
            row["overhead_us"] = statistics.median(c - e for c, e, _ in paired)
            row["ours_us"] = statistics.median(ours)
            row["ours_us_quartiles"] = [round(q, 2) for q in statistics.quantiles(ours, n=4)]
        out[label] = row
    return out


def weight_check_us(model: nn.Module, x: torch.Tensor, rounds: int = 15, n: int = 2000) -> float:
    """Host time per call of the weight check (options weights="checked") for `model`: its
    WeightGuard around a graph that returns at once, against that graph alone, called with the
    inputs Dynamo passes (the input, then every parameter and buffer: an upper bound, as a
    compiled graph checks only those its regions read, e.g. not BatchNorm's num_batches_tracked).
    Median of interleaved rounds."""
    from rtx_backend._options import Options
    from rtx_backend.assemble.weights import WeightGuard

    args = [x, *model.parameters(), *model.buffers()]
    ready = (x,)

    def graph(*a: Any) -> Any:
        return ready

    guard = WeightGuard(graph, [], args, list(range(1, len(args))), graph, Options(), dict)

    def per_call(fn: Any) -> float:
        t = time.perf_counter()
        for _ in range(n):
            fn(*args)
        return (time.perf_counter() - t) / n * 1e6

    diffs = [per_call(guard) - per_call(graph) for _ in range(rounds)]
    return statistics.median(diffs)


def weight_checks() -> dict[str, Any]:
    """The per-call cost of the weight check on the bench's models (CPU-runnable: the check is
    host work only, the same on every path)."""
    out: dict[str, Any] = {}
    for name, factory, shape in (("mlp-2x256", lambda: mlp(256, 2), (1, 256)), ("mlp-4x4096", lambda: mlp(4096, 4), (1, 4096)),
                                 ("resnet50-like", resnet50_like, (1, 3, 224, 224))):
        model = factory().eval()
        weights = sum(1 for _ in model.parameters()) + sum(1 for _ in model.buffers())
        out[name] = {"weights": weights, "check_us": round(weight_check_us(model, torch.zeros(shape)), 3)}
    if CUDA:
        out["resnet50-like-b1-fp16-cg"] = checked_against_frozen(resnet50_like, (1, 3, 224, 224))
    return out


def checked_against_frozen(factory: Callable[[], nn.Module], shape: tuple[int, ...], rounds: int = 7,
                           iters: int = 200) -> dict[str, Any]:
    """What the check costs a whole call: the model (FP16, TensorRT-RTX's CUDA graphs) compiled
    with weights="checked" and with weights="frozen", latency medians of interleaved rounds. The
    check runs while the GPU runs the call (the graph is enqueued first), so its host time shows
    only where the host, not the GPU, is the limit."""
    torch.manual_seed(0)
    model = factory().eval().to(DEVICE, torch.float16).requires_grad_(False)
    x = torch.randn(shape, device=DEVICE, dtype=torch.float16)
    fns = {}
    for mode in ("checked", "frozen"):
        torch._dynamo.reset()
        fns[mode] = torch.compile(model, backend="trtrtx", dynamic=False, options={
            "min_block_size": 1, "weights": mode, "cuda_graph_strategy": "whole_graph_capture"})
        with torch.inference_mode():
            for _ in range(5):
                fns[mode](x)
    lat: dict[str, list[float]] = {m: [] for m in fns}
    with torch.inference_mode():
        for fn in fns.values():  # each compile reset Dynamo: compiled again here (engines from the cache)
            for _ in range(5):
                fn(x)
        for _ in range(rounds):
            for mode, fn in fns.items():
                lat[mode] += latencies(lambda fn=fn: fn(x), iters)
    checked, frozen = statistics.median(lat["checked"]), statistics.median(lat["frozen"])
    return {"checked_ms": round(checked, 4), "frozen_ms": round(frozen, 4),
            "check_share_of_call": round((checked - frozen) / frozen, 4)}


def check_share(results: dict[str, Any]) -> None:
    """The weight check's cost on ResNet-50 as a share of a ResNet-50 batch-1 call of trtrtx with
    CUDA graphs, where both were measured in this run."""
    check = results.get("weight_check", {}).get("resnet50-like")
    for config in results.get("configs", []):
        if config["model"] == "resnet50" and config["shape"][0] == 1 and check:
            for backend in ("trtrtx-cg", "trtrtx"):
                ms = config["backends"].get(backend, {}).get("median_ms")
                if ms:
                    check[f"share_of_{backend}_{config['dtype']}_b1_call"] = round(check["check_us"] / (ms * 1e3), 5)


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
                           "python": platform.python_version(), "device": DEVICE}
    with contextlib.suppress(Exception):
        import tensorrt_rtx

        env["tensorrt_rtx"] = tensorrt_rtx.__version__
    with contextlib.suppress(Exception):
        import torch_tensorrt

        env["torch_tensorrt"] = torch_tensorrt.__version__
    # imports are much slower where Python compiles every module's source in every process
    env["bytecode"] = ("not cached (PYTHONDONTWRITEBYTECODE)" if sys.dont_write_bytecode
                       else f"cached in {sys.pycache_prefix}" if sys.pycache_prefix else "cached beside the sources")
    if CUDA:
        env["gpu"] = torch.cuda.get_device_name()
        with contextlib.suppress(Exception):
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True).stdout.strip()
    return env


def result_path(kind: str, env: dict[str, Any], folder: Path | None = None) -> Path:
    """bench/results/<date>-<GPU or cpu>-<TensorRT-RTX major.minor.patch>-<kind>.json."""
    version = ".".join(str(env.get("tensorrt_rtx", "0.0.0")).split(".")[:3])
    device = str(env.get("gpu", "cpu")).replace(" ", "-")
    return (folder or Path(__file__).parent / "results") / f"{env['date']}-{device}-{version}-{kind}.json"


@functools.cache
def _report() -> Any:
    """bench/report.py, which judges a saved result the same way (loaded by path: both are scripts)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_report", Path(__file__).parent / "report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wrong(config: dict[str, Any], backend: str) -> bool:
    """Whether a backend's result is far off FP32 eager (report.wrong): a fast wrong answer is not
    a result, so such timings are marked and left out of the ratios."""
    return bool(_report().wrong(config, backend))


def table(results: dict[str, Any]) -> str:
    names = sorted({b for c in results["configs"] for b in c["backends"]}, key=list(results["backends"]).index)
    lines = ["| model | shape | dtype | " + " | ".join(f"{b} ms (p90)" for b in names) + " |",
             "|---|---|---|" + "---|" * len(names)]
    for c in results["configs"]:
        cells = []
        for b in names:
            row = c["backends"].get(b, {})
            cells.append(f"{row['median_ms']:.3f} ({row['p90_ms']:.3f}){' WRONG' if wrong(c, b) else ''}"
                         if "median_ms" in row else ("fail" if "error" in row else "-"))
        lines.append(f"| {c['model']} | {tuple(c['shape'])} | {c['dtype']} | " + " | ".join(cells) + " |")
    lines += ["", "Ratios (best trtrtx strategy / peer; below 1 is faster) and trtrtx's time split:", "",
              "| model | shape | dtype | vs torch_tensorrt | vs inductor-ro | vs inductor | engine ms | other ms |",
              "|---|---|---|---|---|---|---|---|"]
    peers = ("torch_tensorrt", "inductor-ro", "inductor")
    found: dict[str, list[float]] = {p: [] for p in peers}
    for c in results["configs"]:
        b = c["backends"]
        ours = [(b[k]["median_ms"], k) for k in ("trtrtx", "trtrtx-cg") if "median_ms" in b.get(k, {})]
        if ours and all(wrong(c, k) for _, k in ours):
            lines.append(f"| {c['model']} | {tuple(c['shape'])} | {c['dtype']} | wrong results | | | | |")
            continue
        ours = [(ms, k) for ms, k in ours if not wrong(c, k)]
        if not ours:
            continue
        best, key = min(ours)
        engine = b[key].get("engine_ms")
        split = (f"{engine:.3f} | {best - engine:.3f}") if engine is not None else "- | -"
        against = {p: best / b[p]["median_ms"] for p in peers if "median_ms" in b.get(p, {})}
        for p, ratio in against.items():
            found[p].append(ratio)
        ratios = " | ".join(f"{against[p]:.2f}" if p in against else "-" for p in peers)
        lines.append(f"| {c['model']} | {tuple(c['shape'])} | {c['dtype']} | {ratios} | {split} |")
    if any(found.values()):
        lines.append("| geometric mean (configurations; at most 1.0) | | | " + " | ".join(
            f"{statistics.geometric_mean(r):.2f} ({len(r)}; {sum(x <= 1.0 for x in r)})" if r else "-"
            for r in found.values()) + " | | |")
    lines += ["", "Peak MB: the GPU memory that compiling and the first calls took, above where it stood before "
              "(device: the driver's count, TensorRT-RTX's and other runtimes' own memory included; in brackets, "
              "PyTorch's allocator alone). Earlier results (`peak MB`) counted PyTorch's allocator alone, "
              "from zero. Cold compile: the first call, compile included; in brackets, trtrtx's seconds in "
              "its stages (ONNX export, screen, engine build, runtime setup, first-call validation), where "
              "measured; the rest is Dynamo, AOTAutograd, partitioning and the first run.",
              "", "| model | shape | dtype | backend | cold compile s | peak MB device (torch) | max err vs fp32 | engine builds "
              "| regions (in PyTorch) |", "|---|---|---|---|---|---|---|---|---|"]
    for c in results["configs"]:
        for b, row in c["backends"].items():
            if "error" in row:
                lines.append(f"| {c['model']} | {tuple(c['shape'])} | {c['dtype']} | {b} | error: {row['error'][:80]} | | | | |")
                continue
            mem = memory_cell(row)
            lines.append(f"| {c['model']} | {tuple(c['shape'])} | {c['dtype']} | {b} | {cold_cell(row)} | "
                         f"{mem} | {row['max_err_vs_fp32']:.2e} | {row.get('engine_builds') if row.get('engine_builds') is not None else '-'} | "
                         f"{row.get('regions') if row.get('regions') is not None else '-'} ({row.get('regions_in_pytorch', '-')}) |")
    return "\n".join(lines)


def cold_cell(row: dict[str, Any]) -> str:
    """Cold compile seconds, with trtrtx's stages (`stage_s`) in brackets where they were measured;
    the rest of the time is Dynamo's trace, AOTAutograd, partitioning and the first run."""
    stages = row.get("stage_s")
    split = f" ({', '.join(f'{k} {v:.1f}' for k, v in stages.items())})" if stages else ""
    # (engines built behind the compile: the first call ran in PyTorch, the engines took over later)
    ready = f"; engines in place at {row['engines_ready_s']:.2f}" if "engines_ready_s" in row else ""
    return f"{row['cold_compile_s']:.2f}{split}{ready}"


def memory_cell(row: dict[str, Any]) -> str:
    """`device (torch)` peak MB; `peak_mem_mb` alone in results saved before both were measured."""
    device, torch_mb = row.get("peak_device_mb"), row.get("peak_torch_mb", row.get("peak_mem_mb"))
    if device is None and torch_mb is None:
        return "-"
    if device is not None and torch_mb is not None:
        return f"{device:.0f} ({torch_mb:.0f})"
    return f"{device if device is not None else torch_mb:.0f}"


def plot(results: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return False
    configs = results["configs"]
    names = list(results["backends"])
    fig, ax = plt.subplots(figsize=(max(8, len(configs) * 1.4), 4.5))
    width = 0.8 / max(1, len(names))
    for i, b in enumerate(names):
        ys = [c["backends"].get(b, {}).get("median_ms", 0) for c in configs]
        ax.bar([k + i * width for k in range(len(configs))], ys, width, label=b)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(configs))])
    ax.set_xticklabels([f"{c['model']}\n{c['shape'][0]} {c['dtype']}" for c in configs], fontsize=7)
    ax.set_ylabel("median latency (ms)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_title(f"{results['env'].get('gpu', 'cpu')} TensorRT-RTX {results['env'].get('tensorrt_rtx')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny models on CPU (ONNX Runtime path)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--models", default="", help="comma-separated subset of models")
    parser.add_argument("--backends", default="", help="comma-separated subset of backends")
    parser.add_argument("--dtypes", default="", help="comma-separated subset of dtypes: float16,float32")
    parser.add_argument("--configs", default="", help="comma-separated model:batch:dtype, run in this order "
                        "(instead of --models/--dtypes), e.g. resnet18:1:float16,mlp-4x4096:256:float16")
    parser.add_argument("--parts", default="starts,overhead,weights,sweep,models",
                        help="what to measure, in this order: starts,overhead,weights,sweep,models")
    parser.add_argument("--sweep-backends", default="trtrtx",
                        help="backends of the dynamic sweep: trtrtx,inductor,torch_tensorrt")
    parser.add_argument("--start-rounds", type=int, default=3,
                        help="fresh-process starts: rounds of the four kinds, each in a new cache directory (medians)")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--tag", default="")
    parser.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                        help="combine result files of one GPU and TensorRT-RTX version (parts run in "
                        "parallel processes, e.g. one per GPU) into one result under --out/--tag")
    parser.add_argument("--child-start", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_start:
        child_start(args.child_start)
        return
    if args.merge:
        merged = merge([json.loads(Path(f).read_text()) for f in args.merge])
        env = merged["env"]
        stem = Path(args.out) / result_name(env, args.tag)
        print(save(merged, stem))
        print(f"saved {stem}.json/.md" + (" and .png" if plot(merged, stem.with_name(stem.name + ".png")) else ""))
        return
    torch._dynamo.config.cache_size_limit = 256
    torch._dynamo.config.accumulated_cache_size_limit = 4096
    smoke = args.smoke or not CUDA
    cache_dir = tempfile.mkdtemp(prefix="trtrtx-bench-")
    backends = backend_table(smoke, cache_dir)
    if args.backends:
        backends = {k: v for k, v in backends.items() if k in args.backends.split(",")}
    models = model_table(smoke)
    if args.models:
        models = {k: v for k, v in models.items() if k in args.models.split(",")}
    results: dict[str, Any] = {"env": environment(), "backends": list(backends), "configs": []}
    if any(b.startswith("trtrtx") for b in backends):
        import rtx_backend

        # trtrtx's one-time setup (the exporter's imports and registry index) outside the timed first
        # compile, as `import torch_tensorrt` in backend_table is for its peer; its cost is reported
        results["env"]["trtrtx_preload_s"] = round(sum(rtx_backend.preload().values()), 3)
    rounds, iters = (2, 5) if smoke else (args.rounds, args.iters)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / result_name(results["env"], "-".join(t for t in (args.tag, "smoke" if smoke else "") if t))
    # each part is saved as it ends: a time limit keeps what finished
    for part in args.parts.split(","):
        print(f"-- {part}", flush=True)
        if part == "starts":
            results["fresh_process"] = fresh_process_starts(args.start_rounds)
        elif part == "overhead" and CUDA:
            results["overhead"] = overhead(cache_dir)
        elif part == "weights":
            results["weight_check"] = weight_checks()
        elif part == "sweep":
            results["dynamic_sweep"] = dynamic_sweep(smoke, cache_dir, args.sweep_backends.split(","))
        elif part == "models":
            for name, batch, dtype in plan(models, args.configs, args.dtypes):
                factory, shape_of = models[name][0], models[name][1]
                print(f"-- {name} batch {batch} {dtype}", flush=True)
                results["configs"].append(
                    run_config(name, factory, shape_of(batch), dtype, backends, rounds, iters))
                save(results, stem)
        save(results, stem)
    check_share(results)
    text = save(results, stem)
    print(text)
    for key in ("dynamic_sweep", "overhead", "weight_check", "fresh_process"):
        if key in results:
            print(f"\n{key}: {json.dumps(results[key], indent=1)}")
    print(f"saved {stem}.json/.md" + (" and .png" if plot(results, stem.with_name(stem.name + ".png")) else " (no plot: matplotlib missing)"))


def plan(models: dict[str, Any], configs: str, dtypes: str) -> list[tuple[str, int, torch.dtype]]:
    """(model, batch, dtype) to run, in order: the --configs list, or every model's own table."""
    if configs:
        out = []
        for item in configs.split(","):
            name, batch, dtype = item.split(":")
            if name not in models:
                raise SystemExit(f"unknown model {name!r}; known: {', '.join(models)}")
            out.append((name, int(batch), getattr(torch, dtype)))
        return out
    wanted = set(dtypes.split(",")) if dtypes else None
    return [(name, batch, dtype) for name, (_, _, batches, types) in models.items() for dtype in types
            if not wanted or str(dtype).removeprefix("torch.") in wanted for batch in batches]


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from several: configs in order, backends in first-seen order, each other part
    (starts, overhead, sweep) from the file that has it. Files of different GPUs or versions are
    not comparable side by side, so they are refused."""
    keys = ("gpu", "tensorrt_rtx", "torch", "driver")
    first = parts[0]["env"]
    for p in parts[1:]:
        diff = [k for k in keys if p["env"].get(k) != first.get(k)]
        if diff:
            raise SystemExit(f"cannot merge results that differ in {', '.join(diff)}")
    out: dict[str, Any] = {"env": dict(first), "backends": [], "configs": []}
    for p in parts:
        out["backends"] += [b for b in p["backends"] if b not in out["backends"]]
        out["configs"] += p["configs"]
        for key in ("fresh_process", "overhead", "weight_check", "dynamic_sweep"):
            if key in p:
                out.setdefault(key, p[key])
    return out


def result_name(env: dict[str, Any], kind: str = "") -> str:
    """<date>-<gpu>-<TensorRT-RTX version>[-<kind>]: bench/results keeps the latest of each."""
    version = ".".join(str(env.get("tensorrt_rtx") or "none").split(".")[:3])
    return "-".join(p for p in (env["date"], env.get("gpu", "cpu").replace(" ", "-"), version, kind) if p)


def save(results: dict[str, Any], stem: Path) -> str:
    text = table(results)
    stem.with_name(stem.name + ".json").write_text(json.dumps(results, indent=1))
    extra = "".join(f"\n## {k}\n\n```json\n{json.dumps(results[k], indent=1)}\n```\n"
                    for k in ("fresh_process", "overhead", "weight_check", "dynamic_sweep") if k in results)
    stem.with_name(stem.name + ".md").write_text(
        f"# {stem.name}\n\n```\n{json.dumps(results['env'], indent=1)}\n```\n\n{text}\n{extra}")
    return text


if __name__ == "__main__":
    main()
