"""A static region exported without a second trace (rtx_backend/export/program.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rtx_backend
from rtx_backend.export import bridge
from rtx_backend.export.bridge import EXPORTED_AS, FROZEN, export_region
from rtx_backend.export.program import direct_program

from ..lower.test_registry import CASES, _check_against_graph, _region, _run, _seeded

STATIC = [c for c, (_, _, dynamic, _) in CASES.items() if not dynamic]


def _case(case: str) -> torch.fx.GraphModule:
    factory, x, dynamic, dtype = CASES[case]
    return _region(_seeded(factory).to(dtype), x.to(dtype), dynamic)


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    import copy

    return torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))


def _user_inputs(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    torch.manual_seed(3)
    vals = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    return [torch.randn(v.shape).to(v.dtype) for v in vals]


@pytest.mark.parametrize("case", STATIC)
def test_a_static_region_becomes_the_program_that_computes_it(case):
    gm = _case(case)
    program = direct_program(gm, EXPORTED_AS)
    assert program is not None
    specs = program.graph_signature.input_specs
    buffers = [s for s in specs if s.kind == torch.export.graph_signature.InputKind.BUFFER]
    assert buffers and all(s.target.startswith(EXPORTED_AS) for s in buffers)  # named as torch.export names them
    assert specs[: len(buffers)] == buffers  # lifted constants come first
    inputs = _user_inputs(gm)
    with torch.no_grad():
        for got, expected in zip(program.module()(*inputs), gm(*inputs), strict=True):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("case", STATIC)
def test_the_untraced_export_gives_the_model_the_traced_one_gives(case, monkeypatch):
    gm = _case(case)
    rtx_backend.reset_stats()
    untraced = export_region(_copy(gm))
    assert rtx_backend.stats()["exports_untraced"] == 1
    monkeypatch.setattr(bridge, "direct_program", lambda *a: None)
    traced = export_region(_copy(gm))
    assert rtx_backend.stats()["exports_traced"] == 1
    import onnx

    a, b = onnx.load_from_string(untraced.model), onnx.load_from_string(traced.model)
    assert [n.op_type for n in a.graph.node] == [n.op_type for n in b.graph.node]
    weights = [sorted(i.name for i in m.graph.initializer if FROZEN.search(i.name)) for m in (a, b)]
    assert weights[0] and weights[0] == weights[1]  # the weights, under the same names
    torch.manual_seed(1)
    feeds = [torch.randn([d if isinstance(d, int) else 3 for d in s.shape]).to(s.dtype).numpy() for s in untraced.inputs]
    for x, y in zip(_run(untraced.model, feeds), _run(traced.model, feeds), strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_dynamic_region_is_traced_by_torch_export():
    factory, x, dynamic, _ = CASES["dynamic-batch"]
    gm = _region(_seeded(factory), x, dynamic)
    assert direct_program(gm, EXPORTED_AS) is None
    rtx_backend.reset_stats()
    export_region(gm)
    assert rtx_backend.stats()["exports_traced"] == 1 and not rtx_backend.stats().get("exports_untraced")


def _handmade(returns_input: bool = False, twice: bool = False, no_val: bool = False) -> torch.fx.GraphModule:
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    def f(x, y):
        z = torch.ops.aten.mul.Tensor(x, y)
        if returns_input:
            return (z, x)
        return (z, z) if twice else (z,)

    gm = torch.fx.symbolic_trace(f)
    FakeTensorProp(gm).propagate(torch.randn(2, 3), torch.randn(2, 3))
    if no_val:
        next(n for n in gm.graph.nodes if n.op == "call_function").meta.pop("val")
    return gm


@pytest.mark.parametrize("kind", ["returns_input", "twice", "no_val"])
def test_a_region_this_does_not_build_is_left_to_torch_export(kind):
    gm = _handmade(**{kind: True})
    assert direct_program(gm, EXPORTED_AS) is None
    if kind != "no_val":  # (the bridge's own graphs always carry their values)
        region = export_region(gm)
        _check_against_graph(gm, region)


def test_a_weight_used_twice_is_lifted_once():
    """A region can read one weight through two get_attr nodes (a weight used by a matmul and a
    sum): torch.export lifts it once, and so does this."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    product = graph.call_function(torch.ops.aten.mm.default, (x, graph.get_attr("w")))
    total = graph.call_function(torch.ops.aten.sum.default, (graph.get_attr("w"),))
    graph.output((graph.call_function(torch.ops.aten.add.Tensor, (product, total)),))
    root = torch.nn.Module()
    root.register_buffer("w", torch.randn(4, 4))
    gm = torch.fx.GraphModule(root, graph)
    FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(torch.randn(2, 4))
    assert [str(n.target) for n in gm.graph.nodes if n.op == "get_attr"] == ["w", "w"]
    program = direct_program(gm, EXPORTED_AS)
    assert program is not None
    assert [s.target for s in program.graph_signature.input_specs if s.target is not None] == [EXPORTED_AS + "w"]
    region = export_region(_copy(gm))
    _check_against_graph(gm, region)


def test_a_program_that_fails_to_build_is_traced_instead(monkeypatch, caplog):
    def broken(*args):
        raise RuntimeError("cannot read this graph")

    monkeypatch.setattr(bridge, "direct_program", broken)
    gm = _case("mlp-gelu-layernorm")
    rtx_backend.reset_stats()
    with caplog.at_level("DEBUG", logger="rtx_backend"):
        region = export_region(_copy(gm))
    assert rtx_backend.stats()["exports_traced"] == 1
    assert "traced by torch.export" in caplog.text and "cannot read this graph" in caplog.text
    _check_against_graph(gm, region)


def test_an_untraced_program_that_needs_the_decomposition_pass_gets_it():
    """rsub is not in the exporter's registry: the pass decomposes it, on the untraced program too."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    def f(x, y):
        return (torch.ops.aten.rsub.Scalar(torch.ops.aten.mul.Tensor(x, y), 1.0),)

    gm = torch.fx.symbolic_trace(f)
    FakeTensorProp(gm).propagate(torch.randn(2, 3), torch.randn(2, 3))
    rtx_backend.reset_stats()
    region = export_region(gm)
    assert rtx_backend.stats()["exports_untraced"] == 1 and rtx_backend.stats()["exports_redecomposed"] == 1
    _check_against_graph(gm, region)
