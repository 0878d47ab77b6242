"""What the package tests share: a small conv net, its options, and archive helpers."""

from __future__ import annotations

import json
import zipfile

import torch

TARGETS = [(8, 6), (8, 9)]
OPTIONS = {"target_compute_capabilities": TARGETS, "min_block_size": 1, "engine_cache_dir": None}


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.relu(self.conv2(y)) + y
        return self.fc(y.mean((2, 3))).softmax(-1)


def net() -> Net:
    torch.manual_seed(0)
    return Net().eval()


def check(module, x, model=None):
    with torch.no_grad():
        ref = (model or net())(x)
        out = module(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def rewrite(path, target, change):
    """The archive with `change(member name, data) -> data` applied to its members."""
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(target, "w") as dst:
        for item in src.infolist():
            dst.writestr(item, change(item.filename, src.read(item.filename)))
    return target


def metas(path):
    module = torch.export.load(str(path)).module()
    return [json.loads(n.args[2]) for n in module.graph.nodes if n.target is torch.ops.trtrtx.engine.default]


def region_json():
    from rtx_backend._types import OnnxRegion, TensorSpec
    from rtx_backend.cache.engines import _region_to_json

    spec = TensorSpec("input_0", ("s0", 2), torch.float32, (4, 2))
    return _region_to_json(OnnxRegion(b"", (0,), (spec,), (TensorSpec("output_0", ("s0", 2), torch.float32, (4, 2)),)))
