"""The exporter's optimizer with its rewrite rules anchored on their pattern's op
(rtx_backend/export/optimize.py): the same optimized model as ONNXProgram.optimize, and the same
rules in the same order."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
import torch
from torch import nn

from rtx_backend.export import optimize as _optimize


class RotateHalf(nn.Module):
    """Llama's rotate_half beside a linear layer: two Slices of one tensor in a graph of other
    ops (the exporter's Slices have steps, which SlicesSplit's pattern does not take)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        rotated = torch.cat((-y[..., 4:8], y[..., :4]), dim=-1)
        return torch.relu(rotated * y + x)


def _program() -> torch.onnx.ONNXProgram:
    torch.manual_seed(0)
    with torch.no_grad():
        return torch.onnx.export(RotateHalf().eval(), (torch.randn(2, 3, 8),), dynamo=True, optimize=False,
                                 verbose=False, report=False)


def _bytes(model: ir.Model) -> bytes:
    return ir.serde.serialize_model(model).SerializeToString()  # type: ignore[no-any-return]


def _halves(pairs: int = 1, others: int = 0) -> torch.onnx.ONNXProgram:
    """x (2x8) -> `pairs` times Slice(x, 0:4) and Slice(x, 4:8) on the last axis, summed, beside
    a Relu: SlicesSplit's pattern (begins, ends and axes constant, no steps), which its matcher
    finds and checks; and `others` Slices of another tensor, which it must not try."""
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2, 8]))
    consts = {n: ir.Value(name=n, const_value=ir.tensor(np.array(v, dtype=np.int64), name=n))
              for n, v in (("zero", [0]), ("half", [4]), ("end", [8]), ("axis", [-1]))}
    y = ir.node("Neg", [x])
    nodes, total = [y], None
    for _ in range(pairs):
        low = ir.node("Slice", [x, consts["zero"], consts["half"], consts["axis"]])
        high = ir.node("Slice", [x, consts["half"], consts["end"], consts["axis"]])
        nodes += [low, high]
        for part in (low, high):
            if total is None:
                total = part.outputs[0]
            else:
                nodes.append(ir.node("Add", [total, part.outputs[0]]))
                total = nodes[-1].outputs[0]
    for _ in range(others):
        nodes += [ir.node("Slice", [y.outputs[0], consts["zero"], consts["half"], consts["axis"]])]
        nodes.append(ir.node("Add", [total, nodes[-1].outputs[0]]))
        total = nodes[-1].outputs[0]
    relu = ir.node("Relu", [total])
    out = relu.outputs[0]
    out.name, out.dtype, out.shape = "out", ir.DataType.FLOAT, ir.Shape([2, 4])
    graph = ir.Graph([x], [out], nodes=[*nodes, relu], initializers=list(consts.values()),
                     opset_imports={"": 18})
    return torch.onnx.ONNXProgram(ir.Model(graph, ir_version=9), None)


@pytest.mark.parametrize("make", [
    _program, _halves,
    lambda: _halves(pairs=2),  # each Slice could pair with two: onnxscript's order decides
    lambda: _halves(others=6),
], ids=["export", "slices into a split", "two pairs of slices", "slices of another tensor beside"])
def test_same_model_as_the_exporters_optimizer(make) -> None:  # type: ignore[no-untyped-def]
    plain, anchored = make(), make()
    plain.optimize()
    _optimize.optimize(anchored)
    assert _bytes(anchored.model) == _bytes(plain.model)


def test_same_rules_in_the_same_order_each_simple_matcher_anchored() -> None:
    from onnxscript import rewriter
    from onnxscript.rewriter import _matcher

    rules = _optimize.anchored_rules()
    if rules is None:
        pytest.skip("this onnxscript's rewriter is not laid out as export/optimize.py expects")
    default = rewriter._DEFAULT_REWRITE_RULES
    assert [r.name for r in rules] == [r.name for r in default]
    for old, new in zip(default, rules):
        if type(old._matcher) is _matcher.SimplePatternMatcher:
            assert new is not old and type(new._matcher) is _optimize._anchored_matcher()
            assert new._matcher.pattern is old._matcher.pattern
            assert new._replacement_pattern is old._replacement_pattern
        else:
            assert new is old
    assert any(not r._target_pattern.has_single_output_node for r in rules)  # SlicesSplit's kind


