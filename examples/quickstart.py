"""Quickstart: compile a small conv net for Turing and Ampere RTX GPUs with the trtrtx backend.

Runs anywhere. On a machine whose GPU TensorRT-RTX can run, the regions run as TensorRT-RTX
engines. Without one, the engines are still built ahead of time for the declared targets
(TensorRT-RTX's builder needs no GPU for them) and the regions run in ONNX Runtime: the script
says which happened.
"""

from __future__ import annotations

import logging
import time

import torch
from torch import nn

import rtx_backend

TARGETS = [(7, 5), (8, 6)]  # Turing (RTX 20xx) and Ampere (RTX 30xx)


class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x)).softmax(-1)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)  # the same weights every run: a second run of this script loads its engine too
    dtype = torch.float16  # Turing runs FP16 GEMMs and convolutions on TensorRT-RTX, not FP32 GEMMs
    model = SmallNet().eval().to(device, dtype)
    x = torch.randn(8, 3, 32, 32, device=device, dtype=dtype)

    compiled = torch.compile(model, backend="trtrtx",
                             options={"target_compute_capabilities": TARGETS, "min_block_size": 1})
    start = time.perf_counter()
    with torch.no_grad(), rtx_backend.recording() as rec:  # what trtrtx compiled, and where it runs
        y = compiled(x)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        ref = model.float()(x.float())  # (moved back to FP16 for the second start below)
    err = (y.float() - ref).abs().max().item()

    print(f"device: {device}; targets: {TARGETS}; first call (compile + run): {seconds:.1f}s")
    print(rec)  # per region: where it runs (TensorRT-RTX, ONNX Runtime or PyTorch), why, and its engine
    if rec.runtimes == {"TensorRT-RTX"}:
        print("ran on TensorRT-RTX engines")
    else:
        print(f"no GPU that TensorRT-RTX can run here: engines were built ahead of time for {TARGETS} "
              f"and the regions ran in {', '.join(sorted(rec.runtimes))}")
    print(f"max abs error vs FP32 eager: {err:.2e}; output {tuple(y.shape)} {y.dtype}")
    if err > 1e-2:
        raise SystemExit("result disagrees with eager")

    # A second start, as in a new process: Dynamo forgets the model, trtrtx's engine cache does not,
    # so the engines are loaded from the cache instead of built (python -m rtx_backend info shows it).
    torch._dynamo.reset()
    model.half()
    compiled = torch.compile(model, backend="trtrtx",
                             options={"target_compute_capabilities": TARGETS, "min_block_size": 1})
    start = time.perf_counter()
    with torch.no_grad(), rtx_backend.recording() as again:
        compiled(x)
    loaded = sum(r.engine == "loaded from the engine cache" for r in again.regions)
    print(f"second start (compile + run): {time.perf_counter() - start:.1f}s; "
          f"{loaded} of {len(again.regions)} engine(s) loaded from the engine cache, none built")
    if loaded != len(again.regions) or not loaded:
        raise SystemExit("the engine cache was not used: see the warnings above")


if __name__ == "__main__":
    main()
