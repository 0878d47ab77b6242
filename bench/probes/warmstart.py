"""GPU probe: where the time to first result goes in a fresh process (ResNet-18, FP16), cold and
with the engine and runtime caches present: seconds per pipeline stage, then cProfile's top
functions of the warm start. Warm children alternate with ones that pay Dynamo's one-time costs
(a tiny module traced by a do-nothing backend) before the clock starts: the difference is
what Dynamo's first trace in a process costs over its later ones.

    python bench/probes/warmstart.py            # parent: a cold child, then warm ones
"""

from __future__ import annotations

import cProfile
import functools
import io
import json
import pstats
import subprocess
import sys
import tempfile
import time
import types

STAGES = [  # (module, function): timed by wrapping, in the child
    ("rtx_backend._backend", "lower"), ("rtx_backend._backend", "compile_graph"),
    ("rtx_backend._backend", "export_and_build"), ("rtx_backend._backend", "export_region"),
    ("rtx_backend._backend", "_build_for"), ("rtx_backend._backend", "choose_executor"),
    ("rtx_backend.cache.engines", "graph_digest"), ("rtx_backend.cache.engines", "EngineCache.load"),
    ("rtx_backend.run.executors", "TrtExecutor.__init__"), ("rtx_backend.run.region", "first_call"),
    ("rtx_backend.run.region", "RegionModule.forward"),
    # the graph-cache hit, piece by piece
    ("rtx_backend._backend", "graph_key"), ("rtx_backend._backend", "from_graph_cache"),
    ("rtx_backend.cache.graphs", "GraphCache.load"), ("rtx_backend._backend", "generate_code"),
    ("rtx_backend.run.executors", "deserialize"), ("rtx_backend.run.executors", "TrtExecutor._make_binding"),
    ("rtx_backend.run.runtime_cache", "attach"), ("rtx_backend.run.executors", "TrtExecutor.__call__"),
    ("rtx_backend.cache.engines", "tensor_digests"), ("rtx_backend.run.executors", "TrtExecutor.ready"),
]


def wrap(timings: dict[str, float], module: str, name: str, label: str | None = None) -> None:
    """Time every call of `module.name` (a function, or "Class.method") into timings[label or name]."""
    import importlib

    mod = importlib.import_module(module)
    owner, attr = (getattr(mod, name.split(".")[0]), name.split(".")[1]) if "." in name else (mod, name)
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            timings[label or name] = timings.get(label or name, 0.0) + time.perf_counter() - t

    setattr(owner, attr, timed)


def synchronous_setup() -> None:
    """Contexts made in the constructor, as before the setup thread (the A/B baseline)."""
    import concurrent.futures

    from rtx_backend.run import executors as _executors

    def submit(fn, *args):
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args))
        except Exception as exc:
            future.set_exception(exc)
        return future

    _executors._SETUP = types.SimpleNamespace(submit=submit)


def dynamo_first_use() -> float:
    """Trace a tiny module with a backend that does nothing: Dynamo's one-time costs in a process
    (lazy imports, rule tables, first fake-tensor dispatches). Returns seconds."""
    import torch

    t = time.perf_counter()
    tiny = torch.compile(torch.nn.Linear(4, 4), backend=lambda gm, example_inputs: gm.forward)
    with torch.inference_mode():
        tiny(torch.randn(2, 4))
    return time.perf_counter() - t


def child(cache: str, profile: bool, sync: bool = False, prewarm: bool = False) -> None:
    t0 = time.perf_counter()
    import torch
    import torchvision

    import rtx_backend

    if sync:
        synchronous_setup()

    t_import = time.perf_counter() - t0
    t_dynamo_first_use = dynamo_first_use() if prewarm else None
    timings: dict[str, float] = {}
    for module, name in STAGES:
        wrap(timings, module, name)
    marks: dict[str, float] = {}  # when Dynamo entered and left the backend, from the compile's start
    backend = sys.modules["rtx_backend._backend"].trtrtx

    def marked(*args, **kwargs):
        marks["backend_in"] = time.perf_counter() - t
        try:
            return backend(*args, **kwargs)
        finally:
            marks["backend_out"] = time.perf_counter() - t

    sys.modules["rtx_backend._backend"].trtrtx = marked  # before Dynamo loads the entry point
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval().cuda().half().requires_grad_(False)
    x = torch.randn(1, 3, 224, 224, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    fn = torch.compile(model, backend="trtrtx", options={
        "engine_cache_dir": f"{cache}/engines", "runtime_cache_path": f"{cache}/runtime.cache"})
    pr = cProfile.Profile()
    t = time.perf_counter()
    with torch.inference_mode():
        if profile:
            pr.enable()
        fn(x)
        torch.cuda.synchronize()
        pr.disable()
    first = time.perf_counter() - t
    rtx_backend.save_runtime_cache()
    split = {"dynamo_trace": marks.get("backend_in"), "backend": marks.get("backend_out", 0) - marks.get("backend_in", 0),
             "after_backend": first - marks.get("backend_out", 0)}
    print(json.dumps({"import_s": t_import, "dynamo_first_use_s": t_dynamo_first_use, "first_result_s": first, "split_s": split,
                      "stages_s": {k: round(v, 3) for k, v in timings.items()}, "stats": rtx_backend.stats()}))
    if profile:
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(60)
        print(s.getvalue()[-9000:], file=sys.stderr)


def main() -> None:
    if len(sys.argv) > 1:
        child(sys.argv[1], sys.argv[2] == "1", "sync" in sys.argv[3:], "prewarm" in sys.argv[3:])
        return
    cache = tempfile.mkdtemp(prefix="trtrtx-warm-")
    runs = [("cold", "0")] + [("warm", "0"), ("warm_dynamo_prewarmed", "0 prewarm")] * 4 + [("warm_profiled", "1")]
    for label, profile in runs:
        res = subprocess.run([sys.executable, __file__, cache, *profile.split()], capture_output=True, text=True)
        print(label, res.stdout.strip().splitlines()[-1] if res.stdout.strip() else res.stderr[-3000:])
        if profile == "1":
            print(res.stderr[-9000:])


if __name__ == "__main__":
    main()
