"""The trtrtx::engine op: torch.export.load runs a package through it, it checks its bytes, and its
fake kernel gives the outputs' shapes from the inputs' symbols."""

from __future__ import annotations

import json

import pytest
import torch

from rtx_backend import PackageError
from rtx_backend.assemble import package_op as _package_op

from .packages import check


def test_torch_export_load_runs_it_after_import_rtx_backend(saved):
    path, _ = saved
    module = torch.export.load(str(path)).module()
    check(module, torch.randn(4, 3, 16, 16))
    assert "trtrtx.engine" in module.code


def test_engine_bytes_are_checked_when_the_op_runs(saved):
    path, _ = saved
    module = torch.export.load(str(path)).module()
    plan = next(b for n, b in module.named_buffers() if n.endswith("_plan"))
    plan[0] ^= 1  # the buffer changed after loading: the op's first call refuses it
    with pytest.raises(PackageError, match="not the one the package was saved with"):
        module(torch.randn(4, 3, 16, 16))


def test_fake_kernel_gives_shapes_from_the_inputs_symbols():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from rtx_backend._types import OnnxRegion, TensorSpec
    from rtx_backend.cache.engines import _region_to_json

    specs = (TensorSpec("input_0", ("s0", "s1", 4), torch.float16, (2, 3, 4)),)
    outs = (TensorSpec("output_0", ("s0*s1", "(s0//2)", 4), torch.float16, (6, 1, 4)),
            TensorSpec("output_1", ("Max(1,s0)+2", 1), torch.float32, (4, 1)))
    meta = json.dumps({"format": 1, "name": "r", "region": _region_to_json(OnnxRegion(b"", (0,), specs, outs)),
                       "profile": {}, "plan": {}, "onnx": {}, "options": {}})
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        x = mode.from_tensor(torch.empty(6, 5, 4, dtype=torch.float16))
        a, b = _package_op._engine_fake(torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.uint8), meta, [x])
    assert tuple(a.shape) == (30, 3, 4) and a.dtype == torch.float16
    assert tuple(b.shape) == (8, 1) and b.dtype == torch.float32
