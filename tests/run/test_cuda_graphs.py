"""CUDA graphs: TensorRT-RTX's own capture, and the compiled model inside an outer torch.cuda.graph.

The CPU tests drive TrtExecutor with a fake engine and context (what TensorRT-RTX would be
asked, and when); the GPU tests run real engines.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import types

import pytest
import torch

import rtx_backend
from rtx_backend import _targets, _trt
from rtx_backend._errors import RuntimeUnavailableError
from rtx_backend._options import Options
from rtx_backend._record import recording
from rtx_backend._types import OnnxRegion, TensorSpec
from rtx_backend.run import executors as _executors
from rtx_backend.run import runtime_cache as _runtime_cache
from rtx_backend.run.region import RegionModule

from ..models import MLP, eval_model

# ---- CPU: the executor's decisions, with a fake TensorRT-RTX ----------------------------------


class FakeConfig:
    def __init__(self) -> None:
        self.cuda_graph_strategy = None
        self.dynamic_shapes_kernel_specialization_strategy = None
        self.allocation = "STATIC"

    def set_execution_context_allocation_strategy(self, strategy: object) -> None:
        self.allocation = strategy.name  # type: ignore[attr-defined]

    def create_runtime_cache(self) -> object:
        return types.SimpleNamespace(serialize=lambda: b"", deserialize=lambda data: True)

    def set_runtime_cache(self, cache: object) -> bool:
        return True


class FakeContext:
    def __init__(self, config: FakeConfig, capturable: bool) -> None:
        self.graph_strategy = config.cuda_graph_strategy
        self.specialization = config.dynamic_shapes_kernel_specialization_strategy
        self.allocation = config.allocation
        self.memory: list[tuple[int, int]] = []
        self.capturable = capturable
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.queried: list[int] = []
        self.runs = 0
        self.run_streams: list[int] = []
        self.addresses: dict[str, int] = {}
        self.seen: list[dict[str, list[float]]] = []  # per run: the floats at each input's address

    def _read(self, name: str) -> list[float]:
        n = int(torch.Size(self.shapes[name]).numel())
        return list((ctypes.c_float * n).from_address(self.addresses[name]))

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        self.shapes[name] = shape
        return True

    def set_tensor_address(self, name: str, address: int) -> bool:
        self.addresses[name] = address
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.shapes["input_0"]

    def is_stream_capturable(self, stream: int) -> bool:
        self.queried.append(stream)
        return self.capturable

    def set_device_memory(self, address: int, size: int) -> None:
        self.memory.append((address, size))

    def execute_async_v3(self, stream: int) -> bool:
        self.runs += 1
        self.run_streams.append(stream)
        self.seen.append({name: self._read(name) for name in self.shapes})  # what the engine would read
        return True


class FakeEngine:
    device_memory_size_v2 = 4096

    def __init__(self, capturable: bool) -> None:
        self.capturable = capturable
        self.contexts: list[FakeContext] = []

    def create_runtime_config(self) -> FakeConfig:
        return FakeConfig()

    def create_execution_context(self, config: FakeConfig) -> FakeContext:
        self.contexts.append(FakeContext(config, self.capturable))
        return self.contexts[-1]

    def get_tensor_dtype(self, name: str) -> object:
        return _trt.trt().DataType.FLOAT


class FakeStream:
    """A CUDA stream stand-in: remembers which streams it was told to wait for."""

    def __init__(self, world: World, cuda_stream: int) -> None:
        self.world = world
        self.cuda_stream = cuda_stream

    def wait_stream(self, other: FakeStream) -> None:
        self.world.waits.append((self.cuda_stream, other.cuda_stream))

    def wait_event(self, event: FakeEvent) -> None:
        assert event.stream is not None, "waits for an event never recorded"
        self.wait_stream(event.stream)


class FakeEvent:
    """A CUDA event stand-in: the stream it was last recorded on."""

    def __init__(self) -> None:
        self.stream: FakeStream | None = None

    def record(self, stream: FakeStream) -> None:
        self.stream = stream

    def wait(self, stream: FakeStream) -> None:
        stream.wait_event(self)


class World:
    """The fake CUDA state the executor sees: is the stream capturing, which stream is current."""

    def __init__(self) -> None:
        self.capturing = False
        self.stream = 7
        self.waits: list[tuple[int, int]] = []  # (waiting stream, stream waited for)


@pytest.fixture
def fake_executor(monkeypatch):
    world = World()
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FakeStream(world, world.stream))
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: FakeStream(world, 99))
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: FakeStream(world, 0))
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(_executors, "current_raw_stream", lambda index: world.stream)
    monkeypatch.setattr(_executors, "stream_capturing", lambda: world.capturing)
    monkeypatch.setattr(_runtime_cache, "CACHES", _runtime_cache.Caches())
    monkeypatch.setattr(_targets, "gpu_identity_parts", lambda: ("NVIDIA GeForce RTX 3090", (8, 6)))

    def make(*, capturable: bool = True, dynamic: bool = False, inputs: int = 1, **options):
        engine = FakeEngine(capturable)
        monkeypatch.setattr(_executors, "deserialize", lambda data, threads=None: (None, engine))
        shape: tuple[int | str, ...] = ("s0", 4) if dynamic else (2, 4)
        bounds = ((2, None), (4, 4)) if dynamic else ((2, 2), (4, 4))
        region = OnnxRegion(
            b"", tuple(range(inputs)),
            tuple(TensorSpec(f"input_{i}", shape, torch.float32, (2, 4), bounds) for i in range(inputs)),
            (TensorSpec("output_0", shape, torch.float32, (2, 4), bounds),),
        )
        executor = _executors.TrtExecutor(b"", region, Options.from_dict({"runtime_cache_path": "", **options}),
                                          "submod_0")
        executor.device = torch.device("cpu")  # outputs on CPU: no GPU here
        return executor, engine, world

    return make


def _strategies(ctx: FakeContext) -> tuple[str, str]:
    return ctx.graph_strategy.name, ctx.specialization.name


X = [torch.ones(2, 4)]


def test_native_capture_is_set_on_the_runtime_config(fake_executor):
    executor, engine, _ = fake_executor(cuda_graph_strategy="whole_graph_capture")
    for _ in range(3):
        executor.run((), X)
    # the engine's context, and the plain one for outer captures (run once, at the new shape)
    assert [_strategies(c) for c in engine.contexts] == [("WHOLE_GRAPH_CAPTURE", "LAZY"), ("DISABLED", "LAZY")]
    assert [c.runs for c in engine.contexts] == [3, 1]
    # scratch memory from PyTorch, one block for both, given once
    assert [c.allocation for c in engine.contexts] == ["USER_MANAGED", "USER_MANAGED"]
    assert [len(c.memory) for c in engine.contexts] == [1, 1]
    assert engine.contexts[0].memory == engine.contexts[1].memory


def test_outer_capture_runs_the_plain_context(fake_executor):
    executor, engine, world = fake_executor(cuda_graph_strategy="whole_graph_capture")
    executor.run((), X)  # warm-up, uncaptured: TensorRT-RTX's own graphs (and the plain context once)
    world.capturing = True
    executor.run((), X)
    world.capturing = False
    executor.run((), X)  # replays of the outer graph need no engine call; later eager calls are native again
    assert [c.runs for c in engine.contexts] == [2, 2]
    assert engine.contexts[1].queried == [7]  # capturability checked on the capturing stream
    # inside the capture the plain context's scratch memory is a block of its own (the graph's pool)
    assert [size for _, size in engine.contexts[1].memory] == [4096, 4096]
    assert engine.contexts[1].memory[0][0] != engine.contexts[1].memory[1][0]


def test_outer_capture_of_a_static_plain_engine_keeps_its_context(fake_executor):
    executor, engine, world = fake_executor()
    executor.run((), X)
    world.capturing = True
    executor.run((), X)
    executor.run((), X)
    assert [_strategies(c) for c in engine.contexts] == [("DISABLED", "LAZY")]
    assert engine.contexts[0].queried == [7, 7]
    assert engine.contexts[0].runs == 3


def test_outer_capture_before_any_warm_up_raises_a_clear_error(fake_executor):
    executor, engine, world = fake_executor()
    world.capturing = True
    with pytest.raises(rtx_backend.CudaGraphError, match=r"submod_0 has not run at input shapes \[\(2, 4\)\]"):
        executor.run((), X)
    assert engine.contexts[0].runs == 0


@pytest.mark.parametrize(("strategy", "expected"), [("lazy", "EAGER"), ("eager", "EAGER"), ("none", "NONE")])
def test_outer_capture_of_dynamic_inputs_never_uses_lazy_specialization(fake_executor, strategy, expected):
    executor, engine, world = fake_executor(dynamic=True, dynamic_shapes_kernel_specialization_strategy=strategy)
    executor.run((), X)
    world.capturing = True
    executor.run((), X)
    assert len(engine.contexts) == (2 if strategy == "lazy" else 1)
    captured = engine.contexts[-1]
    assert _strategies(captured) == ("DISABLED", expected)
    assert captured.runs == 2 and captured.queried == [7]


def test_outer_capture_of_an_uncapturable_engine_raises_a_clear_error(fake_executor):
    executor, engine, world = fake_executor(capturable=False)
    executor.run((), X)  # outside a capture it runs
    world.capturing = True
    with pytest.raises(rtx_backend.CudaGraphError, match=r"submod_0 .*not stream-capturable"):
        executor.run((), X)
    assert engine.contexts[0].runs == 1  # nothing was enqueued into the broken capture


def test_native_capture_of_an_uncapturable_engine_warns_once(fake_executor, caplog):
    executor, engine, world = fake_executor(capturable=False, cuda_graph_strategy="whole_graph_capture")
    world.stream = 0  # the legacy default stream can never be captured: a side stream is asked instead
    for _ in range(3):
        executor.run((), X)
    assert caplog.text.count("not stream-capturable") == 1
    assert engine.contexts[0].queried == [99]
    assert [c.runs for c in engine.contexts] == [3, 1]
    # CUDA cannot capture the legacy stream: the engine runs on the side stream, after and
    # before the caller's work
    assert engine.contexts[0].run_streams == [99, 99, 99]
    assert world.waits == [(99, 0), (0, 99)] * 3


def test_native_capture_with_lazy_dynamic_inputs_says_when_graphs_start(fake_executor, caplog):
    executor, _, _ = fake_executor(dynamic=True, cuda_graph_strategy="whole_graph_capture")
    with caplog.at_level(logging.INFO, "rtx_backend"):
        executor.run((), X)
    assert "captures a CUDA graph per input shape" in caplog.text


class _Uncapturable(_executors.Executor):
    kind = "tensorrt_rtx"

    def run(self, args, tensors=(), shapes=None):
        raise rtx_backend.CudaGraphError("region submod_0 cannot be recorded by the CUDA graph being captured")


def _compiled_mlp() -> tuple[torch.nn.Module, object, torch.Tensor, RegionModule]:
    """An MLP compiled on CPU (one region, in ONNX Runtime), an input, and its region module."""
    torch.manual_seed(0)
    model = eval_model(MLP())
    compiled = torch.compile(model, backend="trtrtx", options={"min_block_size": 1, "engine_cache_dir": ""})
    x = torch.randn(2, 16)
    with torch.no_grad(), recording() as graphs:
        compiled(x)
    (region,) = graphs[0].regions
    return model, compiled, x, region


def test_a_failed_enqueue_leaves_its_shapes_unwarmed_until_one_succeeds(fake_executor, monkeypatch):
    executor, engine, world = fake_executor()
    executor.run((), X)  # makes the context
    ctx = engine.contexts[0]
    ok = ctx.execute_async_v3
    monkeypatch.setattr(ctx, "execute_async_v3", lambda stream: False)
    Y = [torch.ones(3, 4)]
    with pytest.raises(rtx_backend.RtxBackendError, match="execute_async_v3 failed"):
        executor.run((), Y)
    world.capturing = True
    with pytest.raises(rtx_backend.CudaGraphError, match=r"has not run at input shapes \[\(3, 4\)\]"):
        executor.run((), Y)  # the failed call did not count as the warm-up
    world.capturing = False
    monkeypatch.setattr(ctx, "execute_async_v3", ok)
    (out,) = executor.run((), Y)  # same shapes as the failed call: they are set again, then warmed
    assert ctx.shapes["input_0"] == (3, 4) and out.shape == (3, 4) and out.is_contiguous()
    world.capturing = True
    executor.run((), Y)
    assert ctx.runs == 3


def test_outputs_follow_each_new_shape_and_keep_their_dtype(fake_executor):
    executor, _, _ = fake_executor(dynamic=True)
    for rows in (2, 5, 2, 7):
        (out,) = executor.run((), [torch.ones(rows, 4)])
        assert out.shape == (rows, 4) and out.stride() == (4, 1) and out.dtype == torch.float32


@pytest.mark.filterwarnings("ignore:Using `torch.compile\\(module\\)` when there are global hooks")
def test_region_module_calls_skip_module_dispatch_but_keep_forward_hooks():
    _, compiled, x, region = _compiled_mlp()
    seen = []
    handle = region.register_forward_hook(lambda module, args, out: seen.append(args[0].shape))
    with torch.no_grad():
        compiled(x)
    handle.remove()
    with torch.no_grad():
        compiled(x)
    assert seen == [x.shape]  # the hook ran while it was set, and only then
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: seen.append(type(module).__name__))
    try:
        with torch.no_grad():
            compiled(x)
    finally:
        handle.remove()
    assert "RegionModule" in seen  # global hooks too


@pytest.mark.parametrize(("indices", "picked"), [((), ()), ((2,), ("c",)), ((1, 2), ("b", "c")), ((0, 2), ("a", "c"))])
def test_region_arguments_are_picked_as_a_tuple(indices, picked):
    from rtx_backend.run.region import picker

    assert picker(indices)(("a", "b", "c")) == picked


def test_region_runs_in_pytorch_where_its_engine_cannot_be_captured(caplog):
    model, compiled, x, region = _compiled_mlp()
    region.executor, region.validate = _Uncapturable(), False
    with torch.no_grad(), caplog.at_level(logging.WARNING, "rtx_backend"):
        for _ in range(2):
            y = compiled(x + 1)
            torch.testing.assert_close(y, model(x + 1))
    assert caplog.text.count("runs in PyTorch inside such captures") == 1


def test_contexts_are_made_on_the_setup_thread_while_the_caller_goes_on(fake_executor, monkeypatch):
    gate, made_on = threading.Event(), []
    create = FakeEngine.create_execution_context

    def slow(self, config):
        made_on.append(threading.current_thread().name)
        assert gate.wait(10)
        return create(self, config)

    monkeypatch.setattr(FakeEngine, "create_execution_context", slow)
    executor, engine, _ = fake_executor()
    assert engine.contexts == []  # the constructor returned before the context was made
    gate.set()
    executor.run((), X)  # waits for the setup thread, then runs on its context
    assert [c.runs for c in engine.contexts] == [1]
    assert len(made_on) == 1 and made_on[0].startswith("trtrtx-setup")
    assert made_on[0] != threading.current_thread().name


@pytest.mark.parametrize("ready_first", [False, True], ids=["pending", "ready"])
def test_the_first_call_check_runs_pytorch_while_the_contexts_are_made(fake_executor, monkeypatch, ready_first):
    gate, order = threading.Event(), []
    create = FakeEngine.create_execution_context

    def slow(self, config):
        assert gate.wait(10)
        order.append("context")
        return create(self, config)

    def reference(x):
        order.append("reference")
        gate.set()  # PyTorch ran while the setup thread waited: it may go on now
        return (x * 2,)

    monkeypatch.setattr(FakeEngine, "create_execution_context", slow)
    executor, engine, _ = fake_executor()
    region = RegionModule("r", reference, executor.region, b"", executor, validate=True, device=torch.device("cpu"))
    if ready_first:
        gate.set()
        executor.ready()
    region(X[0])
    # one PyTorch run either way: the early one is the check's reference
    assert order == (["context", "reference"] if ready_first else ["reference", "context"])
    assert [c.runs for c in engine.contexts] == [1]
    assert region.validated_executor is not None


@pytest.mark.parametrize("runtime", ["auto", "tensorrt_rtx"])
def test_a_region_whose_contexts_cannot_be_made_runs_in_pytorch(fake_executor, monkeypatch, caplog, runtime):
    monkeypatch.setattr(FakeEngine, "create_execution_context", lambda self, config: None)
    failing, _, _ = fake_executor(runtime=runtime)
    model, compiled, x, region = _compiled_mlp()
    region.executor, region.validate = failing, False
    region.strict = runtime == "tensorrt_rtx"  # (what runtime_module sets from the same options)
    with torch.no_grad(), caplog.at_level(logging.WARNING, "rtx_backend"):
        if runtime == "tensorrt_rtx":  # TensorRT-RTX or nothing: the error reaches the caller, every time
            for _ in range(2):
                with pytest.raises(RuntimeUnavailableError, match="could not set up the engine"):
                    compiled(x)
            return
        for _ in range(2):
            torch.testing.assert_close(compiled(x + 1), model(x + 1))
    assert caplog.text.count("could not set up the engine") == 1
    assert f"region {region.name} runs in PyTorch from now on" in caplog.text
    assert region.kind == "pytorch"


# ---- GPU ---------------------------------------------------------------------------------------


def _inputs(dynamic: bool) -> list[torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    batches = [4, 8, 4, 16, 8, 4, 2, 16] if dynamic else [8] * 8
    return [torch.randn(b, 16, device="cuda", generator=gen) for b in batches]


@pytest.mark.gpu
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_gpu_whole_graph_capture_matches_disabled(dynamic):
    torch.manual_seed(0)
    model = eval_model(MLP(), device="cuda")
    xs = _inputs(dynamic)
    results = {}
    for strategy in ("disabled", "whole_graph_capture"):
        torch._dynamo.reset()
        if dynamic:
            for x in xs:
                torch._dynamo.mark_dynamic(x, 0)
        compiled = torch.compile(model, backend="trtrtx", options={
            "min_block_size": 1, "runtime": "tensorrt_rtx", "cuda_graph_strategy": strategy})
        with torch.no_grad(), recording() as graphs:
            results[strategy] = [compiled(x).clone() for x in xs + xs]  # each shape again: replays
        assert len(graphs) == 1  # one graph for every shape
        (region,) = graphs[0].regions
        assert region.kind == "tensorrt_rtx"
        assert region.executor.native_graphs == (strategy == "whole_graph_capture")
    with torch.no_grad():
        for x, a, b in zip(xs + xs, results["disabled"], results["whole_graph_capture"]):
            torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(b, model(x), atol=1e-3, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("strategy", ["disabled", "whole_graph_capture"])
def test_gpu_outer_cuda_graph_replays_new_inputs(strategy, dynamic):
    torch.manual_seed(0)
    model = eval_model(MLP(), device="cuda")
    static_x = torch.randn(8, 16, device="cuda")
    if dynamic:
        torch._dynamo.mark_dynamic(static_x, 0)
    compiled = torch.compile(model, backend="trtrtx", options={
        "min_block_size": 1, "runtime": "tensorrt_rtx", "cuda_graph_strategy": strategy})
    with torch.no_grad(), recording() as graphs:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # warm-up, as torch.cuda.graph asks: compiles, validates, JIT-compiles
                compiled(static_x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = compiled(static_x)
    (region,) = graphs[0].regions
    assert region.kind == "tensorrt_rtx"
    assert not region.capture_fallback_said  # the graph recorded the engine, not a PyTorch fallback
    executor = region.executor
    plain = executor.capture or executor.main  # the context the capture ran
    assert plain.capture_scratch is not None and not plain.native_graphs
    with torch.no_grad():
        for _ in range(4):
            new = torch.randn_like(static_x)
            static_x.copy_(new)
            graph.replay()
            torch.cuda.synchronize()
            torch.testing.assert_close(static_y, model(new), atol=1e-3, rtol=1e-3)
        # after the capture, ordinary calls still give the right answer
        other = torch.randn_like(static_x)
        torch.testing.assert_close(compiled(other), model(other), atol=1e-3, rtol=1e-3)


def test_inputs_copied_for_the_engine_stay_alive_until_it_runs(fake_executor):
    """Inputs that are not contiguous are copied; each copy must still hold its input when the
    engine runs. Dropped at once, the next copy could take its memory, and the engine would read
    the second input as the first (an LLM's cache counter came back off by the prompt length)."""
    executor, engine, _ = fake_executor(inputs=3)
    values = [torch.arange(8, dtype=torch.float32).reshape(4, 2) * (k + 1) for k in range(3)]
    views = [v.t() for v in values]  # (2, 4), not contiguous
    for _ in range(3):
        executor.run((), views)
    for seen in engine.contexts[0].seen:
        assert [seen[f"input_{k}"] for k in range(3)] == [v.t().reshape(-1).tolist() for v in values]
