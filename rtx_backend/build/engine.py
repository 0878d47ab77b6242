"""Engine: ONNX model -> TensorRT-RTX network (OnnxParser) -> serialized engine.

Networks are strongly typed (TensorRT-RTX's only mode): precision comes from the ONNX dtypes.
The builder config names every declared compute capability by index; with none declared it
names ComputeCapability.CURRENT (which needs a GPU).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from .. import _trt
from .._errors import BuildError, TargetError
from .._types import Profile, Target
from ..export.model import OnnxModel, as_bytes, host_bytes
from . import cache_writes

log = logging.getLogger("rtx_backend")



@dataclasses.dataclass(frozen=True)
class BuiltEngine:
    data: memoryview  # over the builder's IHostMemory, which it keeps alive: no copy of the engine
    targets: tuple[Target, ...] | None
    profile: Profile
    seconds: float


@dataclasses.dataclass
class Network:
    """A parsed TensorRT-RTX network, with what must outlive it: the host copies of the weights
    that its constant layers point into, and the parser. `errors` is empty when parsing worked."""

    builder: Any
    network: Any
    parser: Any
    weights: list[Any]
    errors: list[str]


def parse_network(model: bytes | OnnxModel) -> Network:
    """Parse the model; an in-memory model gives the parser its weights by pointer (see
    export/model.py), a serialized one goes through `parse`. Never raises for the model's content:
    the parser's complaints are in `errors`. One-row KV cache writes become in-place updates
    (build/cache_writes.py)."""
    if cache_writes.supported():
        rewritten, aliases = cache_writes.in_place(model)
        if aliases:
            parsed = _parse(rewritten)
            if not parsed.errors:
                log.debug("trtrtx: cache writes made in place: %s", aliases)
                return parsed
            log.debug("trtrtx: the parser refused the in-place cache writes (%s); they stay copies",
                      "; ".join(parsed.errors))
    return _parse(model)


def _parse(model: bytes | OnnxModel) -> Network:
    if isinstance(model, OnnxModel) and model.skeleton is not None:
        parsed = _parse_weightless(model)
        if parsed is not None:
            return parsed
    data = as_bytes(model)
    builder, network, parser = _parser()
    ok = parser.parse(data)
    return Network(builder, network, parser, [], [] if ok else parser_errors(parser))


def parse(model: bytes | OnnxModel | Network) -> Network:
    """The parsed network (parsed now unless it is one already); raises BuildError with the
    parser's errors."""
    parsed = model if isinstance(model, Network) else parse_network(model)
    if parsed.errors:
        raise BuildError("TensorRT-RTX's ONNX parser rejected the region: " + "; ".join(parsed.errors))
    return parsed


def _parser() -> tuple[Any, Any, Any]:
    trt = _trt.trt()
    builder = trt.Builder(_trt.logger())
    network = builder.create_network(0)
    return builder, network, trt.OnnxParser(network, _trt.logger())


def _parse_weightless(model: OnnxModel) -> Network | None:
    """The skeleton plus each weight by pointer; None where the parser will not load them (the
    caller then parses the serialized model)."""
    builder, network, parser = _parser()
    weights = load_weightless(parser, model)
    if weights is None:
        return None
    ok = parser.parse_model_proto()
    return Network(builder, network, parser, weights, [] if ok else parser_errors(parser))


def load_weightless(parser: Any, model: OnnxModel) -> list[Any] | None:
    """Give `parser` (TensorRT-RTX's ONNX parser, or its ONNX parser refitter) the model's skeleton
    and each weight by pointer. Returns the host copies it points into (keep them alive until it
    is done with them), or None where it will not load them."""
    if model.skeleton is None or not hasattr(parser, "load_model_proto") or not parser.load_model_proto(model.skeleton):
        return None
    owners: list[Any] = []
    for name, tensor in model.weights.items():
        address, size, owner = host_bytes(tensor)
        owners.append(owner)
        if not parser.load_initializer(name, address, size):
            log.debug("trtrtx: the parser would not load initializer %s by pointer: %s", name, parser_errors(parser))
            return None
    return owners


def parser_errors(parser: Any) -> list[str]:
    return [str(parser.get_error(i)) for i in range(parser.num_errors)]


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
    model: bytes | OnnxModel | Network,
    targets: tuple[Target, ...] | None,
    profile: Profile,
    *,
    monitor: Any | None = None,
    refittable: bool = False,
    threads: int | None = None,
) -> BuiltEngine:
    """Build a serialized engine; raises BuildError with TensorRT-RTX's own messages.
    `refittable`: built with BuilderFlag.REFIT, so that new weights can replace the ones it
    froze without a rebuild (see assemble/weights.py). `threads`: the builder's CPU threads
    (None: every CPU this process may run on; see _trt.threads)."""
    trt = _trt.trt()
    errors = _trt.logger().errors
    errors.clear()
    start = time.perf_counter()
    parsed = parse(model)
    builder, network = parsed.builder, parsed.network
    _trt.allow_threads(builder, threads)
    config = builder.create_builder_config()
    configure_targets(config, targets)
    if refittable:
        flag = getattr(trt.BuilderFlag, "REFIT", None)
        if flag is None:
            raise BuildError(f"TensorRT-RTX {_trt.version()} builds no refittable engines (no BuilderFlag.REFIT)")
        config.set_flag(flag)
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
    return BuiltEngine(memoryview(data).cast("B"), targets, profile, time.perf_counter() - start)

