"""GPU probe: what one call of each step costs inside a Dynamo-compiled frame against outside it
(microseconds). A backend whose graph runs the step 20 times is timed against one whose graph
returns a ready tensor (Dynamo's floor); the difference over 20 is the step inside. Also prints
the dispatcher's thread-local key sets seen inside and outside."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from rtx_backend._record import recording

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import one_engine_model, per_call_us


def main() -> None:
    model, x = one_engine_model()
    fn = torch.compile(model, backend="trtrtx", options={"min_block_size": 1, "engine_cache_dir": ""})
    with torch.inference_mode(), recording() as graphs:
        for _ in range(5):
            fn(x)
    region = graphs[0].regions[0]
    ex = region.executor
    ctx = ex.context
    raw = torch.cuda.current_stream().cuda_stream
    with torch.inference_mode():
        ready = model(x)
    steps = {
        "torch.empty": lambda: torch.empty((1, 256), dtype=torch.float16, device="cuda"),
        "x+1": lambda: x + 1,
        "enqueue": lambda: ctx.execute_async_v3(raw),
        "executor": lambda: ex([x]),
        "region.forward": lambda: region.forward(x),
        "raw_stream": lambda: torch._C._cuda_getCurrentRawStream(0),
    }
    seen: dict[str, str] = {}

    def keys() -> str:
        return f"include={torch._C._dispatch_tls_local_include_set()} exclude={torch._C._dispatch_tls_local_exclude_set()}"

    rows = {}
    with torch.inference_mode():
        seen["outside"] = keys()
        for name, step in steps.items():
            torch._dynamo.reset()

            def twenty(*args, step=step, name=name):
                if name == "torch.empty":
                    seen.setdefault("inside", keys())
                for _ in range(20):
                    step()
                return (ready,)

            inside = torch.compile(model, backend=lambda gm, ex_in, f=twenty: f)
            total = per_call_us(lambda f=inside: f(x))
            torch._dynamo.reset()
            floor = torch.compile(model, backend=lambda gm, ex_in: (lambda *args: (ready,)))
            floor_us = per_call_us(lambda f=floor: f(x))
            outside = per_call_us(step)
            rows[name] = {"inside_us": round((total - floor_us) / 20, 2), "outside_us": round(outside, 2),
                          "floor_us": round(floor_us, 2)}
    print(json.dumps({"steps": rows, "dispatch_tls": seen}, indent=1))


if __name__ == "__main__":
    main()
