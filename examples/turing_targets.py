"""Targeting Turing (RTX 20xx, SM 7.5): which ops stay in PyTorch, and why.

TensorRT-RTX cannot run FP32 matrix multiplies (GEMMs) or 3D convolutions on Turing, and Turing
has no bfloat16. When Turing is among the declared targets, trtrtx keeps such nodes in PyTorch
instead of handing TensorRT-RTX something its builder would reject. `rtx_backend.explain` shows
which nodes, and the rule that kept each one, without building an engine.

The fix is usually the dtype: in FP16, GEMMs and 2D convolutions run on Turing's tensor cores.

Runs anywhere. Without a GPU that TensorRT-RTX can run, the engines are still built ahead of
time for the declared targets and the regions run in ONNX Runtime: the script says so.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

import rtx_backend

TURING = [(7, 5)]
AMPERE = [(8, 6)]


class VideoClassifier(nn.Module):
    """A 3D convolution over a short clip, a 2D convolution per frame, and an MLP head."""

    def __init__(self) -> None:
        super().__init__()
        self.temporal = nn.Conv3d(3, 8, kernel_size=(3, 1, 1), padding=(1, 0, 0))
        self.spatial = nn.Conv2d(8, 16, 3, padding=1)
        self.head = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 5))

    def forward(self, clip: torch.Tensor) -> torch.Tensor:  # clip: (N, 3, T, H, W)
        y = torch.relu(self.temporal(clip)).mean(dim=2)  # -> (N, 8, H, W)
        y = torch.relu(self.spatial(y)).mean(dim=(2, 3))  # -> (N, 16)
        return self.head(y).softmax(-1)


FOLLOW_ON = ("min_block_size", "weights-only")  # rules whose nodes follow from other nodes' rules


def fallbacks(report: rtx_backend.ExplainReport) -> str:
    """'fp32-gemm-turing: 2, conv3d-turing: 1' or 'none'."""
    return ", ".join(f"{r.rule}: {r.nodes}" for r in report.rules if r.rule not in FOLLOW_ON) or "none"


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = VideoClassifier().eval().to(device)
    clip = torch.randn(2, 3, 4, 16, 16, device=device)
    options = {"min_block_size": 1}

    print("== FP32 for Turing: the full explain report ==")
    report = rtx_backend.explain(model, clip, options={**options, "target_compute_capabilities": TURING})
    print(report)

    print("\n== what stays in PyTorch, per target and dtype ==")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        m, x = model.to(dtype=dtype), clip.to(dtype=dtype)
        for name, targets in (("Turing SM7.5", TURING), ("Ampere SM8.6", AMPERE)):
            r = rtx_backend.explain(m, x, options={**options, "target_compute_capabilities": targets})
            print(f"  {str(dtype).removeprefix('torch.'):<9} {name}: {len(r.regions)} region(s); "
                  f"kept in PyTorch: {fallbacks(r)}")

    print("\n== FP16 for Turing and Ampere: compile and run ==")
    model, clip = model.to(dtype=torch.float16), clip.to(dtype=torch.float16)
    compiled = torch.compile(model, backend="trtrtx",
                             options={**options, "target_compute_capabilities": TURING + AMPERE})
    with torch.no_grad(), rtx_backend.recording() as rec:
        y = compiled(clip)
        expected = model.float()(clip.float())
    for region in rec.regions:
        print(f"  {region.name}: runs on {region.runtime}; engine {region.engine} ({region.engine_bytes} bytes)")
    if rec.runtimes != {"TensorRT-RTX"}:
        print(f"  no GPU that TensorRT-RTX can run here: engines were built ahead of time for "
              f"{TURING + AMPERE} and the regions ran in {', '.join(sorted(rec.runtimes))}")
    err = (y.float() - expected).abs().max().item()
    print(f"  max abs error vs FP32 eager: {err:.2e}")
    if err > 1e-2:
        raise SystemExit("result disagrees with eager")


if __name__ == "__main__":
    main()
