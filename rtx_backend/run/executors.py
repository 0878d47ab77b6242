"""Executors: run one region's engine, ONNX model, or FX graph.

All three implement one interface, `Executor`: `run(args, tensors, shapes) -> list[Tensor]`,
given the region's arguments as the graph passes them, the model inputs among them and their
shapes (the region module picks those once per call: it is on every call's path). PyTorch runs
the arguments, ONNX Runtime the tensors, TensorRT-RTX the tensors at their shapes. The runtime
module, first-call validation and the cross-check run them all through the same code.

Long because TrtExecutor is: making contexts off the caller's thread, binding only what changed
on every call, two contexts for CUDA graph captures, the legacy-stream side path and refits all
act on the same per-engine state.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import dataclasses
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from .. import _stats, _threads, _torch_compat, _trt
from .._errors import CudaGraphError, RtxBackendError, RuntimeUnavailableError
from .._options import Options
from .._types import EngineData, OnnxRegion
from ..build.engine import load_weightless, parser_errors
from ..export.model import OnnxModel, as_bytes, in_memory_initializers
from ..run import runtime_cache as _runtime_cache
from ..run.staging import Staging

log = logging.getLogger("rtx_backend")

# The one thread that makes every engine's execution contexts, one engine after another (see
# TrtExecutor); started on first use.
SETUP = _threads.Pool(1, "trtrtx-setup")


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


class Executor:
    """What every executor is. `kind` names the runtime; `why` says why a region runs on
    something other than TensorRT-RTX (for rtx_backend.recording()); `reference` is true for
    PyTorch, whose results are the reference (nothing to fit, validate or fall back from);
    `fixed_shapes` is true where only the engine's profile can run, and no empty tensor."""

    kind = ""
    why = ""
    reference = False
    fixed_shapes = False
    # the region's weights when it was made (RegionModule.weight_versions), set by whoever puts it
    # in place: a first-call check that fails after they moved raced a weight change (validation.py)
    made_for: tuple[tuple[int, int], ...] | None = None

    def run(self, args: Sequence[Any], tensors: Sequence[torch.Tensor] = (),
            shapes: tuple[torch.Size, ...] | None = None) -> list[torch.Tensor]:
        raise NotImplementedError

    def pending(self) -> bool:
        """Whether the executor is still being set up (a first call would wait)."""
        return False

    def with_engine(self, engine: EngineData) -> Executor:
        """The executor for the region with `engine` (built for a wider profile) in place of its own."""
        return self


class TorchExecutor(Executor):
    """Runs the region's ATen graph in PyTorch (fallback and reference)."""

    kind = "pytorch"
    reference = True

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm

    def run(self, args: Sequence[Any], tensors: Sequence[torch.Tensor] = (),
            shapes: tuple[torch.Size, ...] | None = None) -> list[torch.Tensor]:
        return list(self.gm(*args))


class OrtExecutor(Executor):
    """Runs the region's ONNX model in ONNX Runtime (host copies; for machines without a GPU)."""

    kind = "onnxruntime"

    def __init__(self, region: OnnxRegion) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        # No pre-packed copies of the weights: each session's packed MatMul weights, freed with it,
        # stayed in malloc's heap (its mmap threshold rises to the largest block freed), so a
        # process that compiled again and again grew by about the weights' size each time
        # (bench/graph_cache_memory.py); the fallback runtime is not the fast path.
        opts.add_session_config_entry("session.disable_prepacking", "1")
        # From the skeleton, its weights handed over from memory where it has one: no serialized
        # copy of the model (1.5 s for BERT-base), and a model above protobuf's 2 GiB loads too.
        # ONNX Runtime then reads the weights in place, as TensorRT-RTX's parser does at a build:
        # the weight check (assemble/weights.py) still decides whether a call's result stands.
        parts = in_memory_initializers(region.source) if isinstance(region.source, OnnxModel) else None
        self._weights: list[Any] = []  # (ONNX Runtime reads the arrays in place: they live as long as it)
        if parts is not None:
            model, names, arrays = parts
            self._weights = [(a, ort.OrtValue.ortvalue_from_numpy(a)) for a in arrays]
            opts.add_external_initializers(names, [value for _, value in self._weights])
        else:
            model = region.model
        self.session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        self.region = region
        self.lock = threading.Lock()

    def run(self, args: Sequence[Any], tensors: Sequence[torch.Tensor] = (),
            shapes: tuple[torch.Size, ...] | None = None) -> list[torch.Tensor]:
        device = tensors[0].device if tensors else torch.device("cpu")
        feeds = {s.name: t.detach().cpu().contiguous().numpy() for s, t in zip(self.region.inputs, tensors)}
        with self.lock:
            results = self.session.run([s.name for s in self.region.outputs], feeds)
        return [
            torch.from_numpy(r).to(device=device, dtype=s.dtype)
            for r, s in zip(results, self.region.outputs)
        ]


