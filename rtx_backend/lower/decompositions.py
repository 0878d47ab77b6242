"""Our decompositions of fused ATen kernels that the ONNX exporter cannot translate.

Each computes what the kernel computes, in the kernel's dtype, from ops that export (and that
the policy can judge one by one). A decomposition returns NotImplemented for the cases it does
not cover, which leaves the fused kernel in the graph (it then runs in PyTorch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

from .. import _torch_compat

aten = torch.ops.aten


def _cdist_forward(x1: torch.Tensor, x2: torch.Tensor, p: float, compute_mode: int | None = None) -> torch.Tensor:
    """cdist as p-norms of broadcast differences, so that it exports (no GEMM: Turing-safe).

    cdist itself picks its GEMM form (p=2 with compute_mode 1, or above 25 rows), which reaches
    the graph as mm; what reaches here is its direct form, kept elementwise as in PyTorch.
    """
    diff = (x1.unsqueeze(-2) - x2.unsqueeze(-3)).abs()
    if p == 0:
        return (diff != 0).to(x1.dtype).sum(-1)
    if p == 1:
        return diff.sum(-1)
    if p == 2:
        return diff.square().sum(-1).sqrt()
    if p == float("inf"):
        return diff.amax(-1)
    return diff.pow(p).sum(-1).pow(1.0 / p)



def _encoder_layer(
    src: torch.Tensor, embed_dim: int, num_heads: int,
    qkv_weight: torch.Tensor, qkv_bias: torch.Tensor, proj_weight: torch.Tensor, proj_bias: torch.Tensor,
    use_gelu: bool, norm_first: bool, eps: float,
    norm_weight_1: torch.Tensor, norm_bias_1: torch.Tensor, norm_weight_2: torch.Tensor, norm_bias_2: torch.Tensor,
    ffn_weight_1: torch.Tensor, ffn_bias_1: torch.Tensor, ffn_weight_2: torch.Tensor, ffn_bias_2: torch.Tensor,
    mask: torch.Tensor | None = None, mask_type: int | None = None,
) -> Any:
    """nn.TransformerEncoderLayer's inference fast path (eval, batch_first, no grad) as the layer's
    own ops: projections, attention, layer norms, feed-forward. Masked calls keep the kernel."""
    if mask is not None or src.dim() != 3:
        return NotImplemented
    batch, length = src.shape[0], src.shape[1]

    def attention(x: torch.Tensor) -> torch.Tensor:
        qkv = F.linear(x, qkv_weight, qkv_bias).view(batch, length, 3, num_heads, embed_dim // num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)
        return F.linear(out.transpose(1, 2).reshape(batch, length, embed_dim), proj_weight, proj_bias)

    def feed_forward(x: torch.Tensor) -> torch.Tensor:
        hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
        hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
        return F.linear(hidden, ffn_weight_2, ffn_bias_2)

    def norm1(x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (embed_dim,), norm_weight_1, norm_bias_1, eps)

    def norm2(x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (embed_dim,), norm_weight_2, norm_bias_2, eps)

    if norm_first:
        x = src + attention(norm1(src))
        return x + feed_forward(norm2(x))
    x = norm1(src + attention(src))
    return norm2(x + feed_forward(x))


def _avg_pool2d(
    x: torch.Tensor, kernel_size: Any, stride: Any = (), padding: Any = 0, ceil_mode: bool = False,
    count_include_pad: bool = True, divisor_override: int | None = None,
) -> Any:
    """An average pool whose window covers the whole (unpadded) input, as a mean over it.

    Hugging Face's EfficientNet pools with AvgPool2d(1280, ceil_mode=True) on a 7x7 map: one
    output, the mean of every element (the window is cut at the input's end, and so is its
    divisor). TensorRT-RTX's parser rejects a window larger than its input; the mean exports."""
    kernel = [kernel_size] * 2 if isinstance(kernel_size, int) else list(kernel_size)
    kernel = kernel * 2 if len(kernel) == 1 else kernel
    pads = [padding] * 2 if isinstance(padding, int) else list(padding)
    size = x.shape[-2:]
    if (divisor_override is not None or any(p != 0 for p in pads)
            or not all(isinstance(s, int) and isinstance(k, int) and k >= s for s, k in zip(size, kernel))):
        return NotImplemented
    return x.mean((-2, -1), keepdim=True)


