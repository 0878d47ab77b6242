"""GPU probe: which TensorRT-RTX context setups can be recorded by an outer CUDA graph capture.

Each variant runs in a child process (a failed capture can poison the CUDA context). Prints one
JSON line per variant: builder flag, allocation strategy, kernel specialization, static/dynamic,
is_stream_capturable before and after a first run, and whether a captured replay with new
input values matched an uncaptured run.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import torch


def build(user_alloc: bool, dynamic: bool) -> bytes:
    import io

    import tensorrt_rtx as trt

    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)).half()
    x = torch.randn(8, 256, dtype=torch.float16)
    buf = io.BytesIO()
    dyn = {"x": {0: torch.export.Dim("b", min=1, max=32)}} if dynamic else None
    prog = torch.onnx.export(model, (x,), dynamo=True, input_names=["x"], output_names=["y"], dynamic_shapes=dyn)
    prog.model_proto.SerializeToString()
    buf.write(prog.model_proto.SerializeToString())
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(buf.getvalue())
    config = builder.create_builder_config()
    if user_alloc:
        config.set_flag(trt.BuilderFlag.REQUIRE_USER_ALLOCATION)
    if dynamic:
        p = builder.create_optimization_profile()
        p.set_shape("x", (1, 256), (8, 256), (32, 256))
        config.add_optimization_profile(p)
    return bytes(builder.build_serialized_network(network, config))


def child(user_alloc: bool, alloc: str, spec: str, dynamic: bool, when: str) -> dict:
    import tensorrt_rtx as trt

    row: dict = {"flag": user_alloc, "alloc": alloc, "spec": spec, "dynamic": dynamic, "ctx_made": when}
    engine = trt.Runtime(trt.Logger(trt.Logger.ERROR)).deserialize_cuda_engine(build(user_alloc, dynamic))
    keep = []

    def context():
        config = engine.create_runtime_config()
        config.dynamic_shapes_kernel_specialization_strategy = getattr(
            trt.DynamicShapesKernelSpecializationStrategy, spec.upper())
        if alloc == "user":
            config.set_execution_context_allocation_strategy(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
        keep.append(config)
        return engine.create_execution_context(config)

    x = torch.randn(8, 256, device="cuda", dtype=torch.float16)
    y = torch.empty(8, 256, device="cuda", dtype=torch.float16)
    s = torch.cuda.Stream()

    def bind(ctx):
        ctx.set_input_shape("x", tuple(x.shape))
        ctx.set_tensor_address("x", x.data_ptr())
        ctx.set_tensor_address("y", y.data_ptr())
        if alloc == "user":
            size = engine.device_memory_size_v2
            if dynamic and hasattr(ctx, "update_device_memory_size_for_shapes"):
                size = ctx.update_device_memory_size_for_shapes()
            scratch = torch.empty(max(int(size), 1), dtype=torch.uint8, device="cuda")
            keep.append(scratch)
            ctx.set_device_memory(scratch.data_ptr(), int(size))

    ctx = None
    if when == "before":
        ctx = context()
        row["ctx_ok"] = ctx is not None
        if ctx is None:
            return row
        bind(ctx)
        row["capturable_before_run"] = ctx.is_stream_capturable(s.cuda_stream)
        with torch.cuda.stream(s):
            row["run_ok"] = ctx.execute_async_v3(s.cuda_stream)
        torch.cuda.synchronize()
        row["capturable_after_run"] = ctx.is_stream_capturable(s.cuda_stream)
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g, stream=s):
            if ctx is None:
                ctx = context()
                row["ctx_ok"] = ctx is not None
                bind(ctx)
            row["capturable_in_capture"] = ctx.is_stream_capturable(s.cuda_stream)
            row["enqueue_in_capture"] = ctx.execute_async_v3(s.cuda_stream)
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        captured = y.clone()
        with torch.cuda.stream(s):
            ctx.execute_async_v3(s.cuda_stream)
        torch.cuda.synchronize()
        row["replay_matches"] = bool(torch.allclose(captured, y, atol=1e-3)) and bool(y.abs().sum() > 0)
    except Exception as exc:
        row["capture_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return row


def main() -> None:
    if len(sys.argv) > 1:
        args = json.loads(sys.argv[1])
        print(json.dumps(child(*args)))
        return
    variants = []
    for flag, alloc, when in itertools.product((False, True), ("static", "user"), ("before", "during")):
        if when == "during" and alloc == "static" and flag:
            continue
        variants.append((flag, alloc, "lazy", False, when))
    for flag, alloc, spec in itertools.product((False, True), ("static", "user"), ("lazy", "eager", "none")):
        variants.append((flag, alloc, spec, True, "before"))
    for v in variants:
        r = subprocess.run([sys.executable, __file__, json.dumps(v)], capture_output=True, text=True, timeout=120)
        line = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else json.dumps(
            {"variant": v, "rc": r.returncode, "stderr": r.stderr[-300:]})
        print(line, flush=True)


if __name__ == "__main__":
    main()
