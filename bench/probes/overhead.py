# ruff: noqa: B023  (the lambdas run before the loop moves on)
"""GPU probe: where the host time of one compiled call goes (microseconds per call), layer by layer:
TensorRT-RTX enqueue, our executor, the region module, the whole compiled model (Dynamo around
it), and Dynamo's floor (a compiled graph that does nothing); then the top functions of a
cProfile run."""

from __future__ import annotations

import cProfile
import io
import pstats
import time

import torch

from rtx_backend._record import recording


def per_call_us(fn, n: int = 3000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return dt / n * 1e6


def one_engine_model() -> tuple[torch.nn.Module, torch.Tensor]:
    """A small FP16 MLP that compiles to one engine, and its batch-1 input."""
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    return model.eval().cuda().half().requires_grad_(False), torch.randn(1, 256, device="cuda", dtype=torch.float16)


def main() -> None:
    model, x = one_engine_model()
    with torch.inference_mode():
        out = model(x)
    # the least any torch.compile backend costs here: Dynamo's frame and guards around a graph that
    # does nothing (its compiled function returns a ready tensor)
    floor = torch.compile(model, backend=lambda gm, example_inputs: (lambda *args: (out,)))
    for strategy in ("disabled", "whole_graph_capture"):
        torch._dynamo.reset()
        fn = torch.compile(model, backend="trtrtx", options={
            "min_block_size": 1, "engine_cache_dir": "", "cuda_graph_strategy": strategy})
        with torch.inference_mode(), recording() as graphs:
            for _ in range(5):
                fn(x)
        plan = graphs[0].plan.graph_module
        region = graphs[0].regions[0]
        ex = region.executor
        ctx = ex.context
        raw = torch.cuda.current_stream().cuda_stream
        placeholders = [n for n in plan.graph.nodes if n.op == "placeholder"]
        # Dynamo around our executor or region module alone (no lowering, no partitioned graph)
        index = next(i for i, n in enumerate(placeholders) if n.users)
        around_executor = torch.compile(model, backend=lambda gm, ex_in: (lambda *args: ex([args[index]])))
        around_region = torch.compile(model, backend=lambda gm, ex_in: (lambda *args: region.forward(args[index])))
        around_op = torch.compile(model, backend=lambda gm, ex_in: (lambda *args: (args[index] + 1,)))
        with torch.inference_mode():
            rows = {
                "enqueue": per_call_us(lambda: ctx.execute_async_v3(raw)),
                "executor": per_call_us(lambda: ex([x])),
                "region_module": per_call_us(lambda: region(x)),
                "compiled_model": per_call_us(lambda: fn(x)),
                "eager": per_call_us(lambda: model(x)),
                "dynamo_floor": per_call_us(lambda: floor(x)),
                "dynamo+one_op": per_call_us(lambda: around_op(x)),
                "dynamo+executor": per_call_us(lambda: around_executor(x)),
                "dynamo+region_module": per_call_us(lambda: around_region(x)),
                "torch.empty": per_call_us(lambda: torch.empty((1, 256), dtype=torch.float16, device="cuda")),
            }
        print(strategy, {k: round(v, 2) for k, v in rows.items()}, "plan placeholders", len(placeholders))
        pr = cProfile.Profile()
        with torch.inference_mode():
            pr.enable()
            for _ in range(2000):
                fn(x)
            pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
        print(s.getvalue()[-6000:])


if __name__ == "__main__":
    main()
