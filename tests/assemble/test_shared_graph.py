"""A partitioned graph whose frozen weights become inputs again (rtx_backend/assemble/shared_graph.py): the rest
reads the placeholders, each region that read a weight takes it as an input of its own, and the result is the
same for any weights of the same specs."""

from __future__ import annotations

import torch

from rtx_backend._record import recording
from rtx_backend.assemble.shared_graph import frozen_uses, weights_as_inputs
from rtx_backend.export.bridge import export_region


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)) + self.a.bias)  # (a weight read twice)


def partitioned(model: torch.nn.Module, x: torch.Tensor) -> torch.fx.GraphModule:
    compiled = torch.compile(model, backend="trtrtx", options={"min_block_size": 1, "target_compute_capabilities": [(8, 6)]})
    with torch.inference_mode(), recording() as graphs:
        compiled(x)
    (graph,) = graphs
    return graph.plan.graph_module


def test_the_weights_become_inputs_of_the_graph_and_of_its_regions():
    torch.manual_seed(0)
    model = Net().eval()
    with torch.inference_mode():
        x = torch.randn(3, 8)
    gm = partitioned(model, x)
    (name,) = [n for n, m in gm.named_children() if "region" in n]
    uses = frozen_uses(getattr(gm, name).graph_module)
    assert len(uses) == 4
    shared = set(uses)
    new, regions = weights_as_inputs(gm, shared)
    assert list(regions) == [name]
    region_gm = regions[name]
    assert not frozen_uses(region_gm) and not [n for n, _ in region_gm.named_buffers() if "_frozen_" in n]
    placeholders = [n.name for n in region_gm.graph.find_nodes(op="placeholder")]
    assert {int(p.removeprefix("weight_")) for p in placeholders[-4:]} == shared  # each once, after the region's own
    # the outer call passes the weights, and the region (here in PyTorch) computes with any of them
    setattr(new, name, region_gm)
    torch.fx.GraphModule.recompile(new)
    other = Net().eval()
    with torch.inference_mode():
        torch.testing.assert_close(new(*_dynamo_inputs(gm, other, x))[0], other(x))
        torch.testing.assert_close(new(*_dynamo_inputs(gm, model, x))[0], model(x))
    # exported, the weights are ONNX inputs, not initializers
    onnx = export_region(torch.fx.GraphModule(region_gm, region_gm.graph), keep_weights=True)
    assert len(onnx.inputs) == 1 + 4


def _dynamo_inputs(gm: torch.fx.GraphModule, model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """The partitioned graph's inputs for `model`: its parameters where the graph froze them, else x."""
    by_shape = {tuple(p.shape): p for p in model.parameters()}
    inputs = []
    for node in gm.graph.find_nodes(op="placeholder"):
        val = node.meta["val"]
        inputs.append(x if tuple(val.shape) == tuple(x.shape) else by_shape[tuple(val.shape)])
    return inputs