_TRT_DTYPES: dict[torch.dtype, Callable[[Any], Any]] = {  # torch dtype -> TensorRT-RTX's, for trt.Weights
    torch.float32: lambda trt: trt.DataType.FLOAT,
    torch.float16: lambda trt: trt.DataType.HALF,
    torch.bfloat16: lambda trt: trt.DataType.BF16,
    torch.int8: lambda trt: trt.DataType.INT8,
    torch.int32: lambda trt: trt.DataType.INT32,
    torch.int64: lambda trt: trt.DataType.INT64,
    torch.bool: lambda trt: trt.DataType.BOOL,
    torch.uint8: lambda trt: trt.DataType.UINT8,
}


# On every call's path, so the C functions themselves, not Python wrappers around them.
current_raw_stream = _torch_compat.current_raw_stream
stream_capturing = _torch_compat.stream_capturing
_empty_strided_cuda = _torch_compat.empty_strided_cuda

# Inside inductor's CUDA graphs (cudagraph trees) no tensor allocated during a recording may
# outlive it unless it is an output: there, an engine's scratch memory is the executor's own
# (made on the warm-up call, before any recording) instead of a block of the graph's pool.
_SCRATCH_OF_OUR_OWN: contextvars.ContextVar[bool] = contextvars.ContextVar("trtrtx_own_scratch", default=False)


def run_with_own_scratch(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, whose engines use their executor's own scratch memory inside CUDA graph
    captures too (for captures whose pool must hold no allocation but the outputs). On every
    region call of rest="inductor": a plain call, not a generator context manager (a
    microsecond more a call)."""
    token = _SCRATCH_OF_OUR_OWN.set(True)
    try:
        return fn(*args)
    finally:
        _SCRATCH_OF_OUR_OWN.reset(token)


def deserialize(engine_bytes: EngineData, threads: int | None = None) -> Any:
    """The engine on this GPU, or raise RuntimeUnavailableError saying why it cannot run here.
    `threads`: the runtime's CPU threads (None: every CPU this process may run on)."""
    if not torch.cuda.is_available():
        raise RuntimeUnavailableError("no usable CUDA GPU")
    trt = _trt.trt()
    errors = _trt.logger().errors
    errors.clear()
    runtime = trt.Runtime(_trt.logger())
    _trt.allow_threads(runtime, threads)
    engine = runtime.deserialize_cuda_engine(engine_bytes)
    if engine is None:
        why = "; ".join(errors) or "deserialize_cuda_engine returned None"
        raise RuntimeUnavailableError(f"TensorRT-RTX cannot run this engine on this GPU: {why}")
    return runtime, engine


class _SidePath(NamedTuple):
    """Where whole_graph_capture runs when the caller is on the legacy default stream."""

    stream: int  # the side stream's handle
    before: tuple[Callable[[], None], ...]  # record an event on the legacy stream, the side stream waits for it
    after: tuple[Callable[[], None], ...]  # and back


@dataclasses.dataclass(eq=False)
class _Binding:
    """One execution context and what has been set on it (TensorRT-RTX keeps input shapes,
    tensor addresses and scratch memory on the context until they are set again)."""

    context: Any
    config: Any  # the context borrows its runtime config (and the config's runtime cache)
    native_graphs: bool
    input_shapes: tuple[torch.Size, ...] = ()
    output_specs: list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]] = dataclasses.field(
        default_factory=list)  # (shape, strides, dtype) of each output at input_shapes
    addresses: dict[str, int] = dataclasses.field(default_factory=dict)
    memory: tuple[int, int] = (0, 0)  # (address, size) given with set_device_memory
    capture_scratch: torch.Tensor | None = None  # scratch memory of the last captured call
    warmed: set[tuple[torch.Size, ...]] = dataclasses.field(default_factory=set)  # shapes run uncaptured
    scratch_bound: bool = False  # the executor's own scratch memory is the one set (uncaptured calls)
    staging: Staging = dataclasses.field(default_factory=Staging)  # fixed addresses for native graphs


