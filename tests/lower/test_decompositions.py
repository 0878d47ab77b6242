"""The meta kernel trtrtx gives the encoder fast path where torch has none (torch < 2.13)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from rtx_backend.lower import decompositions as _decompositions

from ..helpers import _LAST, compile_and_run, regions


def test_meta_kernel_gives_the_inputs_shape_and_dtype():
    src = torch.empty(3, 7, 16, dtype=torch.float16, device="meta")
    out = _decompositions._encoder_layer_meta(src, 16, 4)
    assert out.shape == src.shape and out.dtype == src.dtype and out.device.type == "meta"
    assert _decompositions._encoder_layer_meta(torch.empty(0, 7, 16)).shape == (0, 7, 16)


def test_no_registration_where_torch_has_a_meta_kernel(monkeypatch):
    monkeypatch.setattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", lambda name, key: True)
    monkeypatch.setattr(_decompositions, "_META_LIBRARY", [])
    assert _decompositions.register_missing_meta_kernels() is False
    assert _decompositions._META_LIBRARY == []


def test_registration_where_torch_has_none():
    """Simulated in a child process (the registration is process-wide): the kernel registers
    once, and fake tensors with symbolic sizes then flow through the fast-path op."""
    code = textwrap.dedent("""
        import torch
        real = torch._C._dispatch_has_kernel_for_dispatch_key
        torch._C._dispatch_has_kernel_for_dispatch_key = lambda name, key: False
        from rtx_backend.lower import decompositions as d
        torch._C._dispatch_has_kernel_for_dispatch_key = lambda name, key: False
        assert d._META_LIBRARY, "registered at import"
        assert d.register_missing_meta_kernels() is False, "registered twice"
        torch._C._dispatch_has_kernel_for_dispatch_key = real
        assert real("aten::_transformer_encoder_layer_fwd", "Meta")
        layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()
        a = layer.self_attn
        w = [a.in_proj_weight, a.in_proj_bias, a.out_proj.weight, a.out_proj.bias]
        src = torch.empty(2, 5, 16, device="meta")
        out = torch._transformer_encoder_layer_fwd(
            src, 16, 4, *[t.to("meta") for t in w], False, False, 1e-5,
            *[t.to("meta") for t in (layer.norm1.weight, layer.norm1.bias, layer.norm2.weight,
              layer.norm2.bias, layer.linear1.weight, layer.linear1.bias, layer.linear2.weight,
              layer.linear2.bias)], None)
        assert out.shape == (2, 5, 16), out.shape
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


@pytest.mark.parametrize(("shape", "kernel", "ceil_mode"), [
    ((2, 3, 7, 7), 1280, True), ((2, 3, 7, 7), 7, False), ((1, 2, 5, 6), (5, 6), False), ((3, 4, 4), 9, True),
])
def test_an_average_pool_over_the_whole_input_is_its_mean(shape, kernel, ceil_mode):
    x = torch.randn(*shape)
    kernel_arg = [kernel] if isinstance(kernel, int) else list(kernel)
    expected = torch.nn.functional.avg_pool2d(x, kernel, ceil_mode=ceil_mode)
    got = _decompositions._avg_pool2d(x, kernel_arg, [], [0, 0], ceil_mode)
    torch.testing.assert_close(got, expected)


def test_other_average_pools_keep_the_kernel():
    x = torch.randn(1, 2, 8, 8)
    assert _decompositions._avg_pool2d(x, [2, 2], [2, 2], [0, 0]) is NotImplemented
    assert _decompositions._avg_pool2d(x, [8, 8], [8, 8], [1, 1]) is NotImplemented
    assert _decompositions._avg_pool2d(x, [8, 8], [], [0, 0], False, True, 3) is NotImplemented


