"""Cross-check what trtrtx lowered: every region in PyTorch, ONNX Runtime and TensorRT-RTX.

    python examples/crosscheck.py [--dump DIR]

`rtx_backend.crosscheck(model, *inputs, options=...)` compiles the model as torch.compile would,
runs each lowered region's FX graph (PyTorch), its ONNX model (ONNX Runtime) and its engine
(TensorRT-RTX, where this GPU can run it) on the inputs that region really receives, and
compares them. The report is true only when everything agrees; printing it gives a table with,
per region and output, the errors, the smallest atol/rtol that would have passed, NaN/Inf
counts and whether the output is all zeros.

Runs anywhere: without a GPU that TensorRT-RTX can run, the engines are still built for the
declared target and the TensorRT-RTX rows say why they were skipped. The script says which
runtimes were compared, and exits with status 1 when the report fails.
"""

from __future__ import annotations

import argparse
import logging
import sys

import torch
from torch import nn

import rtx_backend


class Block(nn.Module):
    """A conv stem, a softmax kept in PyTorch (so there are two regions), and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(4), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(128, 64), nn.GELU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.stem(x).softmax(-1)
        return self.head(features), features


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump", metavar="DIR", help="also write each region's ONNX model there")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Block().eval().to(device)
    x = torch.randn(4, 3, 16, 16, device=device)
    options = {
        "min_block_size": 1,
        "torch_executed_ops": ["aten._softmax"],  # keep one op in PyTorch: two regions
        # Declared targets let the builder run without a GPU; on a GPU, None means "this GPU".
        "target_compute_capabilities": None if device == "cuda" else [(8, 6)],
    }
    if args.dump:
        options["dump_onnx_dir"] = args.dump

    # Tolerances: one number for all outputs, or per output name with "" as the default.
    # Here the head's logits (output_0 of the last region and of the model) get a looser rtol.
    report = rtx_backend.crosscheck(model, x, options=options, rtol={"model/output_0": 2e-2, "": 1e-2})
    print(report)
    print()
    skipped = sorted({f"{c.runtime}: {c.skipped}" for c in report.checks if c.skipped})
    print(f"device: {device}; regions: {len(report.regions)}; "
          f"runtimes compared with PyTorch: {', '.join(report.runtimes) or 'none'}")
    for line in skipped:
        print(f"  not compared here: {line}")
    if args.dump:
        print(f"ONNX models and their input shapes (JSON) written to {args.dump}")
    print("all runtimes agree" if report else "DISAGREEMENT: see the failures above")
    return 0 if report else 1


if __name__ == "__main__":
    sys.exit(main())
