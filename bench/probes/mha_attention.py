"""GPU probe: why is a ViT-B/16 built on nn.MultiheadAttention (torchvision's vit_b_16) slower on
TensorRT-RTX than one built on F.scaled_dot_product_attention (timm's deit)? Two encoders with the
same weights (12 layers, 768 wide, 12 heads, 197 tokens, FP16): `mha` as torchvision writes its
block, `sdpa` with the attention spelled as timm does. For each, through trtrtx: the region's
ONNX op counts (nn.MultiheadAttention runs sequence-first: a transpose in and out, the packed QKV
as a 5-D Unsqueeze/Transpose/Squeeze and three Gathers, each head's q/k/v transposed again), the
engine's time alone (CUDA events), the engine's fused-attention layers (engine inspector), the
top kernels (torch.profiler), and inductor's time for the same model.

    python bench/probes/mha_attention.py [--batch 8] [--layers 12] [--calls 50] [--top 15]

On a CPU it prints the ONNX op counts only.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rtx_backend._record import recording

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


def fused_layers(executor: Any) -> list[str]:
    from rtx_backend import _trt

    trt = _trt.trt()
    info = json.loads(executor.engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON))
    names = [str(layer.get("Name", layer)) if isinstance(layer, dict) else str(layer) for layer in info.get("Layers", [])]
    return names


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
        ours = torch.compile(model, backend="trtrtx", options=options)
        with torch.inference_mode(), recording() as graphs:
            out = ours(x)
        regions = [r for g in graphs for r in g.regions]
        ops = collections.Counter(n.op_type for r in regions for n in onnx.load_from_string(r.onnx.model).graph.node)
        row: dict[str, Any] = {"regions": len(regions), "kinds": [r.kind for r in regions],
                               "onnx_ops": dict(ops.most_common())}
        print(f"== {name}: {row}", flush=True)
        if cuda:
            with torch.inference_mode():
                ref = model(x)
                row["max_err_vs_eager"] = (out.float() - ref.float()).abs().max().item()
                row["trtrtx_ms"] = cuda_ms(lambda ours=ours: ours(x), args.calls)
                executors = [(r.executor, [x]) for r in regions if r.kind == "tensorrt_rtx"]
                if len(executors) == 1:
                    ex = executors[0][0]
                    row["engine_ms"] = cuda_ms(lambda ex=ex: ex([x]), args.calls)
                    layers = fused_layers(ex)
                    row["engine_layers"] = len(layers)
                    row["attention_layers"] = [n for n in layers if any(
                        k in n.lower() for k in ("mha", "attention", "fmha", "softmax"))][:6]
                    row["shuffle_layers"] = sum(any(k in n.lower() for k in ("shuffle", "transpose", "reformat", "copy"))
                                                for n in layers)
                torch._dynamo.reset()
                inductor = torch.compile(model)
                inductor(x)
                row["inductor_ms"] = cuda_ms(lambda inductor=inductor: inductor(x), args.calls)
                row["eager_ms"] = cuda_ms(lambda model=model: model(x), args.calls)
                print("\n".join(top_kernels(lambda ours=ours: ours(x), 10, args.top)))
        results[name] = row
        print(f"== {name}: {json.dumps({k: v for k, v in row.items() if k != 'onnx_ops'})}", flush=True)
    if cuda and "engine_ms" in results["mha"] and "engine_ms" in results["sdpa"]:
        print(f"engine time mha / sdpa: {results['mha']['engine_ms'] / results['sdpa']['engine_ms']:.2f}x; "
              f"inductor mha {results['mha']['inductor_ms']:.3f} ms, sdpa {results['sdpa']['inductor_ms']:.3f} ms")


if __name__ == "__main__":
    main()