class WholeMapPool(torch.nn.Module):
    """Hugging Face EfficientNet's pooler: a window far larger than the feature map."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.pool = torch.nn.AvgPool2d(1280, ceil_mode=True)

    def forward(self, x):
        return torch.relu(self.pool(torch.relu(self.conv(x)))).flatten(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_whole_map_average_pool_lowers_and_builds(dtype):
    """TensorRT-RTX's parser rejected the AveragePool (window larger than the input), and the
    ONNX screen kept it in PyTorch."""
    model = WholeMapPool().eval().to(dtype)
    x = torch.randn(2, 3, 7, 7, dtype=dtype)
    out = compile_and_run(model, x, target_compute_capabilities=[(8, 6)], min_block_size=1)
    torch.testing.assert_close(out, model(x), atol=2e-3, rtol=2e-3)
    assert [r.kind for r in regions()] == ["onnxruntime"] and regions()[0].engine is not None
    assert len(_LAST[0].plan.eager_ops) == 0


class Norms(torch.nn.Module):
    """A VAE or UNet block in small: a convolution, GroupNorm, SiLU, then LayerNorm over channels;
    an InstanceNorm too (a batch norm over the batch's own statistics once lowered)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.group_norm = torch.nn.GroupNorm(4, 16)
        self.instance_norm = torch.nn.InstanceNorm2d(16, affine=True)
        self.layer_norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        y = torch.nn.functional.silu(self.group_norm(self.conv(x)))
        y = self.instance_norm(y * 10 + 50)
        return self.layer_norm(y.flatten(2).transpose(1, 2))


def _statistics(dump_dir) -> list[tuple[str, int, int | None]]:
    """(op, dtype of its input, stash_type) of every normalization and reduction node of the
    dumped ONNX model."""
    import onnx

    (path,) = dump_dir.glob("*.onnx")
    graph = onnx.shape_inference.infer_shapes(onnx.load(str(path))).graph
    dtypes = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info, *graph.output]}
    dtypes.update({i.name: i.data_type for i in graph.initializer})
    return [(node.op_type, dtypes[node.input[0]], next((a.i for a in node.attribute if a.name == "stash_type"), None))
            for node in graph.node if node.op_type.endswith("Normalization") or node.op_type.startswith("Reduce")]


def test_fp16_normalization_statistics_are_computed_in_fp32(tmp_path):
    """PyTorch's group, instance and layer norms keep their statistics in FP32 for FP16 inputs;
    the ONNX model must say so too, or TensorRT-RTX computes mean and variance in FP16 (an SD VAE
    decoder's engine missed PyTorch's FP16 result by 4x PyTorch's own error, and validation
    rejected it). The region stays FP16 around the norms, and still builds for Turing."""
    import onnx

    model = Norms().eval()
    x = torch.randn(2, 8, 6, 6)
    with torch.no_grad():
        reference = model(x)
    model.half()
    out = compile_and_run(model, x.half(), target_compute_capabilities=[(7, 5), (8, 6)],
                          dump_onnx_dir=str(tmp_path))
    assert out.dtype == torch.float16 and len(regions()) == 1 and regions()[0].engine is not None
    torch.testing.assert_close(out.float(), reference, atol=2e-2, rtol=2e-2)
    found = _statistics(tmp_path)
    assert {"InstanceNormalization", "BatchNormalization", "LayerNormalization", "ReduceMean"} <= {
        op for op, _, _ in found}, found
    for op, dtype, stash in found:
        if op == "LayerNormalization":  # statistics in stash_type (1, FP32, when left out)
            assert stash in (None, onnx.TensorProto.FLOAT), found
        else:  # no stash_type (GroupNormalization's comes with opset 21): its input's dtype
            assert dtype == onnx.TensorProto.FLOAT, found


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_group_norm_is_the_fp32_kernel_rounded_once(dtype):
    x, weight, bias = (t.to(dtype) for t in (torch.randn(2, 16, 5, 5) * 20 + 300, torch.randn(16), torch.randn(16)))
    got = _decompositions._group_norm(x, weight, bias, 2, 16, 25, 4, 1e-5)
    assert [t.dtype for t in got] == [dtype] * 3
    expected = torch.ops.aten.native_group_norm.default(x.float(), weight.float(), bias.float(), 2, 16, 25, 4, 1e-5)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e.to(dtype), atol=0, rtol=0)
    assert _decompositions._group_norm(x.float(), weight.float(), bias.float(), 2, 16, 25, 4, 1e-5) is NotImplemented


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_batch_statistics_norm_is_the_fp32_kernel_rounded_once(dtype):
    x, weight, bias = (t.to(dtype) for t in (torch.randn(1, 8, 5, 5) * 20 + 300, torch.randn(8), torch.randn(8)))
    got = _decompositions._batch_statistics_norm(x, weight, bias, True, 0.1, 1e-5)
    expected = torch.ops.aten._native_batch_norm_legit.no_stats(x.float(), weight.float(), bias.float(), True, 0.1, 1e-5)
    assert [t.dtype for t in got] == [dtype, torch.float32, torch.float32]  # the meta kernel's dtypes
    torch.testing.assert_close(got[0], expected[0].to(dtype), atol=0, rtol=0)
    assert _decompositions._batch_statistics_norm(x.float(), None, None, True, 0.1, 1e-5) is NotImplemented
