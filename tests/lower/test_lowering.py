"""Lowering: Dynamo's graph to a frozen ATen graph that the exporter and the policy can take."""

from __future__ import annotations

import warnings

import torch

import rtx_backend
from rtx_backend.lower import lowering as _lowering

from ..helpers import compile_and_run, regions


class ShiftedWindowMask(torch.nn.Module):
    """Swin's attention mask: a Python scalar assigned into slices of a fresh tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = x.new_zeros((8, 8))
        count = 0
        for h in ((0, 4), (4, 6), (6, 8)):
            for w in ((0, 4), (4, 6), (6, 8)):
                mask[h[0] : h[1], w[0] : w[1]] = count
                count += 1
        return (x * 2 + mask).softmax(-1)


def test_lift_ops_are_left_to_fake_tensor_mode():
    table = _lowering.decompositions()
    aten = torch.ops.aten
    assert aten.lift_fresh.default not in table and aten.lift.default not in table
    assert aten.alias_copy.default in table  # the rest of the exporter's table is kept


def test_slice_assignment_of_a_scalar_lowers():
    """It used to fail in aot_autograd (a real tensor reached fake kernels), and the whole graph
    ran in PyTorch with a warning."""
    model = ShiftedWindowMask().eval()
    x = torch.randn(2, 8, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compile_and_run(model, x, target_compute_capabilities=[(8, 6)], min_block_size=1)
    assert not [w for w in caught if "runs in PyTorch" in str(w.message)]
    torch.testing.assert_close(out, model(x))
    assert regions(), "no region: the graph ran in PyTorch"
    report = rtx_backend.explain(model, x, options={"target_compute_capabilities": [(8, 6)], "min_block_size": 1})
    assert not any(g.error for g in report.graphs)
    assert report.regions and not report.eager_nodes
