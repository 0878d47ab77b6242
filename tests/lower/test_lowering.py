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


class _StaticState(torch.nn.Module):
    """A plain tensor attribute marked static (as a static KV cache is) and written in place."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.state = torch.zeros(4, 8)
        torch._dynamo.mark_static_address(self.state)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.state.index_copy_(0, pos, self.proj(x))
        return (self.state * 2).relu().sum(0)


def test_a_static_tensor_the_graph_writes_is_state_not_a_weight():
    """Frozen as a weight, the state would change on every call and look like changed weights
    (each call in PyTorch while engines are rebuilt). It stays an input; the weights are frozen."""
    import re

    eager, compiled_model = _StaticState().eval(), _StaticState().eval()
    compiled_model.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_model, backend="trtrtx", options={"min_block_size": 1, "engine_cache_dir": ""})
    with torch.no_grad(), rtx_backend.recording() as rec:
        for step in range(4):
            x, pos = torch.randn(1, 8), torch.tensor([step])
            torch.testing.assert_close(compiled(x, pos), eager(x, pos))
    torch.testing.assert_close(compiled_model.state, eager.state)
    assert rec.regions and all(r.runtime != "PyTorch" for r in rec.regions), str(rec)
    assert not [k for k in rtx_backend.stats() if re.search(r"weight_(updates|refits|rebuilds|fallbacks)|rebuilds", k)]


def test_mutated_inputs_names_the_placeholders_written_in_place():
    graph = torch.fx.Graph()
    state, x, _unused = graph.placeholder("state"), graph.placeholder("x"), graph.placeholder("w")
    added = graph.call_function(torch.ops.aten.add.Tensor, (x, x))
    graph.call_function(torch.ops.aten.copy_.default, (state, added))
    graph.output(added)
    assert _lowering.mutated_inputs(torch.fx.GraphModule(torch.nn.Module(), graph)) == {0}
