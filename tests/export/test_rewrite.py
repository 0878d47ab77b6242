"""Weight transposes folded into Gemm flags (rtx_backend/export/rewrite.py), on hand-made graphs and on exports."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from torch import nn

import rtx_backend
from rtx_backend import _trt
from rtx_backend.export.bridge import export_region
from rtx_backend.export.rewrite import transposes_into_gemm

from ..lower.test_registry import _check_against_graph, _region, _seeded
from ..models import MLP

RNG = np.random.default_rng(0)


def _graph(build) -> tuple[ir.Model, dict[str, np.ndarray]]:
    """A one-input (x: 3x4 float) model; `build(x, w, gemm, transpose)` adds the nodes and returns
    the outputs. w is a 4x4 initializer; returns the model and the initializers' arrays."""
    w_array = RNG.standard_normal((4, 4)).astype(np.float32)
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([3, 4]))
    w = ir.Value(name="w", const_value=ir.tensor(w_array, name="w"))
    nodes: list[ir.Node] = []

    def node(op: str, inputs: list[ir.Value], **attrs: object) -> ir.Value:
        made = ir.node(op, inputs, attributes=attrs)
        nodes.append(made)
        return made.outputs[0]

    outputs = build(x, w, node)
    for i, out in enumerate(outputs):
        out.name = f"out_{i}"
        out.dtype = ir.DataType.FLOAT
    graph = ir.Graph([x], outputs, nodes=nodes, initializers=[w], opset_imports={"": 18})
    return ir.Model(graph, ir_version=9), {"w": w_array}


def _run(model: ir.Model, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def _ops(model: ir.Model) -> list[str]:
    return [n.op_type for n in model.graph]


CASES = {
    # name: (build, folded, expected ops after)
    "B": (lambda x, w, node: [node("Gemm", [x, node("Transpose", [w], perm=[1, 0])])], 1, ["Gemm"]),
    "B, already transposed": (
        lambda x, w, node: [node("Gemm", [x, node("Transpose", [w], perm=[1, 0])], transB=1)], 1, ["Gemm"]),
    "A": (lambda x, w, node: [node("Gemm", [node("Transpose", [w], perm=[1, 0]), node("Transpose", [x], perm=[1, 0])])],
          1, ["Transpose", "Gemm"]),  # the transpose of the input x stays
    "two Gemms": (lambda x, w, node: [
        node("Gemm", [x, t := node("Transpose", [w], perm=[1, 0])]), node("Gemm", [x, t], transB=1)], 1, ["Gemm", "Gemm"]),
    "MatMul": (lambda x, w, node: [node("MatMul", [x, node("Transpose", [w], perm=[1, 0])])], 1, ["Gemm"]),
    "a Gemm and a MatMul": (lambda x, w, node: [
        node("Gemm", [x, t := node("Transpose", [w], perm=[1, 0])]), node("MatMul", [x, t])], 1, ["Gemm", "Gemm"]),
    "a batched MatMul": (lambda x, w, node: [
        node("MatMul", [node("Unsqueeze", [x, node("Constant", [], value_ints=[0])]),
                        node("Transpose", [w], perm=[1, 0])])], 0, ["Constant", "Unsqueeze", "Transpose", "MatMul"]),
    "a Relu": (lambda x, w, node: [
        node("Gemm", [x, t := node("Transpose", [w], perm=[1, 0])]), node("Relu", [t])], 0,
        ["Transpose", "Gemm", "Relu"]),
    "an output": (lambda x, w, node: [
        node("Gemm", [x, t := node("Transpose", [w], perm=[1, 0])]), t], 0, ["Transpose", "Gemm"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_transposes_of_weights_become_gemm_flags_with_the_same_results(case):
    build, folded, ops = CASES[case]
    model, _ = _graph(build)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    before = _run(model, x)
    assert transposes_into_gemm(model) == folded
    assert _ops(model) == ops
    for got, want in zip(_run(model, x), before, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_gemm_reads_the_weight_itself_after_the_fold():
    model, _ = _graph(lambda x, w, node: [node("Gemm", [x, node("Transpose", [w], perm=[1, 0])], transB=0)])
    transposes_into_gemm(model)
    (gemm,) = model.graph
    assert gemm.inputs[1] is model.graph.initializers["w"] and gemm.attributes["transB"].as_int() == 1


def test_an_onnx_ir_without_what_the_rewrite_uses_leaves_the_model_as_it_is(monkeypatch):
    model, _ = _graph(lambda x, w, node: [node("Gemm", [x, node("Transpose", [w], perm=[1, 0])])])

    def missing(*args, **kwargs):
        raise AttributeError("no AttrInt64 in this onnx_ir")

    monkeypatch.setattr(ir, "AttrInt64", missing)
    assert transposes_into_gemm(model) == 0
    assert _ops(model) == ["Transpose", "Gemm"]


class Linears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("factory, linears", [(MLP, 3), (Linears, 2)])
def test_an_exported_region_keeps_its_weights_as_pytorch_lays_them_out(factory, linears):
    rtx_backend.reset_stats()
    model = _seeded(factory)
    gm = _region(model, torch.randn(4, 16))
    region = export_region(gm)
    assert rtx_backend.stats()["weight_transposes_folded"] == linears
    proto = onnx.load_from_string(region.model)
    assert "Transpose" not in [n.op_type for n in proto.graph.node]
    shapes = {tuple(i.dims) for i in proto.graph.initializer}
    assert {tuple(m.weight.shape) for m in model.modules() if isinstance(m, nn.Linear)} <= shapes  # (out, in)
    _check_against_graph(gm, region)


@pytest.mark.skipif(not _trt.available(), reason="TensorRT-RTX is not installed")
def test_the_parser_gives_the_builder_transposed_matrix_multiplies():
    trt = _trt.trt()
    region = export_region(_region(_seeded(MLP), torch.randn(4, 16)))
    from rtx_backend.build.engine import parse

    network = parse(region.source).network
    ops = []
    for k in range(network.num_layers):
        layer = network.get_layer(k)
        if layer.type == trt.LayerType.MATRIX_MULTIPLY:
            layer.__class__ = trt.IMatrixMultiplyLayer
            ops.append((layer.op0, layer.op1))
    assert ops and all(op == (trt.MatrixOperation.NONE, trt.MatrixOperation.TRANSPOSE) for op in ops)
