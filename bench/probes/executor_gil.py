"""GPU probe: how long TensorRT-RTX takes to set up a ResNet-18 FP16 engine (deserialize, create
an execution context, first run) and whether each step lets other Python threads run (the GIL):
the main thread counts loop iterations while the step runs in a second thread, against the
count of a free loop of the same duration.

    python bench/probes/executor_gil.py
"""

from __future__ import annotations

import json
import threading
import time

import torch
import torchvision

from rtx_backend import _trt
from rtx_backend._record import recording


def spin_rate(seconds: float = 0.2) -> float:
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        n += 1
    return n / seconds


def in_thread(step, rate: float) -> dict[str, float]:
    """Run step() in a thread; the main thread spins until it is done."""
    done = threading.Event()
    box: dict[str, object] = {}

    def work() -> None:
        t = time.perf_counter()
        box["value"] = step()
        box["seconds"] = time.perf_counter() - t
        done.set()

    n, t = 0, time.perf_counter()
    threading.Thread(target=work).start()
    while not done.is_set():
        n += 1
    wall = time.perf_counter() - t
    return {"step_s": round(float(box["seconds"]), 4), "main_thread_share": round(n / (rate * wall), 3)}


def main() -> None:
    model = torchvision.models.resnet18().eval().cuda().half().requires_grad_(False)
    x = torch.randn(1, 3, 224, 224, device="cuda", dtype=torch.float16)
    fn = torch.compile(model, backend="trtrtx", options={"engine_cache_dir": ""})
    with torch.inference_mode(), recording() as graphs:
        fn(x)
    engine_bytes = graphs[0].regions[0].engine
    trt = _trt.trt()
    rate = spin_rate()
    rows = {}
    for i in range(3):
        runtime = trt.Runtime(_trt.logger())
        t = time.perf_counter()
        engine = runtime.deserialize_cuda_engine(engine_bytes)
        rows[f"deserialize_{i}_s"] = round(time.perf_counter() - t, 4)
        config = engine.create_runtime_config()
        config.set_execution_context_allocation_strategy(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
        t = time.perf_counter()
        ctx = engine.create_execution_context(config)
        rows[f"context_{i}_s"] = round(time.perf_counter() - t, 4)
        del ctx, engine
    runtime = trt.Runtime(_trt.logger())
    rows["deserialize_in_thread"] = in_thread(lambda: runtime.deserialize_cuda_engine(engine_bytes), rate)
    engine = runtime.deserialize_cuda_engine(engine_bytes)
    config = engine.create_runtime_config()
    config.set_execution_context_allocation_strategy(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
    rows["context_in_thread"] = in_thread(lambda: engine.create_execution_context(config), rate)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
