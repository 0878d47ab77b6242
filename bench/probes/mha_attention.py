"""GPU probe: why is a ViT-B/16 built on nn.MultiheadAttention (torchvision's vit_b_16) slower on
TensorRT-RTX than one built on F.scaled_dot_product_attention (timm's deit)? Two encoders with the
same weights (12 layers, 768 wide, 12 heads, 197 tokens, FP16): `mha` as torchvision writes its
block, `sdpa` with the attention spelled as timm does. For each, through trtrtx and public API
only: the regions' ONNX op counts (from `dump_onnx_dir`; nn.MultiheadAttention runs
sequence-first: a transpose in and out, the packed QKV as a 5-D Unsqueeze/Transpose/Squeeze and
three Gathers, each head's q/k/v transposed again), where each region ran (`rtx_backend.recording()`),
the compiled model's time (CUDA events; the model is one region, so about its engine's), the
top kernels (torch.profiler), and inductor's time for the same model.

    python bench/probes/mha_attention.py [--batch 8] [--layers 12] [--calls 50] [--top 15]

On a CPU it prints the ONNX op counts only.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import rtx_backend

D, HEADS, TOKENS = 768, 12, 197


class MhaBlock(nn.Module):
    """torchvision's EncoderBlock."""

    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(D, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(D, HEADS, batch_first=True)
        self.ln_2 = nn.LayerNorm(D, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = x + y
        return x + self.mlp(self.ln_2(x))


class SdpaBlock(MhaBlock):
    """The same weights, the attention as timm writes it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        attn = self.self_attention
        qkv = F.linear(self.ln_1(x), attn.in_proj_weight, attn.in_proj_bias)
        q, k, v = qkv.reshape(b, n, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
        x = x + attn.out_proj(y)
        return x + self.mlp(self.ln_2(x))


def encoder(block: type[MhaBlock], layers: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[block() for _ in range(layers)])


def cuda_ms(fn: Any, calls: int) -> float:
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def top_kernels(fn: Any, calls: int, top: int) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per: dict[str, float] = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per[event.name] += event.device_time / calls
    rows = sorted(per.items(), key=lambda r: -r[1])[:top]
    return [f"{us:9.1f} us  {name[:140]}" for name, us in rows]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    import onnx

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    mha = encoder(MhaBlock, args.layers).eval().to(device, torch.float16).requires_grad_(False)
    sdpa = encoder(SdpaBlock, args.layers).eval().to(device, torch.float16).requires_grad_(False)
    sdpa.load_state_dict(mha.state_dict())
    x = torch.randn(args.batch, TOKENS, D, device=device, dtype=torch.float16)
    options = {"engine_cache_dir": "", "validate": False}
    if not cuda:
        options["target_compute_capabilities"] = [(8, 6)]
    results: dict[str, Any] = {}
    for name, model in (("mha", mha), ("sdpa", sdpa)):
        torch._dynamo.reset()
        dump = Path(tempfile.mkdtemp(prefix=f"mha-{name}-"))
        ours = torch.compile(model, backend="trtrtx", options={**options, "dump_onnx_dir": str(dump)})
        with torch.inference_mode(), rtx_backend.recording() as record:
            out = ours(x)
        regions = record.regions
        ops = collections.Counter(n.op_type for f in sorted(dump.glob("*.onnx"))
                                  for n in onnx.load(str(f), load_external_data=False).graph.node)
        row: dict[str, Any] = {"regions": len(regions), "runtimes": [r.runtime for r in regions],
                               "onnx_ops": dict(ops.most_common())}
        print(f"== {name}: {row}", flush=True)
        if cuda:
            with torch.inference_mode():
                ref = model(x)
                row["max_err_vs_eager"] = (out.float() - ref.float()).abs().max().item()
                row["trtrtx_ms"] = cuda_ms(lambda ours=ours: ours(x), args.calls)
                torch._dynamo.reset()
                inductor = torch.compile(model)
                inductor(x)
                row["inductor_ms"] = cuda_ms(lambda inductor=inductor: inductor(x), args.calls)
                row["eager_ms"] = cuda_ms(lambda model=model: model(x), args.calls)
                print("\n".join(top_kernels(lambda ours=ours: ours(x), 10, args.top)))
        results[name] = row
        print(f"== {name}: {json.dumps({k: v for k, v in row.items() if k != 'onnx_ops'})}", flush=True)
    if cuda:
        print(f"trtrtx time mha / sdpa: {results['mha']['trtrtx_ms'] / results['sdpa']['trtrtx_ms']:.2f}x; "
              f"inductor mha {results['mha']['inductor_ms']:.3f} ms, sdpa {results['sdpa']['inductor_ms']:.3f} ms")


if __name__ == "__main__":
    main()
