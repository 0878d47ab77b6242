"""The region op (`torch.ops.trtrtx.region`): registry, real and fake implementations."""

from __future__ import annotations

import gc
import operator

import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.shape_prop import ShapeProp

from rtx_backend._errors import RtxBackendError
from rtx_backend.run.executors import TorchExecutor
from rtx_backend.run.region import RegionModule
from rtx_backend.run.region_op import REGION, REGION_INTS, RegionCall, as_op_graph, lookup


class Body(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.relu(x @ self.w)
        return (y, y.t())  # the second output is a transposed view


def region(module: nn.Module | None = None) -> RegionModule:
    gm = torch.fx.symbolic_trace(module or Body())
    return RegionModule("trtrtx_region_0", gm, None, None, TorchExecutor(gm), device=torch.device("cpu"))


def test_op_runs_the_region_and_returns_fresh_contiguous_outputs():
    module = region()
    call = RegionCall(module, [("t", 0)])
    x = torch.randn(3, 8)
    y, yt = REGION(call.key, [x])
    ref = module.graph_module(x)
    torch.testing.assert_close(y, ref[0])
    torch.testing.assert_close(yt, ref[1])
    assert yt.is_contiguous()  # what TensorRT-RTX and ONNX Runtime return; the fake says so too


def test_op_never_returns_an_alias_of_an_input():
    class Same(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
            return (x.view(-1),)

    call = RegionCall(region(Same()), [("t", 0)])
    x = torch.randn(2, 3)
    (out,) = REGION(call.key, [x])
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    torch.testing.assert_close(out, x.view(-1))


def test_ints_overload_puts_arguments_back_in_order():
    class Sized(nn.Module):
        def forward(self, n: int, x: torch.Tensor) -> tuple[torch.Tensor]:
            return (x.reshape(n, -1) * 2,)

    gm = torch.fx.symbolic_trace(Sized())
    module = RegionModule("r", gm, None, None, TorchExecutor(gm), device=torch.device("cpu"))
    call = RegionCall(module, [("i", 0), ("t", 0)])
    x = torch.randn(4, 6)
    (out,) = REGION_INTS(call.key, [x], [8])
    torch.testing.assert_close(out, x.reshape(8, -1) * 2)


def test_unknown_and_released_keys_raise_a_clear_error():
    with pytest.raises(RtxBackendError, match="no live region 'nope'"):
        REGION("nope", [torch.randn(1)])
    call = RegionCall(region(), [("t", 0)])
    key = call.key
    assert lookup(key) is call
    del call
    gc.collect()
    with pytest.raises(RtxBackendError, match="released"):
        lookup(key)


def test_fake_implementation_gives_symbolic_shapes_under_make_fx():
    call = RegionCall(region(), [("t", 0)])

    def f(x: torch.Tensor) -> torch.Tensor:
        y, yt = REGION(call.key, [x])
        return y.sum(0) + yt.sum(1)

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(5, 8))
    node = next(n for n in gm.graph.nodes if n.target is REGION)
    y, yt = node.meta["val"]
    assert isinstance(y.shape[0], torch.SymInt) and y.shape[1] == 4
    assert yt.shape[0] == 4 and isinstance(yt.shape[1], torch.SymInt)
    assert yt.is_contiguous()
    torch.testing.assert_close(gm(torch.randn(7, 8)).shape, torch.Size([4]))


def test_torch_export_carries_a_graph_holding_the_op():
    call = RegionCall(region(), [("t", 0)])

    class Wrapper(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y, _ = REGION(call.key, [torch.sin(x)])
            return y * 2

    batch = torch.export.Dim("batch", min=2, max=64)
    ep = torch.export.export(Wrapper(), (torch.randn(3, 8),), dynamic_shapes={"x": {0: batch}})
    assert any(n.target is REGION for n in ep.graph.nodes)
    out = next(n for n in ep.graph.nodes if n.op == "output").args[0][0]
    assert str(out.meta["val"].shape[0]) == "s0" or isinstance(out.meta["val"].shape[0], torch.SymInt)
    x = torch.randn(9, 8)
    torch.testing.assert_close(ep.module()(x), Wrapper()(x))


def test_as_op_graph_rewrites_region_calls_and_inlines_pytorch_regions():
    module = region()

    x = torch.randn(3, 8)
    ShapeProp(module.graph_module).propagate(x)
    for n in module.graph_module.graph.nodes:
        if hasattr(n.meta.get("tensor_meta"), "shape"):
            n.meta["val"] = torch.empty(n.meta["tensor_meta"].shape)
    graph = torch.fx.Graph()  # as the partitioner makes it: a call_module of the region
    p = graph.placeholder("x")
    p.meta["val"] = x
    call = graph.call_module("trtrtx_region_0", (p,))
    graph.output(graph.call_function(operator.add, (graph.call_function(operator.getitem, (call, 0)), 1)))
    root = nn.Module()
    root.trtrtx_region_0 = module
    parent = torch.fx.GraphModule(root, graph)
    # a region that runs in PyTorch, given no runner, is inlined
    inlined, calls = as_op_graph(parent)
    assert not calls and not any(n.op == "call_module" for n in inlined.graph.nodes)
    torch.testing.assert_close(inlined(x), module.graph_module(x)[0] + 1)
    # given a runner, it becomes an op call
    op_gm, calls = as_op_graph(parent, lambda m: m)
    assert REGION in [n.target for n in op_gm.graph.nodes] and calls, op_gm.graph
    torch.testing.assert_close(op_gm(x), module.graph_module(x)[0] + 1)
