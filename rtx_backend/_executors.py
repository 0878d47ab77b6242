"""Executors: run one region's engine, ONNX model, or FX graph on a list of input tensors.

All three share one interface, `__call__(tensors) -> list[Tensor]`, so that the runtime
module, first-call validation and the cross-check compare them through the same code.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import torch

from . import _runtime_cache, _trt
from ._errors import CudaGraphError, RtxBackendError, RuntimeUnavailableError
from ._onnx_bridge import OnnxRegion
from ._options import Options

log = logging.getLogger("rtx_backend")


def torch_dtype(trt_dtype: Any) -> torch.dtype:
    trt = _trt.trt()
    table = {
        trt.DataType.FLOAT: torch.float32,
        trt.DataType.HALF: torch.float16,
        trt.DataType.BF16: torch.bfloat16,
        trt.DataType.INT8: torch.int8,
        trt.DataType.INT32: torch.int32,
        trt.DataType.INT64: torch.int64,
        trt.DataType.BOOL: torch.bool,
        trt.DataType.UINT8: torch.uint8,
    }
    if hasattr(trt.DataType, "FP8"):
        table[trt.DataType.FP8] = torch.float8_e4m3fn
    return table[trt_dtype]


class TorchExecutor:
    """Runs the region's ATen graph in PyTorch (fallback and reference)."""

    kind = "pytorch"

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm

    def run_args(self, args: Sequence[Any]) -> list[torch.Tensor]:
        return list(self.gm(*args))


