"""One-row KV cache writes become TensorRT-RTX's in-place KVCacheUpdate (ONNX TensorScatter), and
only where that computes the same as the ScatterElements it replaces. ONNX Runtime runs both."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

from rtx_backend.build import cache_writes

B, H, S, D = 2, 3, 8, 4


def _model(rows: int = 1, shape: tuple[int, ...] = (1, 1, -1, 1), extra_reader: bool = False) -> onnx.ModelProto:
    """cache[:, :, pos, :] = update, then a sum over the written cache (a reader inside the model)."""
    nodes = [
        helper.make_node("Reshape", ["pos", "target"], ["pos4"]),
        helper.make_node("Expand", ["pos4", "expand_to"], ["idx"]),
        helper.make_node("ScatterElements", ["cache", "idx", "update"], ["new_cache"], axis=2),
        helper.make_node("ReduceSum", ["new_cache", "axes"], ["total"], keepdims=1),
    ]
    outputs = [helper.make_tensor_value_info("new_cache", TensorProto.FLOAT, [B, H, S, D]),
               helper.make_tensor_value_info("total", TensorProto.FLOAT, [B, H, 1, D])]
    if extra_reader:
        nodes.append(helper.make_node("Identity", ["cache"], ["old"]))
        outputs.append(helper.make_tensor_value_info("old", TensorProto.FLOAT, [B, H, S, D]))
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("cache", TensorProto.FLOAT, [B, H, S, D]),
         helper.make_tensor_value_info("update", TensorProto.FLOAT, [B, H, rows, D]),
         helper.make_tensor_value_info("pos", TensorProto.INT64, [rows])],
        outputs,
        initializer=[helper.make_tensor("target", TensorProto.INT64, [4], list(shape)),
                     helper.make_tensor("expand_to", TensorProto.INT64, [4], [B, H, rows, D]),
                     helper.make_tensor("axes", TensorProto.INT64, [1], [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("row", [0, 5, 7])
def test_a_one_row_write_becomes_tensor_scatter_with_the_same_results(row):
    model = _model()
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert cache_writes.rewrite(rewritten) == {"new_cache": "cache"}
    assert [n.op_type for n in rewritten.graph.node].count("TensorScatter") == 1
    assert "ScatterElements" not in [n.op_type for n in rewritten.graph.node]
    rewritten.opset_import[0].version = 24  # TensorScatter's opset, for ONNX Runtime
    rng = np.random.default_rng(row)
    feeds = {"cache": rng.standard_normal((B, H, S, D)).astype(np.float32),
             "update": rng.standard_normal((B, H, 1, D)).astype(np.float32), "pos": np.array([row])}
    want = _run(model, feeds)
    got = _run(rewritten, feeds)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(w, g)
    assert not np.array_equal(want[0], feeds["cache"])  # the write happened


@pytest.mark.parametrize("case", ["two rows", "other reader", "not one position per batch row"])
def test_writes_that_are_not_provably_one_row_stay_scatter_elements(case):
    model = {"two rows": lambda: _model(rows=2),
             "other reader": lambda: _model(extra_reader=True),
             "not one position per batch row": lambda: _model(shape=(1, 1, -1, 4))}[case]()
    before = model.SerializeToString()
    assert cache_writes.rewrite(model) == {}
    assert model.SerializeToString() == before


def test_in_place_leaves_models_without_cache_writes_as_they_are():
    data = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])).SerializeToString()
    assert cache_writes.in_place(data) == (data, {})
    rewritten, aliases = cache_writes.in_place(_model().SerializeToString())
    assert aliases == {"new_cache": "cache"} and b"TensorScatter" in rewritten


def test_tensorrt_rtx_parses_the_rewritten_write_as_its_in_place_cache_update():
    """The model TensorRT-RTX is given has a KVCacheUpdate layer where the export had a
    ScatterElements (the parser runs without a GPU)."""
    from rtx_backend import _trt
    from rtx_backend.build import engine

    if not _trt.available():
        pytest.skip(f"TensorRT-RTX is not usable here: {_trt.unavailable_reason()}")
    if not cache_writes.supported():
        pytest.skip("this TensorRT-RTX does not report aliased engine outputs")
    model = _model()
    for name in ("cache", "update", "new_cache", "total"):  # FP16, as engines for RTX GPUs run
        value = next(v for v in [*model.graph.input, *model.graph.output] if v.name == name)
        value.type.tensor_type.elem_type = TensorProto.FLOAT16
    parsed = engine.parse_network(model.SerializeToString())
    assert not parsed.errors, parsed.errors
    network = parsed.network
    kinds = [str(network.get_layer(i).type) for i in range(network.num_layers)]
    assert any("KV_CACHE_UPDATE" in k for k in kinds), kinds
    assert not any("SCATTER" in k for k in kinds), kinds