_HALF = (torch.float16, torch.bfloat16)


def _float(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float()


def _group_norm(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, n: Any, c: Any, hxw: Any,
    group: int, eps: float,
) -> Any:
    """A half-precision group norm computed in FP32 and rounded once, as PyTorch's kernels do.

    PyTorch's group norm keeps its statistics (and applies the weight and bias) in FP32 for FP16
    and bfloat16 inputs. The exporter translates the kernel as an InstanceNormalization in the
    input's dtype (ONNX's GroupNormalization takes stash_type from opset 21 only), so TensorRT-RTX
    would compute mean and variance in FP16: an SD VAE decoder's engine then missed PyTorch's FP16
    result by 4x PyTorch's own error. The same kernel on FP32 casts of its inputs exports as an
    FP32 InstanceNormalization between Casts. Other dtypes keep the kernel as it is."""
    if x.dtype not in _HALF:
        return NotImplemented
    out, mean, rstd = aten.native_group_norm.default(x.float(), _float(weight), _float(bias), n, c, hxw, group, eps)
    return out.to(x.dtype), mean.to(x.dtype), rstd.to(x.dtype)


def _batch_statistics_norm(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, training: bool, momentum: float,
    eps: float,
) -> Any:
    """A half-precision batch norm over the batch's own statistics (what instance norm without
    running statistics lowers to) computed in FP32, as PyTorch's kernels compute it: exported as
    it is, its mean and variance are FP16 ReduceMeans. The saved statistics stay FP32, the dtype
    PyTorch gives them."""
    if x.dtype not in _HALF:
        return NotImplemented
    out, mean, rstd = aten._native_batch_norm_legit.no_stats(
        x.float(), _float(weight), _float(bias), training, momentum, eps)
    return out.to(x.dtype), mean, rstd


TABLE: dict[Any, Callable[..., Any]] = {
    aten._cdist_forward.default: _cdist_forward,  # the exporter has no cdist
    aten._transformer_encoder_layer_fwd.default: _encoder_layer,
    aten.avg_pool2d.default: _avg_pool2d,  # the parser rejects windows larger than the input
    aten.native_group_norm.default: _group_norm,  # FP32 statistics for FP16 and bfloat16, as in PyTorch
    aten._native_batch_norm_legit.no_stats: _batch_statistics_norm,  # (instance norm) the same
}


def _encoder_layer_meta(src: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The fast path's output: the input's shape and dtype (what torch >= 2.13 registers)."""
    if src.is_nested:
        raise NotImplementedError("_transformer_encoder_layer_fwd has no meta kernel for nested tensors")
    return src.clone() if src.numel() == 0 else torch.empty_like(src)


_META_LIBRARY: list[torch.library.Library] = []  # kept alive: dropping a Library unregisters it


def register_missing_meta_kernels() -> bool:
    """Give the encoder fast path a meta kernel where this torch has none (before 2.13).

    Without one, Dynamo cannot trace `nn.TransformerEncoder` in eval mode with dynamic shapes:
    fake tensors fall back to the real kernel, which needs concrete sizes, so every layer breaks
    the graph and runs in PyTorch. Returns whether a kernel was registered."""
    name = "aten::_transformer_encoder_layer_fwd"
    if _META_LIBRARY or _torch_compat.dispatch_has_kernel_for_dispatch_key(name, "Meta"):
        return False
    library = torch.library.Library("aten", "IMPL")
    library.impl("_transformer_encoder_layer_fwd", _encoder_layer_meta, "Meta")
    _META_LIBRARY.append(library)
    return True
