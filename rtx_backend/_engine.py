"""Engine: ONNX bytes -> TensorRT-RTX network (OnnxParser) -> serialized engine.

Networks are strongly typed (TensorRT-RTX's only mode): precision comes from the ONNX dtypes.
The builder config names every declared compute capability by index; with none declared it
names ComputeCapability.CURRENT (which needs a GPU).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from . import _trt
from ._errors import BuildError, TargetError
from ._options import Target

log = logging.getLogger("rtx_backend")

Profile = dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]  # name -> min/opt/max


@dataclasses.dataclass(frozen=True)
class BuiltEngine:
    data: bytes
    targets: tuple[Target, ...] | None
    profile: Profile
    seconds: float


def parse(onnx_model: bytes) -> tuple[Any, Any, Any]:
    """(builder, network, parser) for the model; raises BuildError with the parser's errors."""
    trt = _trt.trt()
    builder = trt.Builder(_trt.logger())
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, _trt.logger())
    if not parser.parse(onnx_model):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise BuildError("TensorRT-RTX's ONNX parser rejected the region: " + "; ".join(errors))
    return builder, network, parser


def configure_targets(config: Any, targets: tuple[Target, ...] | None) -> None:
    """Declare each target on the builder config by index, or CURRENT when none is declared."""
    trt = _trt.trt()
    if targets is None:
        config.num_compute_capabilities = 1
        if not config.set_compute_capability(trt.ComputeCapability.CURRENT, 0):
            raise TargetError("TensorRT-RTX refused ComputeCapability.CURRENT (is there a GPU?)")
        return
    named = _trt.named_capabilities()
    config.num_compute_capabilities = len(targets)
    for index, target in enumerate(targets):
        if target not in named:
            listed = ", ".join(f"({a}, {b})" for a, b in named)
            raise TargetError(f"TensorRT-RTX {_trt.version()} cannot build for {target}; it names {listed}")
        if not config.set_compute_capability(named[target], index):
            raise TargetError(f"TensorRT-RTX refused compute capability {target} at index {index}")


def build(
    onnx_model: bytes,
    targets: tuple[Target, ...] | None,
    profile: Profile,
    *,
    monitor: Any | None = None,
) -> BuiltEngine:
    """Build a serialized engine; raises BuildError with TensorRT-RTX's own messages."""
    errors = _trt.logger().errors
    errors.clear()
    start = time.perf_counter()
    builder, network, _parser = parse(onnx_model)
    config = builder.create_builder_config()
    configure_targets(config, targets)
    if profile:
        opt_profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in profile.items():
            opt_profile.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(opt_profile)
    if monitor is not None:
        config.progress_monitor = monitor
    try:
        data = builder.build_serialized_network(network, config)
    except Exception as exc:  # some versions raise instead of returning None
        raise BuildError(f"TensorRT-RTX build failed: {exc}; {'; '.join(errors)}") from exc
    if data is None:
        raise BuildError("TensorRT-RTX build failed: " + ("; ".join(errors) or "no message"))
    return BuiltEngine(bytes(data), targets, profile, time.perf_counter() - start)