def test_the_default_rules_are_left_as_they_were() -> None:
    from onnxscript import rewriter

    before = rewriter._DEFAULT_REWRITE_RULES
    _optimize.optimize(_program())
    assert rewriter._DEFAULT_REWRITE_RULES is before


class _Unindexable:
    """A graph stand-in that fails the test if the matcher iterates it (to index it)."""

    def __init__(self, graph: ir.Graph) -> None:
        self.graph = graph  # (as an ir.Function has it)

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise AssertionError("the graph was indexed")


def _slices_split() -> object:
    rules = _optimize.anchored_rules()
    if rules is None:
        pytest.skip("this onnxscript's rewriter is not laid out as export/optimize.py expects")
    return next(r for r in rules if not r._target_pattern.has_single_output_node)


def test_a_node_of_another_op_is_refused_before_the_graph_is_indexed() -> None:
    rule = _slices_split()
    program = _program()
    graph = program.model.graph  # type: ignore[attr-defined]
    other = next(n for n in graph if n.op_type != rule._matcher.pattern.output_nodes[0].op_type)  # type: ignore[attr-defined]
    assert not rule._matcher.match(program.model, _Unindexable(graph), other)  # type: ignore[attr-defined]


def test_a_slice_is_tried_with_the_slices_of_its_own_tensor_only() -> None:
    from onnxscript.rewriter import _matcher

    rule = _slices_split()
    program = _halves(others=6)
    graph = program.model.graph  # type: ignore[attr-defined]
    tried: list[tuple[object, ...]] = []
    matcher = rule._matcher  # type: ignore[attr-defined]
    multi = matcher._multi_match
    matcher._multi_match = lambda combination, **kw: (tried.append(combination), multi(combination, **kw))[1]
    try:
        for node in [n for n in graph if n.op_type == "Slice"]:
            tried.clear()
            ours = matcher.match(program.model, graph, node)
            reads = node.inputs[0]
            assert tried and all(c[1].inputs[0] is reads for c in tried[:-1])  # (the last: the match, again)
            assert len(tried) <= 1 + sum(1 for u in reads.uses() if u.node.op_type == "Slice")
            theirs = _matcher.SimplePatternMatcher.match(matcher, program.model, graph, node)
            assert bool(ours) == bool(theirs)
            assert [id(n) for n in ours.nodes] == [id(n) for n in theirs.nodes]
    finally:
        del matcher._multi_match


def test_a_slice_alone_on_its_tensor_is_matched_without_indexing_the_graph() -> None:
    rule = _slices_split()
    program = _halves(others=1)
    graph = program.model.graph  # type: ignore[attr-defined]
    alone = next(n for n in graph if n.op_type == "Slice" and n.inputs[0].name != "x")
    match = rule._matcher.match(program.model, _Unindexable(graph), alone)  # type: ignore[attr-defined]
    assert match and list(match.nodes) == [alone, alone]  # (as onnxscript finds it; its check then fails)


def test_several_matches_are_taken_in_the_graphs_order() -> None:
    from onnxscript.rewriter import _matcher

    rule = _slices_split()
    program = _halves(pairs=2)
    graph = program.model.graph  # type: ignore[attr-defined]
    for node in [n for n in graph if n.op_type == "Slice"]:
        ours = rule._matcher.match(program.model, graph, node)  # type: ignore[attr-defined]
        theirs = _matcher.SimplePatternMatcher.match(rule._matcher, program.model, graph, node)  # type: ignore[attr-defined]
        assert ours and [id(n) for n in ours.nodes] == [id(n) for n in theirs.nodes]
