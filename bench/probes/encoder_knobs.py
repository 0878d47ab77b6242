"""GPU probe: can a TensorRT-RTX builder setting close the encoder's gap at batch 16 FP16 (engine
time 0.884 ms against a 0.816 ms target in the 1.4.0 run)? The encoder region of the benchmark
(6x768, batch 16, sequence 256) is exported once through trtrtx, then built per variant of the
builder config; each engine runs in our executor, timed with CUDA events (median of 5 rounds of
100 calls). Also says whether the engine's layers include a fused attention kernel."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench
from rtx_backend import _trt
from rtx_backend._options import Options
from rtx_backend._record import recording
from rtx_backend.build import engine as _engine
from rtx_backend.run.executors import TrtExecutor


def variants(trt) -> dict[str, dict]:
    tiling = getattr(trt, "TilingOptimizationLevel", None)
    out: dict[str, dict] = {"default": {}, "opt_level_4": {"builder_optimization_level": 4},
                            "opt_level_5": {"builder_optimization_level": 5}, "aux_streams_0": {"max_aux_streams": 0}}
    if tiling is not None:
        out["tiling_fast"] = {"tiling_optimization_level": tiling.FAST}
        out["tiling_moderate"] = {"tiling_optimization_level": tiling.MODERATE}
    return out


def build(source, settings: dict) -> bytes:
    parsed = _engine.parse(source)
    config = parsed.builder.create_builder_config()
    _engine.configure_targets(config, None)
    for name, value in settings.items():
        setattr(config, name, value)
    return bytes(parsed.builder.build_serialized_network(parsed.network, config))


def engine_ms(executor: TrtExecutor, x: torch.Tensor, rounds: int = 5, n: int = 100) -> float:
    for _ in range(20):
        executor([x])
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            executor([x])
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / n)
    return statistics.median(times)


def attention_layers(executor: TrtExecutor) -> list[str]:
    trt = _trt.trt()
    info = json.loads(executor.engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON))
    names = [str(layer.get("Name", layer)) if isinstance(layer, dict) else str(layer) for layer in info.get("Layers", [])]
    return [n for n in names if any(k in n.lower() for k in ("mha", "attention", "fmha", "softmax"))]


def encoder_region() -> tuple[torch.Tensor, torch.Tensor, Any]:
    """The benchmark's encoder (batch 16, FP16) compiled by trtrtx: its input, its output and
    its one region."""
    torch.manual_seed(0)
    model = bench.encoder().eval().cuda().half().requires_grad_(False)
    x = torch.randn(16, 256, 768, device="cuda", dtype=torch.float16)
    fn = torch.compile(model, backend="trtrtx", options={"engine_cache_dir": "", "validate": False})
    with torch.inference_mode(), recording() as graphs:
        ref = fn(x)
    return x, ref, graphs[0].regions[0]


def main() -> None:
    x, ref, region = encoder_region()
    print("region", region.kind, "inputs", region.onnx.inputs, flush=True)
    if len(region.onnx.inputs) != 1:
        raise SystemExit("expected one region taking the encoder's input")
    trt = _trt.trt()
    options = Options.from_dict({"engine_cache_dir": ""})
    for name, settings in variants(trt).items():
        try:
            executor = TrtExecutor(build(region.onnx.source, settings), region.onnx, options, name)
            with torch.inference_mode():
                err = (executor([x])[0].float() - ref.float()).abs().max().item()
                ms = engine_ms(executor, x)
            print(f"{name}: {ms:.3f} ms, max diff to the default engine {err:.3g}, "
                  f"attention layers {attention_layers(executor)[:6]}", flush=True)
        except Exception as exc:  # a setting this TensorRT-RTX does not take
            print(f"{name}: failed: {type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":
    main()
