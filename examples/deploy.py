"""Deploy: compile once on a build machine (no GPU needed), ship one .pt2, load and run it.

`rtx_backend.save` builds the TensorRT-RTX engines for the declared targets ahead of time and
writes them, with each region's ONNX model, into a `.pt2`. A fresh process then loads it with
`rtx_backend.load` (or plain `torch.export.load(path).module()` after `import rtx_backend`):
no Dynamo trace, no export, no engine build. On an RTX GPU of the targets the regions run as
TensorRT-RTX engines; elsewhere (this CPU, another GPU) in ONNX Runtime, and it says so.

    python examples/deploy.py [--out model.pt2]
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

import rtx_backend

TARGETS = [(8, 6), (8, 9)]  # Ampere (RTX 30xx) and Ada (RTX 40xx)


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


def build(path: Path) -> None:
    """The build machine: save the model for the targets, batch 1 to 32 in one engine."""
    torch.manual_seed(0)
    model = SmallNet().eval().half()
    x = torch.randn(8, 3, 32, 32, dtype=torch.half)
    start = time.perf_counter()
    saved = rtx_backend.save(model, (x,), path, options={"target_compute_capabilities": TARGETS},
                             dynamic_shapes={"x": {0: (1, 8, 32)}})
    print(f"saved {path.name} for {TARGETS} in {time.perf_counter() - start:.1f}s: {saved.size / 1e6:.2f} MB "
          f"(engines {saved.engine_bytes / 1e6:.2f} MB, ONNX models {saved.onnx_bytes / 1e6:.2f} MB)")
    torch.save(model.state_dict(), path.with_suffix(".reference.pt"))  # only to check the results


def run(path: Path) -> None:
    """The deployment machine, a fresh process: load and run."""
    start = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = rtx_backend.load(path, device=device)
    x = torch.randn(4, 3, 32, 32, dtype=torch.half, device=device)
    with torch.inference_mode():
        y = model(x)
    first = time.perf_counter() - start
    kinds = sorted({m.kind for m in model.modules() if isinstance(getattr(m, "kind", None), str)})
    where = {"tensorrt_rtx": "TensorRT-RTX", "onnxruntime": "ONNX Runtime", "pytorch": "PyTorch"}
    print(f"loaded and ran in {first:.2f}s on {device}; regions run on: {', '.join(where[k] for k in kinds)}")
    reference = SmallNet().eval()
    reference.load_state_dict(torch.load(path.with_suffix(".reference.pt"), weights_only=True))
    with torch.inference_mode():
        ref = reference.to(device)(x.float())
    print(f"max abs error vs FP32 eager: {(y.float() - ref).abs().max().item():.2e}; output {tuple(y.shape)}")


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, help="where to write the .pt2 (default: a temp directory)")
    parser.add_argument("--run", type=Path, help="only load and run this .pt2 (what the deployment runs)")
    args = parser.parse_args()
    if args.run:
        run(args.run)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = args.out or Path(tmp) / "smallnet.pt2"
        build(path)
        # a fresh process, as on the deployment machine: nothing traced, exported or built there
        subprocess.run([sys.executable, __file__, "--run", str(path)], check=True)


if __name__ == "__main__":
    main()