def aliased_inputs(engine: Any, input_names: Sequence[str], output_names: Sequence[str]) -> dict[int, int]:
    """{output index: input index} of the engine's outputs that share an input's memory
    (TensorRT-RTX's KVCacheUpdate writes the cache input in place and names it as its output's alias)."""
    lookup = getattr(engine, "get_aliased_input_tensor", None)
    if lookup is None:
        return {}
    out = {}
    for i, name in enumerate(output_names):
        source = lookup(name)
        if source and source in input_names:
            out[i] = list(input_names).index(source)
    return out


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides torch gives a new contiguous tensor of `shape` (a size-0 or size-1 dim counts
    as 1). Plain ints: torch's own helper checks its input with torch._check, whose first use
    imports sympy, seconds of a loaded package's first call."""
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(int(size), 1)
    return tuple(reversed(strides))


class TrtExecutor(Executor):
    """Runs a TensorRT-RTX engine on torch's current CUDA stream, with torch-allocated outputs.

    Contexts take their scratch memory from PyTorch's allocator (USER_MANAGED): a context that
    allocates its own is not stream-capturable, and PyTorch serves allocations made during a
    capture from the graph's private pool.

    CUDA graphs: with cuda_graph_strategy="whole_graph_capture" TensorRT-RTX captures and
    replays the engine itself. When the caller captures the stream (torch.cuda.graph, or a
    reduce-overhead style wrapper), the outer graph must record the engine's kernels as they
    are, so the engine runs there on a second context without TensorRT-RTX's own capture and,
    for dynamic inputs, with "eager" instead of "lazy" kernel specialization (lazy would swap in
    specialised kernels behind the recorded graph's back). No context can be created, and no
    kernel compiled, during a capture: that second context is made with the first and runs once
    at each new input shape outside captures (the warm-up PyTorch asks for before a capture).
    What cannot be captured raises CudaGraphError, and the region runs in PyTorch there.

    The engine is deserialized in the constructor (an engine this GPU cannot run fails there),
    but its contexts are made on a setup thread: attaching the runtime cache (read from its file
    once per process) and creating contexts take 0.1 to 0.2 s, which then overlap with what the
    caller does next (Dynamo builds its guards after the backend returns). The first call waits
    for them; if they could not be made, every call raises RuntimeUnavailableError.
    """

    kind = "tensorrt_rtx"
    fixed_shapes = True

    def __init__(self, engine_bytes: EngineData, region: OnnxRegion, options: Options, name: str = "region") -> None:
        self.runtime, self.engine = deserialize(engine_bytes, options.compile_threads)
        self.name = name
        self.region = region
        self.options = options
        self.input_names = [s.name for s in region.inputs]
        self.output_names = [s.name for s in region.outputs]
        self.output_dtypes = [torch_dtype(self.engine.get_tensor_dtype(n)) for n in self.output_names]
        # outputs written into an input's memory (a KV cache updated in place): the input is the output
        self.aliased = aliased_inputs(self.engine, self.input_names, self.output_names)
        if self.aliased:
            _stats.count("engine_outputs_in_place", len(self.aliased))
        self.written = frozenset(self.aliased.values())  # inputs the engine writes: never staged
        self.device = torch.device("cuda", torch.cuda.current_device())
        self._errors: list[str] = _trt.logger().errors  # TensorRT-RTX's errors since the last clear
        self.lock = threading.Lock()
        self.native_graphs = options.cuda_graph_strategy == "whole_graph_capture"
        self.specialization = options.dynamic_shapes_kernel_specialization_strategy
        self.native_checked = False
        # One scratch memory for uncaptured calls: a call on another stream waits for the previous
        # call's work, or two streams would run the engine over the same activations at once.
        self._memory_size = int(self.engine.device_memory_size_v2)  # for the profile's largest shapes
        # made now, at compile time: a first call inside inductor's CUDA graphs (whose warm-up
        # allocates from the graphs' pool too) must not leave a block of that pool alive
        self._scratch: torch.Tensor | None = None
        if torch.cuda.is_available() and not stream_capturing():
            self._scratch = torch.empty(max(self._memory_size, 1), dtype=torch.uint8, device=self.device)
        self._last_stream: Any = None
        self._last_raw: int | None = None
        self._side: torch.cuda.Stream | None = None
        self._side_events: _SidePath | None = None
        self._cache_ref: _runtime_cache.RuntimeCache | None = None
        self.main: _Binding  # set by _setup
        self.capture: _Binding | None = None  # the context for outer captures, when it differs
        # The contexts are made on the setup thread (TensorRT-RTX lets go of the GIL there) while
        # the caller goes on, e.g. Dynamo building its guards; the first call waits for them.
        self._pending: concurrent.futures.Future[None] | None = SETUP.submit(self._setup)

    def _setup(self) -> None:
        """Make the contexts: the runtime cache attached (loaded from its file the first time),
        then one context per binding. Runs on the setup thread."""
        if torch.cuda.is_available():
            torch.cuda.set_device(self.device)  # TensorRT-RTX works on the thread's current device
        self.main = self._make_binding(self.native_graphs, self.specialization)
        lazy_dynamic = self.region.dynamic and self.specialization == "lazy"
        if self.native_graphs or lazy_dynamic:
            self.capture = self._make_binding(False, "eager" if lazy_dynamic else self.specialization)
        _runtime_cache.save_on_release(self, self._cache_ref)

    def pending(self) -> bool:
        """Whether the contexts are still being made."""
        pending = self._pending
        return pending is not None and not pending.done()

    def ready(self) -> None:
        """Wait for the contexts. If they could not be made, raise RuntimeUnavailableError (on
        every call: the executor cannot run)."""
        pending = self._pending
        if pending is None:
            return
        try:
            pending.result()
        except Exception as exc:
            raise RuntimeUnavailableError(f"region {self.name}: TensorRT-RTX could not set up the engine: {exc}") from exc
        self._pending = None

    @property
    def context(self) -> Any:
        self.ready()
        return self.main.context

    def _make_binding(self, native_graphs: bool, specialization: str) -> _Binding:
        trt = _trt.trt()
        config = self.engine.create_runtime_config()
        config.dynamic_shapes_kernel_specialization_strategy = getattr(
            trt.DynamicShapesKernelSpecializationStrategy, specialization.upper()
        )
        config.cuda_graph_strategy = (
            trt.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE if native_graphs else trt.CudaGraphStrategy.DISABLED
        )
        config.set_execution_context_allocation_strategy(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
        self._cache_ref = _runtime_cache.attach(config, self.options)
        context = self.engine.create_execution_context(config)
        if context is None:
            raise RuntimeUnavailableError("TensorRT-RTX could not create an execution context")
        return _Binding(context, config, native_graphs)

    def _side_stream(self) -> torch.cuda.Stream:
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        return self._side

    def _side_path(self) -> _SidePath:
        """The side stream and the two event steps that order it after, then before, the legacy
        default stream: made once, then called without a Python frame (functools.partial of the
        event's C methods)."""
        if self._side_events is None:
            side, default = self._side_stream(), torch.cuda.default_stream(self.device)
            ready, done = torch.cuda.Event(), torch.cuda.Event()
            base = _torch_compat.cuda_event_base
            ops = base if base is not None and isinstance(ready, base) else type(ready)  # (test stand-ins)
            self._side_events = _SidePath(
                side.cuda_stream,
                (functools.partial(ops.record, ready, default), functools.partial(ops.wait, ready, side)),
                (functools.partial(ops.record, done, side), functools.partial(ops.wait, done, default)),
            )
        return self._side_events

    def with_engine(self, engine: EngineData) -> TrtExecutor:
        return TrtExecutor(engine, self.region, self.options, self.name)

    def run(self, args: Sequence[Any], tensors: Sequence[torch.Tensor] = (),
            shapes: tuple[torch.Size, ...] | None = None) -> list[torch.Tensor]:
        """Run the engine on `tensors` (whose shapes the caller may pass, if it has them)."""
        if self._pending is not None:
            self.ready()
        raw = current_raw_stream(self.device.index)
        capturing = stream_capturing()
        if shapes is None:
            shapes = tuple(t.shape for t in tensors)
        with self.lock:
            if capturing:
                return self._enqueue(self._binding_for_capture(shapes), tensors, shapes, raw, True)
            outputs = self._enqueue(self.main, tensors, shapes, raw, False)
            if self.capture is not None and shapes not in self.capture.warmed:
                self._enqueue(self.capture, tensors, shapes, raw, False)  # compiles its kernels now
            return outputs

    def _binding_for_capture(self, shapes: tuple[torch.Size, ...]) -> _Binding:
        binding = self.capture or self.main
        if shapes not in binding.warmed:
            raise CudaGraphError(
                f"region {self.name} has not run at input shapes {[tuple(s) for s in shapes]} before this "
                "CUDA graph capture; call the compiled model at these shapes outside the capture first "
                "(the warm-up torch.cuda.graph asks for), so that TensorRT-RTX compiles its kernels"
            )
        return binding

    def _enqueue(
        self, b: _Binding, tensors: Sequence[torch.Tensor], shapes: tuple[torch.Size, ...], raw: int, capturing: bool
    ) -> list[torch.Tensor]:
        """Run one binding's context: set only what changed since its last call, then enqueue."""
        ctx = b.context
        new_shapes = shapes != b.input_shapes
        index = self.device.index
        addresses = b.addresses
        # Copies made here (an input on the host, or not contiguous) are held until the engine is
        # enqueued: dropped earlier, the allocator could hand their memory to the next copy or to
        # an output of this very call, and the engine would read an input its outputs overwrite
        # (an LLM's cache counter off by the prompt length). After the enqueue, the stream-ordered
        # allocator reuses them only for work that runs after the engine.
        held: list[torch.Tensor] = []
        given: list[torch.Tensor] = []  # the inputs as bound
        if not capturing and self._last_raw is not None and self._last_raw != raw:
            # another stream than the last call's: wait for that call's use of the scratch memory
            # (and of the staging buffers, written below)
            torch.cuda.current_stream(self.device).wait_stream(self._last_stream)
        staging = b.staging if b.native_graphs and not capturing else None
        for position, (name, t) in enumerate(zip(self.input_names, tensors)):
            if t.get_device() != index:  # an int compare: no torch.device on every call
                t = t.to(self.device)
                held.append(t)
            if not t.is_contiguous():
                t = t.contiguous()
                held.append(t)
            if new_shapes and not ctx.set_input_shape(name, tuple(t.shape)):
                b.input_shapes = ()
                raise RtxBackendError(
                    f"region {self.name}: TensorRT-RTX refused input shape {tuple(t.shape)} for {name} "
                    "(outside the engine's optimization profile)"
                )
            ptr = t.data_ptr()
            if staging is not None and addresses.get(name) != ptr and position not in self.written:
                t = staging.input(name, t, addresses.get(name))
                ptr = t.data_ptr()
            given.append(t)
            if addresses.get(name) != ptr:
                ctx.set_tensor_address(name, ptr)
                addresses[name] = ptr
        if new_shapes:
            b.output_specs = []
            for name, dtype in zip(self.output_names, self.output_dtypes):
                shape = tuple(ctx.get_tensor_shape(name))
                b.output_specs.append((shape, contiguous_strides(shape), dtype))
            b.input_shapes = shapes
        outputs = []
        copied: list[int] = []  # outputs written into staging buffers: handed back as copies
        device = self.device
        fast = _empty_strided_cuda if index is not None and _torch_compat.cuda_current_device() == index else None
        aliased = self.aliased
        for index_out, (name, (shape, strides, dtype)) in enumerate(zip(self.output_names, b.output_specs)):
            buffer = staging.output(name, shape, dtype) if staging is not None else None
            if index_out in aliased:
                out = given[aliased[index_out]]
            elif buffer is not None:
                out = buffer
                copied.append(index_out)
            else:
                if fast is not None:
                    out = fast(shape, strides, dtype)
                else:
                    out = torch.empty_strided(shape, strides, dtype=dtype, device=device)
                if staging is not None and staging.keep(name, out, addresses.get(name)):
                    copied.append(index_out)
            ptr = out.data_ptr()
            if addresses.get(name) != ptr:
                ctx.set_tensor_address(name, ptr)
                addresses[name] = ptr
            outputs.append(out)
        if capturing or not b.scratch_bound:
            self._bind_memory(b, capturing)
        if capturing and not ctx.is_stream_capturable(raw):
            raise CudaGraphError(
                f"region {self.name} cannot be recorded by the CUDA graph being captured: TensorRT-RTX "
                "reports its engine as not stream-capturable (data-dependent shapes or on-device control flow)"
            )
        if b.native_graphs and not self.native_checked:
            self._check_native(ctx, torch.cuda.current_stream(self.device))
        run_on = raw
        if b.native_graphs and raw == 0:
            # CUDA cannot capture the legacy default stream: TensorRT-RTX's own graphs run on a
            # side stream, ordered after and before the caller's work (by two reused events).
            path = self._side_path()
            for step in path.before:
                step()
            run_on = path.stream
        errors = self._errors
        if errors:
            errors.clear()
        if not ctx.execute_async_v3(run_on):
            b.input_shapes = ()  # not warmed at these shapes: the next call starts from them again
            raise RtxBackendError(
                f"region {self.name}: TensorRT-RTX execute_async_v3 failed: {'; '.join(errors) or 'no message'}"
            )
        if run_on != raw:
            for step in self._side_path().after:
                step()
        for index_out in copied:
            outputs[index_out] = outputs[index_out].clone()
        if not capturing:
            if new_shapes:
                b.warmed.add(shapes)  # (shapes that are not new were added when they became new)
            if self._last_raw != raw:
                self._last_raw, self._last_stream = raw, torch.cuda.current_stream(self.device)
        return outputs

    def _bind_memory(self, b: _Binding, capturing: bool) -> None:
        """Give the context its scratch memory: the executor's own outside captures (the engine's
        size for its largest shapes, so it never moves), a block of the graph's pool inside one."""
        size = self._memory_size  # (a smaller size for the call's shapes makes Myelin re-resolve shapes)
        if capturing and self._scratch is not None and _SCRATCH_OF_OUR_OWN.get():
            capturing = False
        b.scratch_bound = not capturing
        if capturing:
            b.capture_scratch = torch.empty(max(size, 1), dtype=torch.uint8, device=self.device)
            memory = (b.capture_scratch.data_ptr(), size)
        else:
            if self._scratch is None:
                self._scratch = torch.empty(max(size, 1), dtype=torch.uint8, device=self.device)
            memory = (self._scratch.data_ptr(), size)
        if b.memory != memory:
            b.context.set_device_memory(*memory)
            b.memory = memory

    def refit(self, weights: dict[str, torch.Tensor],
              constant: Callable[[str], torch.Tensor | None] = lambda name: None,
              model: bytes | OnnxModel | None = None) -> bool:
        """Give the engine new weights (ONNX initializer name -> tensor) with TensorRT-RTX's
        refitter; False where it cannot (an engine built without REFIT, a weight it wants and
        is not given, a refit that fails): the caller then builds the engine again. `constant`:
        the value of another initializer of the model, which the refitter may ask for too
        (a constant the builder combined with a weight).

        Where the engine holds weights by names the model does not have (the ONNX parser
        combined them: a BatchNormalization's four tensors become one scale and shift), `model`,
        the region's model with the new weights, is given to TensorRT-RTX's ONNX parser
        refitter, which combines them as the parser did.

        Calls wait (the executor's lock) and the GPU finishes the calls already enqueued, which
        read the old weights. The contexts read the engine's weights, refitted; the context of
        TensorRT-RTX's own CUDA graphs (whole_graph_capture) is made again, so that its graphs
        are captured anew rather than replayed with what they recorded. The context that the
        caller's captures record stays (graphs captured before the refit keep what they use)."""
        trt = _trt.trt()
        self.ready()
        with self.lock:
            if not getattr(self.engine, "refittable", False):
                return False
            torch.cuda.synchronize(self.device)
            errors = self._errors
            errors.clear()
            refitter = trt.Refitter(self.engine, _trt.logger())
            held: list[torch.Tensor] = []  # host copies the refitter reads until refit_cuda_engine returns

            def give(name: str, tensor: torch.Tensor) -> bool:
                host = tensor.detach().to("cpu").contiguous()
                held.append(host)
                dtype = _TRT_DTYPES.get(host.dtype)
                proto = refitter.get_weights_prototype(name)
                if dtype is None or proto.dtype != dtype(trt) or proto.size != host.numel():
                    log.debug("trtrtx: region %s: weight %s is %s %s in the engine, %s %s here", self.name, name,
                              proto.dtype, proto.size, host.dtype, host.numel())
                    return False
                if not refitter.set_named_weights(name, trt.Weights(dtype(trt), host.data_ptr(), host.numel())):
                    log.debug("trtrtx: region %s: the refitter refused weight %s: %s", self.name, name, errors)
                    return False
                return True

            refittable = set(refitter.get_all_weights())
            absent = sorted(n for n in weights if n not in refittable)
            if absent:  # combined by the parser into weights of other names: its refitter combines them again
                log.debug("trtrtx: region %s: weights %s are not refittable in its engine by name", self.name,
                          absent[:5])
                kept = _refit_from_model(refitter, model, self.name) if model is not None else None
                if kept is None:
                    return False
                held.extend(kept)
            else:
                for name, tensor in weights.items():  # (the model's other initializers: constants, kept)
                    if not give(name, tensor):
                        return False
                for name in refitter.get_missing_weights():
                    value = constant(name) if name else None
                    if value is None or not give(name, value):
                        log.debug("trtrtx: region %s: the refitter also wants %r", self.name, name)
                        return False
            if not refitter.refit_cuda_engine():
                log.debug("trtrtx: region %s: refit_cuda_engine failed: %s", self.name, errors)
                return False
            torch.cuda.synchronize(self.device)
            if self.native_graphs:  # its graphs recorded the old weights: a new context captures anew
                self.main = self._make_binding(True, self.specialization)
                self.native_checked = False
            return True

    def serialized(self) -> memoryview:
        """The engine as it is now (refitted: with its new weights), serialized."""
        with self.lock:
            return memoryview(self.engine.serialize()).cast("B")

    def _check_native(self, ctx: Any, stream: torch.cuda.Stream) -> None:
        """Say, once, when whole_graph_capture cannot do what the user asked for."""
        self.native_checked = True
        probe = stream if stream.cuda_stream != 0 else self._side_stream()  # never the legacy stream
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


def _refit_from_model(refitter: Any, model: bytes | OnnxModel, name: str) -> list[Any] | None:
    """Set every weight of `refitter`'s engine from the ONNX model it was parsed from, with new
    values, through TensorRT-RTX's ONNX parser refitter (the weights the parser combined are
    combined again); returns what must stay alive until the refit is done (the parser refitter,
    which owns the combined weights, and the host copies it points the refitter to), or None
    where this TensorRT-RTX has no such refitter or it fails."""
    trt = _trt.trt()
    parser_refitter = getattr(trt, "OnnxParserRefitter", None)
    if parser_refitter is None:
        return None
    parser = parser_refitter(refitter, _trt.logger())
    held: list[Any] = [parser]
    if isinstance(model, OnnxModel) and model.skeleton is not None and hasattr(parser, "load_model_proto"):
        weights = load_weightless(parser, model)
        held.extend(weights or ())
        ok = weights is not None and bool(parser.refit_model_proto())
    else:
        ok = bool(parser.refit_from_bytes(as_bytes(model)))
    if not ok:
        log.debug("trtrtx: region %s: the ONNX parser refitter failed: %s", name, parser_errors(parser))
        return None
    return held