class OrtExecutor:
    """Runs the region's ONNX model in ONNX Runtime (host copies; for machines without a GPU)."""

    kind = "onnxruntime"

    def __init__(self, region: OnnxRegion) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(region.model, opts, providers=["CPUExecutionProvider"])
        self.region = region
        self.lock = threading.Lock()

    def __call__(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        device = tensors[0].device if tensors else torch.device("cpu")
        feeds = {s.name: t.detach().cpu().contiguous().numpy() for s, t in zip(self.region.inputs, tensors)}
        with self.lock:
            results = self.session.run([s.name for s in self.region.outputs], feeds)
        return [
            torch.from_numpy(r).to(device=device, dtype=s.dtype)
            for r, s in zip(results, self.region.outputs)
        ]


def current_raw_stream(device_index: int) -> int:
    """torch's current CUDA stream as a handle (no Stream object: this is on every call's path)."""
    return torch._C._cuda_getCurrentRawStream(device_index)  # type: ignore[no-any-return]


def stream_capturing() -> bool:
    """Whether torch's current CUDA stream is being captured into a CUDA graph."""
    return torch._C._cuda_isCurrentStreamCapturing()  # type: ignore[no-any-return]


def deserialize(engine_bytes: bytes) -> Any:
    """The engine on this GPU, or raise RuntimeUnavailableError saying why it cannot run here."""
    if not torch.cuda.is_available():
        raise RuntimeUnavailableError("no usable CUDA GPU")
    trt = _trt.trt()
    errors = _trt.logger().errors
    errors.clear()
    runtime = trt.Runtime(_trt.logger())
    engine = runtime.deserialize_cuda_engine(engine_bytes)
    if engine is None:
        why = "; ".join(errors) or "deserialize_cuda_engine returned None"
        raise RuntimeUnavailableError(f"TensorRT-RTX cannot run this engine on this GPU: {why}")
    return runtime, engine


class TrtExecutor:
    """Runs a TensorRT-RTX engine on torch's current CUDA stream, with torch-allocated outputs.

    CUDA graphs: with cuda_graph_strategy="whole_graph_capture" TensorRT-RTX captures and
    replays the engine itself. When the caller captures the stream (torch.cuda.graph, or a
    reduce-overhead style wrapper), the outer graph must record the engine's kernels as they
    are: the context is recreated once, for good, with TensorRT-RTX's own capture off and, for
    dynamic inputs, "eager" instead of "lazy" kernel specialisation (lazy would swap in
    specialised kernels behind the recorded graph's back). That context takes its scratch memory
    from PyTorch's allocator on each call (USER_MANAGED): it is created during the capture, where
    cudaMalloc is not allowed, and PyTorch's allocator serves captures from the graph's pool.
    An engine that TensorRT-RTX reports as not stream-capturable raises CudaGraphError inside an
    outer capture.
    """

    kind = "tensorrt_rtx"

    def __init__(self, engine_bytes: bytes, region: OnnxRegion, options: Options, name: str = "region") -> None:
        self.runtime, self.engine = deserialize(engine_bytes)
        self.name = name
        self.region = region
        self.options = options
        self.input_names = [s.name for s in region.inputs]
        self.output_names = [s.name for s in region.outputs]
        self.output_dtypes = [torch_dtype(self.engine.get_tensor_dtype(n)) for n in self.output_names]
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.lock = threading.Lock()
        self.native_graphs = options.cuda_graph_strategy == "whole_graph_capture"
        self.specialization = options.dynamic_shapes_kernel_specialization_strategy
        self.native_checked = False
        self.user_memory = False  # scratch memory from PyTorch on each call (contexts made in a capture)
        # One context, one scratch memory: a call on another stream waits for the previous call's
        # work, or two streams would run the engine over the same activations at once.
        self._last_stream: Any = None
        self._last_raw: int | None = None
        self._side: torch.cuda.Stream | None = None
        self._scratch: torch.Tensor | None = None
        self._input_shapes: tuple[torch.Size, ...] = ()
        self._output_shapes: list[tuple[int, ...]] = []
        self._bound_context: Any = None  # the context that `_bound` and `_input_shapes` describe
        self._bound: dict[str, int] = {}  # tensor name -> address set on the context
        self.context = self._make_context()
        _runtime_cache.save_on_release(self, self._cache_ref)

    def _make_context(self) -> Any:
        trt = _trt.trt()
        config = self.engine.create_runtime_config()
        config.dynamic_shapes_kernel_specialization_strategy = getattr(
            trt.DynamicShapesKernelSpecializationStrategy, self.specialization.upper()
        )
        config.cuda_graph_strategy = (
            trt.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE if self.native_graphs else trt.CudaGraphStrategy.DISABLED
        )
        if self.user_memory:
            config.set_execution_context_allocation_strategy(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
        self._cache_ref = _runtime_cache.attach(config, self.options)
        self._config = config  # the context borrows the config and its cache
        context = self.engine.create_execution_context(config)
        if context is None:
            raise RuntimeUnavailableError("TensorRT-RTX could not create an execution context")
        return context

    def _side_stream(self) -> torch.cuda.Stream:
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        return self._side

    def _fit_outer_capture(self) -> None:
        """Recreate the context (once) so that an outer CUDA graph capture can record it."""
        changes = []
        if self.native_graphs:
            self.native_graphs = False
            changes.append("TensorRT-RTX's own CUDA graph capture off")
        if self.specialization == "lazy" and self.region.dynamic:
            self.specialization = "eager"
            changes.append("kernel specialization 'lazy' -> 'eager' (dynamic inputs)")
        if changes:
            log.info("trtrtx: region %s is captured by an outer CUDA graph: %s", self.name, ", ".join(changes))
            self.user_memory = True
            self.context = self._make_context()

    def _bind_memory(self, ctx: Any) -> None:
        """Give a USER_MANAGED context its scratch memory (stream-ordered, capture-safe)."""
        size = int(self.engine.device_memory_size_v2)
        if self.region.dynamic and hasattr(ctx, "update_device_memory_size_for_shapes"):
            size = int(ctx.update_device_memory_size_for_shapes())  # this call's shapes, not the profile's max
        self._scratch = torch.empty(max(size, 1), dtype=torch.uint8, device=self.device)
        ctx.set_device_memory(self._scratch.data_ptr(), size)

    def _check_native(self, ctx: Any, stream: torch.cuda.Stream) -> None:
        """Say, once, when whole_graph_capture cannot do what the user asked for."""
        self.native_checked = True
        probe = stream if stream.cuda_stream != 0 else torch.cuda.Stream(self.device)  # never the legacy stream
        if not ctx.is_stream_capturable(probe.cuda_stream):
            log.warning(
                "trtrtx: cuda_graph_strategy='whole_graph_capture' was asked for, but TensorRT-RTX reports "
                "region %s as not stream-capturable (data-dependent shapes or on-device control flow); "
                "it may run without CUDA graphs", self.name,
            )
        elif self.region.dynamic and self.specialization == "lazy":
            log.info(
                "trtrtx: region %s has dynamic inputs: TensorRT-RTX captures a CUDA graph per input shape "
                "once its specialised kernels are compiled; the first calls at a new shape run uncaptured",
                self.name,
            )

    def __call__(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        # The hot path: raw stream handles, and TensorRT-RTX calls only for what changed since the
        # last call (shapes are sticky on a context, and so are tensor addresses).
        raw = current_raw_stream(self.device.index)
        capturing = stream_capturing()
        with self.lock:
            if capturing:
                self._fit_outer_capture()
            ctx = self.context
            if ctx is not self._bound_context:
                self._bound_context, self._bound, self._input_shapes = ctx, {}, ()
            bound = self._bound
            shapes = tuple(t.shape for t in tensors)
            new_shapes = shapes != self._input_shapes
            for name, t in zip(self.input_names, tensors):
                if t.device != self.device:
                    t = t.to(self.device)
                if not t.is_contiguous():
                    t = t.contiguous()  # a temporary copy stays valid: the allocator is stream-ordered
                if new_shapes and not ctx.set_input_shape(name, tuple(t.shape)):
                    self._input_shapes = ()
                    raise RtxBackendError(
                        f"region {self.name}: TensorRT-RTX refused input shape {tuple(t.shape)} for {name} "
                        "(outside the engine's optimization profile)"
                    )
                ptr = t.data_ptr()
                if bound.get(name) != ptr:
                    ctx.set_tensor_address(name, ptr)
                    bound[name] = ptr
            if new_shapes:  # set shapes (and ask the output shapes back) only on change
                self._output_shapes = [tuple(ctx.get_tensor_shape(n)) for n in self.output_names]
                self._input_shapes = shapes
            outputs = []
            for name, dtype, shape in zip(self.output_names, self.output_dtypes, self._output_shapes):
                out = torch.empty(shape, dtype=dtype, device=self.device)
                ptr = out.data_ptr()
                if bound.get(name) != ptr:
                    ctx.set_tensor_address(name, ptr)
                    bound[name] = ptr
                outputs.append(out)
            if self.user_memory:
                self._bind_memory(ctx)
            if capturing and not ctx.is_stream_capturable(raw):
                raise CudaGraphError(
                    f"region {self.name} cannot be recorded by the CUDA graph being captured: TensorRT-RTX "
                    "reports its engine as not stream-capturable (data-dependent shapes or on-device control "
                    "flow). Call the compiled model outside the capture."
                )
            if self.native_graphs and not self.native_checked:
                self._check_native(ctx, torch.cuda.current_stream(self.device))
            shared_scratch = not capturing and not self.user_memory
            if shared_scratch and self._last_raw is not None and self._last_raw != raw:
                # another stream than last call's: wait for that call's use of the scratch memory
                torch.cuda.current_stream(self.device).wait_stream(self._last_stream)
            run_on = raw
            if self.native_graphs and raw == 0 and not capturing:
                # CUDA cannot capture the legacy default stream: TensorRT-RTX's own graphs run on a
                # side stream, ordered after and before the caller's work.
                side = self._side_stream()
                side.wait_stream(torch.cuda.current_stream(self.device))
                run_on = side.cuda_stream
            errors = _trt.logger().errors
            if errors:
                errors.clear()
            if not ctx.execute_async_v3(run_on):
                raise RtxBackendError(
                    f"region {self.name}: TensorRT-RTX execute_async_v3 failed: {'; '.join(errors) or 'no message'}"
                )
            if run_on != raw:
                torch.cuda.current_stream(self.device).wait_stream(self._side_stream())
            if shared_scratch and self._last_raw != raw:
                self._last_raw, self._last_stream = raw, torch.cuda.current_stream(self.device)
        return outputs
