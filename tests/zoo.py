"""A zoo of small models covering the op families the capability policy judges.

Each entry names a model factory, an input factory (inputs take the dtype the model runs in;
index inputs stay int64) and the dtypes in which a Turing target keeps some op in PyTorch.
Sizes are tiny: the zoo is an oracle for the policy (every region must build for every
declared target), not a benchmark.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .models import MLP, ConvNet


class ResNetish(nn.Module):
    """Two basic blocks (conv-bn-relu, skip, strided downsample) and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.b1 = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8))
        self.b2 = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16),
                                nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16))
        self.down = nn.Sequential(nn.Conv2d(8, 16, 1, stride=2, bias=False), nn.BatchNorm2d(16))
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        y = torch.relu(y + self.b1(y))
        y = torch.relu(self.down(y) + self.b2(y))
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


class SelfAttention(nn.Module):
    """q/k/v projections, scaled_dot_product_attention (causal), output projection."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class ManualAttention(nn.Module):
    """Attention spelled with baddbmm, matmul (bmm after lowering) and softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(1, 6, 6) / 4)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        scores = torch.baddbmm(self.bias, q, k.transpose(1, 2), alpha=0.25)
        return torch.matmul(scores.softmax(-1), k) + q


class MHA(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.norm = nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.attn(x, x, x, need_weights=False)[0])


class EncoderLayer(nn.Module):
    """Sequence-first, so eval mode does not take the fused fast path (one op the exporter lacks)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class Conv3dNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv3d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm3d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.c(x))).mean(2) * 2 + 1


class PaddedConv3d(nn.Module):
    """padding_mode='reflect' (F.pad, then an unpadded convolution) and explicit F.pad."""

    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv3d(2, 4, 3, padding=1, padding_mode="reflect")
        self.d = nn.Conv3d(4, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.c(x))
        return self.d(F.pad(y, (1, 1, 1, 1, 1, 1), mode="replicate")).sigmoid()


class ConvTranspose3dNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose3d(4, 2, 2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.up(torch.relu(x))) * 0.5 + x.mean()


class EinsumNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 6) / 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.einsum("bij,jk->bik", x, self.w)
        return torch.relu(torch.einsum("bik,bjk->bij", y, y)) + 1


class CdistNet(nn.Module):
    """cdist with p=2 over 30 rows (a GEMM inside) plus p=1 (elementwise)."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        d2 = torch.cdist(a, b)
        d1 = torch.cdist(a, b, p=1.0)
        return torch.exp(-d2) + torch.tanh(d1) * 0.5


class NormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gn = nn.GroupNorm(2, 8)
        self.inorm = nn.InstanceNorm2d(8, affine=True)
        self.ln = nn.LayerNorm([8, 6, 6])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(F.gelu(self.inorm(self.gn(x)))) * 2


class PoolNet(nn.Module):
    """Pooling and elementwise ops only: no GEMM, no convolution."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.max_pool2d(x, 3, stride=2, padding=1)
        b = F.avg_pool2d(x, 2)
        c = F.adaptive_avg_pool2d(x, (2, 2))
        y = a.mean((2, 3)) + b.amax((2, 3)) - c.flatten(2).sum(-1)
        y = torch.where(y > 0, y.exp(), y.sin()) * y.cos()
        return (y.softmax(-1) + y.log_softmax(-1).abs()).pow(2).rsqrt() + y


class UpsampleNet(nn.Module):
    """Transposed and depthwise 2D convolutions around bilinear and nearest upsampling."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)
        self.c = nn.Conv2d(3, 3, 3, padding=1, groups=3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.up(x))
        y = F.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False) + F.interpolate(
            y, scale_factor=2, mode="nearest")
        return self.c(y).clamp(max=3.0).sigmoid()


class EmbeddingNet(nn.Module):
    """Token and position embeddings, a 1D convolution over the sequence, layer norm."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.pos = nn.Parameter(torch.randn(12, 16) / 4)
        self.conv = nn.Conv1d(16, 16, 3, padding=2, dilation=2)
        self.bn = nn.BatchNorm1d(16)
        self.ln = nn.LayerNorm(16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        y = self.emb(ids) + self.pos
        y = F.silu(self.bn(self.conv(y.transpose(1, 2)))).transpose(1, 2)
        return torch.tanh(self.ln(y + 1)).cumsum(1)


def _x(*shape: int) -> Callable[[torch.dtype], tuple[torch.Tensor, ...]]:
    return lambda dtype: (torch.randn(*shape).to(dtype),)


def _xs(*shapes: tuple[int, ...]) -> Callable[[torch.dtype], tuple[torch.Tensor, ...]]:
    return lambda dtype: tuple(torch.randn(*s).to(dtype) for s in shapes)


def _ids(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, 50, (3, 12)),)


FP32_ONLY = (torch.float32,)
BOTH = (torch.float32, torch.float16)


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    model: Callable[[], nn.Module]
    inputs: Callable[[torch.dtype], tuple[torch.Tensor, ...]]
    turing_refuses: tuple[torch.dtype, ...] = ()  # dtypes in which SM 7.5 keeps some op in PyTorch


ZOO: tuple[Entry, ...] = (
    Entry("mlp", MLP, _x(4, 16), FP32_ONLY),
    Entry("convnet", ConvNet, _x(2, 3, 16, 16)),
    Entry("resnetish", ResNetish, _x(2, 3, 16, 16), FP32_ONLY),
    Entry("self_attention", SelfAttention, _x(2, 6, 32), FP32_ONLY),
    Entry("manual_attention", ManualAttention, _xs((2, 6, 8), (2, 6, 8)), FP32_ONLY),
    Entry("mha", MHA, _x(2, 6, 32), FP32_ONLY),
    Entry("encoder_layer", EncoderLayer, _x(6, 2, 32), FP32_ONLY),
    Entry("conv3d", Conv3dNet, _x(1, 2, 6, 6, 6), BOTH),
    Entry("padded_conv3d", PaddedConv3d, _x(1, 2, 5, 5, 5), BOTH),
    Entry("conv_transpose3d", ConvTranspose3dNet, _x(1, 4, 3, 3, 3), FP32_ONLY),
    Entry("upsample", UpsampleNet, _x(1, 4, 5, 5)),
    Entry("einsum", EinsumNet, _x(2, 5, 8), FP32_ONLY),
    Entry("cdist", CdistNet, _xs((30, 8), (28, 8)), FP32_ONLY),
    Entry("norms", NormNet, _x(2, 8, 6, 6)),
    Entry("pooling", PoolNet, _x(2, 3, 9, 9)),
    Entry("embedding", EmbeddingNet, _ids),
)
