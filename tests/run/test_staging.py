"""Fixed addresses for TensorRT-RTX's own CUDA graphs: inputs that move between calls are copied
into buffers that stay bound, outputs are written into buffers and handed back as copies, so the
engine's captured graph is replayed instead of captured again (run/staging.py).

The CPU tests drive TrtExecutor with the fake engine of test_cuda_graphs; the GPU test counts
TensorRT-RTX's captures with the profiler.
"""

from __future__ import annotations

import pytest
import torch

from rtx_backend._record import recording
from rtx_backend.run import staging as _staging

from ..models import MLP, eval_model
from .test_cuda_graphs import fake_executor  # noqa: F401 (the fixture)


def _count_bindings(context):
    """Wrap the fake context's set_tensor_address to count the calls, per tensor name."""
    counts: dict[str, int] = {}
    original = context.set_tensor_address

    def counting(name, address):
        counts[name] = counts.get(name, 0) + 1
        return original(name, address)

    context.set_tensor_address = counting
    return counts


def _calls(executor, make, n):
    held = []  # the caller keeps each result, as generate keeps the last step's logits
    for k in range(n):
        held.append(executor.run((), make(k)))
    return held


def test_native_graphs_keep_every_address_when_inputs_and_outputs_move(fake_executor):  # noqa: F811
    executor, engine, _ = fake_executor(cuda_graph_strategy="whole_graph_capture", inputs=2)
    inputs = [[torch.full((2, 4), float(10 * k + i)) for i in range(2)] for k in range(6)]
    executor.run((), inputs[0])  # the first call binds what it is given
    context = engine.contexts[0]
    counts = _count_bindings(context)
    held = _calls(executor, lambda k: inputs[k + 1], 5)
    # one new binding each (the buffer an input or output moves into), then none
    assert counts == {"input_0": 1, "input_1": 1, "output_0": 1}
    # the engine read each call's own values
    assert [seen["input_1"][0] for seen in context.seen] == [float(10 * k + 1) for k in range(6)]
    # every call handed back a tensor of its own
    assert len({out.data_ptr() for (out,) in held}) == len(held)
    assert context.addresses["output_0"] not in {out.data_ptr() for (out,) in held}


def test_inputs_that_keep_their_address_are_bound_as_they_are(fake_executor):  # noqa: F811
    executor, engine, _ = fake_executor(cuda_graph_strategy="whole_graph_capture")
    x = torch.ones(2, 4)
    for _ in range(4):
        executor.run((), [x])
    assert engine.contexts[0].addresses["input_0"] == x.data_ptr()
    assert not executor.main.staging.inputs


def test_a_large_input_that_moves_stops_the_staging(fake_executor, monkeypatch):  # noqa: F811
    monkeypatch.setattr(_staging, "SMALL", 16)  # bytes: the (2, 4) float inputs are large now
    executor, engine, _ = fake_executor(cuda_graph_strategy="whole_graph_capture")
    xs = [torch.full((2, 4), float(k)) for k in range(3)]
    _calls(executor, lambda k: [xs[k]], 3)
    staging = executor.main.staging
    assert staging.off and not staging.inputs and not staging.outputs
    assert engine.contexts[0].addresses["input_0"] == xs[2].data_ptr()  # bound as it is
    assert [seen["input_0"][0] for seen in engine.contexts[0].seen] == [0.0, 1.0, 2.0]


def test_without_native_graphs_nothing_is_staged(fake_executor):  # noqa: F811
    executor, engine, _ = fake_executor(cuda_graph_strategy="disabled")
    xs = [torch.full((2, 4), float(k)) for k in range(3)]
    _calls(executor, lambda k: [xs[k]], 3)
    assert not executor.main.staging.inputs and not executor.main.staging.outputs
    assert engine.contexts[0].addresses["input_0"] == xs[2].data_ptr()


def test_a_new_shape_gets_its_own_buffers(fake_executor):  # noqa: F811
    executor, engine, _ = fake_executor(cuda_graph_strategy="whole_graph_capture", dynamic=True)
    shapes = [(2, 4), (2, 4), (3, 4), (3, 4), (2, 4)]
    held = _calls(executor, lambda k: [torch.full(shapes[k], float(k))], len(shapes))
    assert [tuple(out.shape) for (out,) in held] == shapes
    context = engine.contexts[0]
    assert [len(seen["input_0"]) for seen in context.seen] == [8, 8, 12, 12, 8]
    assert [seen["input_0"][0] for seen in context.seen] == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.gpu
def test_gpu_native_graphs_replay_when_every_call_brings_new_tensors():
    """Each call a new input while the last result is held (generate's pattern): after the first
    calls TensorRT-RTX replays its graph, with no capture, and every result is right."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = eval_model(MLP(), device="cuda").half()
    compiled = torch.compile(model, backend="trtrtx", options={
        "min_block_size": 1, "runtime": "tensorrt_rtx", "cuda_graph_strategy": "whole_graph_capture"})
    xs = [torch.randn(4, 16, device="cuda", dtype=torch.half) for _ in range(8)]
    with torch.no_grad(), recording() as graphs:
        held = [compiled(x) for x in xs[:4]]
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            held += [compiled(x) for x in xs[4:]]
            torch.cuda.synchronize()
    (region,) = graphs[0].regions
    assert region.kind == "tensorrt_rtx" and region.executor.native_graphs
    names = [e.name for e in prof.events()]
    assert "cudaGraphLaunch" in names, sorted(set(names))  # TensorRT-RTX's graph ran
    assert "cudaGraphExecUpdate" not in names and "cudaStreamBeginCapture" not in names, sorted(set(names))
    with torch.no_grad():
        for x, y in zip(xs, held):
            torch.testing.assert_close(y, model(x), atol=2e-2, rtol=2e-2)
