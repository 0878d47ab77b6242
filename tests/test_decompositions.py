"""The meta kernel trtrtx gives the encoder fast path where torch has none (torch < 2.13)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

from rtx_backend import _decompositions


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
        from rtx_backend import _decompositions as d
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
