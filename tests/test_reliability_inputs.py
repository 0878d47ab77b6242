"""Reliability at call time: inputs of another dtype or device, non-contiguous inputs, zero-size
dimensions, non-finite values and shapes outside every optimization profile give the eager
result or a clear error, never garbage. (Dynamo guards dtype, device and static shapes: a change
recompiles; the tests check that what runs then is right.)"""

from __future__ import annotations

import pytest
import torch

from rtx_backend._record import recording

from .models import MLP, ConvNet, eval_model

ORT = {"min_block_size": 1, "runtime": "onnxruntime"}
BUILD = {"min_block_size": 1, "target_compute_capabilities": [(8, 6)]}


class Elementwise(torch.nn.Module):
    """No weights, so any floating dtype is a valid input (the dtype is the only thing that changes)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * 2 + torch.exp(-x.abs()) - x / 3


def _run(compiled, *args):
    with torch.no_grad(), recording() as graphs:
        out = compiled(*args)
    return out, [r for g in graphs for r in g.regions]


def _tolerance(dtype):
    return {"atol": 2e-3, "rtol": 2e-3} if dtype in (torch.float16, torch.bfloat16) else {"atol": 1e-5, "rtol": 1e-5}


def test_dtype_changes_recompile_and_stay_correct():
    model = Elementwise()
    compiled = torch.compile(model, backend="trtrtx", options=ORT)
    kinds = {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.float32):
        x = torch.randn(4, 8).to(dtype)
        y, regions = _run(compiled, x)
        assert y.dtype == dtype
        torch.testing.assert_close(y, model(x), **_tolerance(dtype))
        kinds[dtype] = [r.kind for r in regions]
    assert kinds[torch.float16] == ["onnxruntime"]
    # ONNX Runtime has no bfloat16 Sin on CPU: that region runs in PyTorch (with a warning), never wrong
    assert kinds[torch.bfloat16] == ["pytorch"]


def test_wrong_dtype_for_the_weights_is_the_eager_error():
    model = eval_model(MLP())
    compiled = torch.compile(model, backend="trtrtx", options=ORT)
    _run(compiled, torch.randn(4, 16))
    x = torch.randn(4, 16, dtype=torch.float64)
    with pytest.raises(RuntimeError) as eager:
        model(x)
    with pytest.raises(Exception) as info:
        _run(compiled, x)
    assert "dtype" in str(info.value) or "dtype" in str(eager.value)
    assert type(info.value) is type(eager.value) or isinstance(info.value, RuntimeError)


@pytest.mark.parametrize("layout", ["transposed", "strided_slice", "expanded", "offset_view"])
def test_non_contiguous_inputs(layout):
    model = eval_model(MLP())
    compiled = torch.compile(model, backend="trtrtx", options=ORT)
    _run(compiled, torch.randn(4, 16))  # compiled for a contiguous input first
    x = {
        "transposed": lambda: torch.randn(16, 4).t(),
        "strided_slice": lambda: torch.randn(4, 32)[:, ::2],
        "expanded": lambda: torch.randn(1, 16).expand(4, 16),
        "offset_view": lambda: torch.randn(5, 16)[1:],
    }[layout]()
    assert layout == "offset_view" or not x.is_contiguous()
    y, regions = _run(compiled, x)
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    assert all(r.kind == "onnxruntime" for r in regions)


def test_channels_last_input_to_a_conv_net():
    model = eval_model(ConvNet())
    compiled = torch.compile(model, backend="trtrtx", options=ORT)
    for x in (torch.randn(2, 3, 16, 16), torch.randn(2, 3, 16, 16).to(memory_format=torch.channels_last)):
        y, _ = _run(compiled, x)
        torch.testing.assert_close(y, model(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("options", [ORT, BUILD], ids=["onnxruntime", "engine_built"])
def test_zero_size_dimensions(options):
    model = eval_model(MLP())
    compiled = torch.compile(model, backend="trtrtx", options=options)
    for x in (torch.randn(4, 16), torch.randn(0, 16), torch.randn(3, 16)):
        y, _ = _run(compiled, x)
        assert y.shape == (x.shape[0], 8)
        torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)


def test_zero_size_first_call_on_a_dynamic_graph():
    model = Elementwise()
    compiled = torch.compile(model, backend="trtrtx", options=ORT, dynamic=True)
    for n in (0, 5, 0, 1):
        x = torch.randn(n, 8)
        y, _ = _run(compiled, x)
        assert y.shape == x.shape
        torch.testing.assert_close(y, model(x))


def test_non_finite_values_propagate_like_eager():
    model = Elementwise()
    compiled = torch.compile(model, backend="trtrtx", options=ORT)
    x = torch.tensor([[float("nan"), float("inf"), -float("inf"), 1.0] * 2] * 4)
    y, regions = _run(compiled, x)
    torch.testing.assert_close(y, model(x), equal_nan=True)
    assert [r.kind for r in regions] == ["onnxruntime"]  # NaN where eager has NaN is agreement


@pytest.mark.parametrize("options", [ORT, BUILD], ids=["onnxruntime", "engine_built"])
def test_shapes_outside_every_profile(options):
    """The declared range is 1..8 rows; calls with 16 and 100 rows still give the eager result."""
    model = eval_model(MLP())
    compiled = torch.compile(model, backend="trtrtx", dynamic=True,
                             options={**options, "dynamic_shapes": {0: {0: (1, 4, 8)}}})
    for n in (4, 8, 16, 100, 2):
        x = torch.randn(n, 16)
        y, _ = _run(compiled, x)
        torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)


def test_rank_change_recompiles():
    model = Elementwise()
    compiled = torch.compile(model, backend="trtrtx", options=ORT)
    for shape in ((4, 8), (2, 4, 8), (8,)):
        x = torch.randn(shape)
        y, _ = _run(compiled, x)
        torch.testing.assert_close(y, model(x))


def test_out_of_range_index_is_an_error_not_garbage():
    """An index past the table is an error in eager; it must not become a wrong value."""

    class Lookup(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, i: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.fc(self.emb(i))) * 2

    model = Lookup().eval()
    compiled = torch.compile(model, backend="trtrtx", options=ORT)
    good = torch.tensor([[1, 2, 3]])
    y, _ = _run(compiled, good)
    torch.testing.assert_close(y, model(good))
    with pytest.raises(Exception, match=r"out of|index"):
        _run(compiled, torch.tensor([[1, 2, 30]]))


# ---- GPU: the same through TensorRT-RTX engines -----------------------------------------------------

GPU = {"min_block_size": 1, "runtime": "tensorrt_rtx"}


@pytest.mark.gpu
def test_gpu_wrong_device_input_is_the_eager_error():
    model = eval_model(MLP(), device="cuda")
    compiled = torch.compile(model, backend="trtrtx", options=GPU)
    _, regions = _run(compiled, torch.randn(4, 16, device="cuda"))
    assert [r.kind for r in regions] == ["tensorrt_rtx"]
    x = torch.randn(4, 16)  # on the CPU
    with pytest.raises(RuntimeError):
        model(x)
    with pytest.raises(Exception, match=r"(?i)device|cuda|cpu"):
        _run(compiled, x)


@pytest.mark.gpu
def test_gpu_dtype_layout_zero_size_and_profile_changes():
    model = Elementwise()
    compiled = torch.compile(model, backend="trtrtx", options=GPU)
    cases = [torch.randn(4, 8, device="cuda"), torch.randn(4, 8, device="cuda").half(),
             torch.randn(8, 4, device="cuda").t(), torch.randn(0, 8, device="cuda"),
             torch.randn(4, 16, device="cuda")[:, ::2]]
    for x in cases:
        y, _ = _run(compiled, x)
        assert y.device == x.device and y.dtype == x.dtype
        tol = 1e-2 if x.dtype == torch.float16 else 1e-4  # TensorRT-RTX's own fp16 kernels
        torch.testing.assert_close(y, model(x), atol=tol, rtol=tol)
    mlp = eval_model(MLP(), device="cuda")
    dyn = torch.compile(mlp, backend="trtrtx", dynamic=True, options={**GPU, "dynamic_shapes": {0: {0: (1, 4, 8)}}})
    for n in (4, 8, 16, 100, 2):
        x = torch.randn(n, 16, device="cuda")
        y, _ = _run(dyn, x)
        torch.testing.assert_close(y, mlp(x), atol=1e-3, rtol=1e-3)


def test_meta_inputs_give_meta_outputs_as_eager_does():
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).to("meta").eval()
    x = torch.randn(4, 16, device="meta")
    compiled = torch.compile(model, backend="trtrtx", options={"min_block_size": 1,
                                                                "target_compute_capabilities": [(8, 6)]})
    with torch.no_grad():
        y = compiled(x)
    expected = model(x)
    assert y.is_meta and y.shape == expected.shape and y.dtype == expected.dtype
