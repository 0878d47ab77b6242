"""GPU probe: where a cold compile's time goes, stage by stage, for the benchmark's MLP (4x4096,
FP32 batch 256 by default: 268 MB of weights). As in the benchmark, Dynamo is warmed up first on
another model, trtrtx is preloaded and the model runs eagerly once; then each listed
configuration compiles under stage timers (one process, in order). With --peer, the same for
Torch-TensorRT-RTX (backend "torch_tensorrt", C++ runtime, as in the benchmark), by its stages.
--model=resnet50 (or resnet18) compiles that torchvision model instead. Every compile is cold:
a fresh engine cache and a fresh runtime cache. --sync-setup makes engines' contexts in the
executor's constructor, as before the setup thread (an A/B baseline).
    python bench/probes/compile_time.py [float16 1 float32 256 ...] [--profile] [--peer] [--model=resnet50] [--sync-setup]"""

from __future__ import annotations

import cProfile
import importlib
import io
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from probes.warmstart import synchronous_setup, wrap

import bench
import rtx_backend

DEV = "cuda" if torch.cuda.is_available() else "cpu"
def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


SECONDS: dict[str, float] = defaultdict(float)


def compile_once(dtype: torch.dtype, batch: int, profile: bool, peer: bool) -> None:
    SECONDS.clear()
    torch._dynamo.reset()
    torch.manual_seed(0)
    name = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--model=")), "mlp")
    model = (bench.resnet(int(name[6:])) if name.startswith("resnet") else bench.mlp()).eval()
    model = model.to(DEV, dtype).requires_grad_(False)
    x = torch.randn(batch, *((3, 224, 224) if name.startswith("resnet") else (4096,)), device=DEV, dtype=dtype)
    with torch.inference_mode():
        model(x)  # eager first, as in the benchmark (cuBLAS is initialised by then)
    sync()
    if peer:
        fn = torch.compile(model, backend="torch_tensorrt", dynamic=False,
                           options={"min_block_size": 1, "use_python_runtime": False})
    else:
        cache = tempfile.mkdtemp(prefix="probe-caches-")
        fn = torch.compile(model, backend="trtrtx", options={
            "engine_cache_dir": f"{cache}/engines", "runtime_cache_path": f"{cache}/runtime.cache"})
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
    print(f"{name} {dtype} batch {batch}: first call {total:.2f} s; stages:",
          {k: round(v, 3) for k, v in SECONDS.items()}, flush=True)
    if profile:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(45)
        print(text.getvalue()[-9000:])


def main() -> None:
    """Args: [dtype batch]... (default float32 256); --profile adds cProfile (which slows Python
    down several times, and in Python 3.12 sees every thread)."""
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    peer = "--peer" in sys.argv
    configs = [(getattr(torch, args[i]), int(args[i + 1])) for i in range(0, len(args), 2)] or [(torch.float32, 256)]
    for module, name, label in (
        ("rtx_backend._backend", "lower", "lower (aot_autograd and ours)"),
        ("rtx_backend._backend", "compile_graph", "ours (compile_graph)"),
        ("rtx_backend._backend", "export_region", "export"), ("rtx_backend._backend", "parse_network", "parse"),
        ("rtx_backend._backend", "check_region", "screen"), ("rtx_backend._backend", "_build_for", "build"),
        ("rtx_backend._backend", "graph_key", "graph cache key (hashes the weights)"),
        ("rtx_backend._backend", "to_graph_cache", "graph cache store"),
        ("rtx_backend.cache.engines", "EngineCache.key", "cache key"),
        ("rtx_backend.cache.engines", "EngineCache.load", "cache load"),
        ("rtx_backend.run.executors", "TrtExecutor.__init__", "executor (deserialize; contexts start)"),
        ("rtx_backend.run.executors", "TrtExecutor.ready", "first call waits for the contexts"),
        ("rtx_backend.run.region", "first_call", "validation (first call)"),
        ("rtx_backend.export.bridge", "_export_non_strict", "export: torch.export"),
        ("rtx_backend.lower.registry", "translate", "export: exporter"),
        ("torch.onnx._internal.exporter._core", "_prepare_exported_program_for_export", "exporter: decompose"),
        ("torch.onnx._internal.exporter._core", "_exported_program_to_onnx_program", "exporter: translate"),
        ("torch.onnx._internal.exporter._onnx_program", "ONNXProgram.optimize", "exporter: optimize"),
        ("rtx_backend.run.executors", "deserialize", "deserialize"),
        ("rtx_backend.run.executors", "TrtExecutor._make_binding", "contexts"),
    ):
        wrap(SECONDS, module, name, label)
    if "--sync-setup" in sys.argv:
        synchronous_setup()
    if peer:
        import torch_tensorrt  # noqa: F401  (its converters register on import, before timing)

        for module, name, label in (
            ("torch_tensorrt.dynamo.conversion._conversion", "interpret_module_to_result", "peer: convert, build"),
            ("torch_tensorrt.dynamo.conversion._TRTInterpreter", "TRTInterpreter._populate_trt_builder_config",
             "peer: builder config"),
            ("torch_tensorrt.dynamo.conversion._TRTInterpreter", "TRTInterpreter.run", "peer: TRTInterpreter.run"),
            ("torch_tensorrt.dynamo.runtime._TorchTensorRTModule", "TorchTensorRTModule.setup_engine",
             "peer: engine setup (deserialize, context)"),
        ):
            try:
                wrap(SECONDS, module, name, label)
            except (ImportError, AttributeError) as exc:
                print(f"cannot time {module}.{name}: {exc}")
    trt = importlib.import_module("tensorrt_rtx")
    for cls, name, label in ((trt.Builder, "build_serialized_network", "build_serialized_network"),
                             (trt.Runtime, "deserialize_cuda_engine", "deserialize_cuda_engine")):
        try:
            _time_method(cls, name, label)  # either backend's calls
        except (AttributeError, TypeError) as exc:
            print(f"cannot time {cls.__name__}.{name}: {exc}")
    warm = torch.nn.Linear(8, 8).to(DEV)
    torch.compile(warm, backend="eager")(torch.randn(2, 8, device=DEV))  # Dynamo's own first-use costs
    if not peer:  # (the peer's setup is its import, above)
        print("preload", rtx_backend.preload(), flush=True)
    for dtype, batch in configs:
        compile_once(dtype, batch, "--profile" in sys.argv, peer)


def _time_method(cls: type, name: str, label: str) -> None:
    """Time a TensorRT-RTX binding's method (set on its class, so every caller's use is timed)."""
    fn = getattr(cls, name)

    def timed(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(self, *args, **kwargs)
        finally:
            SECONDS[label] += time.perf_counter() - t

    setattr(cls, name, timed)


if __name__ == "__main__":
    main()
