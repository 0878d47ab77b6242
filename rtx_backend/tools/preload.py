"""`rtx_backend.preload()`: pay the pipeline's one-time costs now, not in the first compile.

The first compile of a process imports the ONNX exporter (torch.onnx's and onnxscript's torch_lib,
about a second), indexes the exporter's registry, builds the decomposition table, and pays
torch.export's and the exporter's first-use costs; loading TensorRT-RTX's builder, and its
runtime's first engine on a GPU (about half a second on an H200), come on top. A server that wants
its first request, or a benchmark that wants its first compile, to show only the model's own costs
calls this once at start-up, as `import torch_tensorrt` does for its converters. The costs move to
the call: they are not removed.
"""

from __future__ import annotations

import logging
import time

from .. import _targets, _trt
from .._types import OnnxRegion
from ..lower import lowering as _lowering

log = logging.getLogger("rtx_backend")


def preload() -> dict[str, float]:
    """Import and index what the first compile needs; returns seconds per step. TensorRT-RTX is
    loaded where it is installed (a missing one is not an error here: compiles say why)."""
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    _lowering.decompositions()  # the exporter's op list and the decomposition table
    seconds["decompositions"] = time.perf_counter() - start
    start = time.perf_counter()
    from ..lower import registry as _registry  # (the exporter's internals: imported when asked for)

    _registry.index()  # imports onnxscript's torch_lib and indexes the registry
    seconds["exporter"] = time.perf_counter() - start
    start = time.perf_counter()
    region = _first_export()
    seconds["first_export"] = time.perf_counter() - start
    start = time.perf_counter()
    if _trt.available():
        trt = _trt.trt()
        trt.Builder(_trt.logger())  # loads the builder's libraries
    seconds["tensorrt_rtx"] = time.perf_counter() - start
    start = time.perf_counter()
    if region is not None and _trt.available() and _targets.current_capability() is not None:
        _first_engine(region)
        seconds["tensorrt_rtx_runtime"] = time.perf_counter() - start
    log.info("trtrtx: preloaded in %.2fs (%s)", sum(seconds.values()),
             ", ".join(f"{k} {v:.2f}s" for k, v in seconds.items()))
    return seconds


def _first_export() -> OnnxRegion | None:
    """Export a small graph through the bridge: torch.export and the exporter's decomposition pass
    do work of their own on first use in a process (about 0.3 s of the first region's export). The
    graph has a reshape, as regions have (`views_to_reshapes`), so that the pass runs."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from ..export.bridge import export_region

    try:
        gm = make_fx(lambda x: (torch.relu(x * 2.0 + 1.0).view(-1),))(torch.randn(2, 4))
        _lowering.views_to_reshapes(gm)
        return export_region(gm)
    except Exception as exc:  # a warm-up: a failure here is the first real export's to report
        log.debug("trtrtx: preload's warm-up export failed (%s: %s)", type(exc).__name__, exc)
        return None


def _first_engine(region: OnnxRegion) -> None:
    """Build the warm-up region's engine and run it once on this GPU: TensorRT-RTX's runtime pays
    its first deserialization, context and kernel compilation here (no engine or runtime cache
    file is touched)."""
    import torch

    from .._options import Options
    from ..build.engine import build
    from ..export.bridge import _example
    from ..run.executors import TrtExecutor

    try:
        engine = build(region.source, None, {}).data
        options = Options(runtime_cache_path=None, engine_cache_dir=None, progress=False)
        executor = TrtExecutor(engine, region, options, "preload")
        executor.run((), [_example(s, executor.device) for s in region.inputs])
        torch.cuda.synchronize(executor.device)
    except Exception as exc:
        log.debug("trtrtx: preload's warm-up engine failed (%s: %s)", type(exc).__name__, exc)
