"""In-memory ONNX models (rtx_backend/export/model.py): the weightless skeleton, weights handed to
TensorRT-RTX's parser by pointer, the fallbacks, and the bytes everything else still gets."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from rtx_backend import _trt
from rtx_backend._types import OnnxRegion, TensorSpec
from rtx_backend.build import engine as _engine
from rtx_backend.cache import engines as _engine_cache
from rtx_backend.cache import store
from rtx_backend.cache.engines import EngineEntry
from rtx_backend.export import model as _onnx_model
from rtx_backend.export.bridge import export_region
from rtx_backend.export.model import EXTERNAL_MIN_BYTES, OnnxModel, host_bytes

from ..plan.test_policy import lowered, plan

needs_trt = pytest.mark.skipif(not _trt.available(), reason="TensorRT-RTX is not importable here")


def _proto(dtype=np.float32) -> onnx.ModelProto:
    """y = relu(x @ w + b) with a large weight (external in the skeleton) and a small bias (inline)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 32)).astype(dtype), "w")
    b = numpy_helper.from_array(rng.standard_normal(32).astype(dtype), "b")
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, [4, 64])],
                              [helper.make_tensor_value_info("y", elem, [4, 32])], initializer=[w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


def _constants(network) -> dict[str, np.ndarray]:
    trt = _trt.trt()
    out = {}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type == trt.LayerType.CONSTANT:
            layer.__class__ = trt.IConstantLayer
            out[layer.name] = np.array(layer.weights, copy=True)
    return out


def test_skeleton_declares_large_weights_external_and_leaves_the_model_whole():
    model = ir.from_proto(_proto())
    whole = _onnx_model.serialize_model(model)
    held = OnnxModel(model)
    assert held.skeleton is not None and set(held.weights) == {"w"}  # the 128-byte bias stays inline
    skeleton = onnx.load_from_string(held.skeleton)
    inits = {t.name: t for t in skeleton.graph.initializer}
    assert inits["w"].data_location == TensorProto.EXTERNAL and not inits["w"].raw_data
    assert {e.key: e.value for e in inits["w"].external_data}["length"] == str(64 * 32 * 4)
    assert inits["b"].data_location != TensorProto.EXTERNAL
    assert len(held.skeleton) < 64 * 32 * 4 < len(whole)
    assert held.serialize() == whole  # splitting put every weight back
    assert EXTERNAL_MIN_BYTES > 32 * 4


@needs_trt
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_weights_by_pointer_give_the_network_the_serialized_models_weights(dtype):
    model = OnnxModel(ir.from_proto(_proto(dtype)))
    by_pointer = _engine.parse_network(model)
    by_bytes = _engine.parse_network(model.serialize())
    assert not by_pointer.errors and not by_bytes.errors
    assert by_pointer.weights, "the weightless path was not taken"
    got, want = _constants(by_pointer.network), _constants(by_bytes.network)
    assert got.keys() == want.keys() and len(got) == 2
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


@needs_trt
def test_exported_region_with_folded_transposes_parses_by_pointer_to_the_same_weights():
    mlp = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 16)).eval()
    gm = lowered(mlp, torch.randn(4, 64))
    p = plan(gm, [(8, 6)])
    region = export_region(getattr(p.graph_module, p.regions[0]))
    assert isinstance(region.source, OnnxModel) and region.source.weights
    by_pointer, by_bytes = _engine.parse_network(region.source), _engine.parse_network(region.model)
    assert not by_pointer.errors and by_pointer.weights
    got, want = _constants(by_pointer.network), _constants(by_bytes.network)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    weights = {p.detach().numpy().tobytes() for p in mlp.parameters() if p.dim() == 2}
    transposed = {p.detach().numpy().T.tobytes() for p in mlp.parameters() if p.dim() == 2}
    assert {w.tobytes() for w in got.values()} & (weights | transposed)


@needs_trt
def test_parser_refusing_a_pointer_falls_back_to_the_serialized_model(monkeypatch):
    model = OnnxModel(ir.from_proto(_proto()))

    def short(tensor):
        address, size, owner = host_bytes(tensor)
        return address, size - 4, owner  # load_initializer rejects a size that does not match

    monkeypatch.setattr(_engine, "host_bytes", short)
    parsed = _engine.parse_network(model)
    assert not parsed.errors and not parsed.weights  # parsed from the bytes instead
    assert len(_constants(parsed.network)) == 2


@needs_trt
def test_without_a_skeleton_the_parser_gets_the_serialized_model(monkeypatch):
    monkeypatch.setattr(_onnx_model, "split", lambda m: (_ for _ in ()).throw(AttributeError("no ExternalTensor")))
    model = OnnxModel(ir.from_proto(_proto()))
    assert model.skeleton is None and not model.weights
    parsed = _engine.parse_network(model)
    assert not parsed.errors and len(_constants(parsed.network)) == 2


@needs_trt
def test_parser_errors_are_reported_not_raised_and_build_raises_them():
    proto = _proto()
    proto.graph.node[2].op_type = "NoSuchOp"
    parsed = _engine.parse_network(OnnxModel(ir.from_proto(proto)))
    assert parsed.errors and "NoSuchOp" in " ".join(parsed.errors)
    with pytest.raises(_engine.BuildError, match="parser rejected"):
        _engine.build(parsed, ((8, 6),), {})


def test_host_bytes_match_onnx_layout_for_views_and_odd_dtypes():
    from torch.onnx._internal.exporter._core import TorchTensor  # what the exporter's weights are

    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    cases = [ir.Tensor(base.T), ir.Tensor(base[:, ::-1]), TorchTensor(torch.arange(6.0).reshape(2, 3).t()),
             TorchTensor(torch.arange(6.0, dtype=torch.bfloat16))]
    for tensor in cases:
        address, size, _owner = host_bytes(tensor)  # _owner keeps the bytes alive
        assert size == tensor.nbytes
        assert np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * size).from_address(address)).tobytes() == \
            tensor.tobytes()


def test_serialize_without_keeping_holds_no_bytes_and_keeps_once_asked():
    model = OnnxModel(ir.from_proto(_proto()))
    first = model.serialize(keep=False)
    assert model._bytes is None
    assert model.serialize() == first and model._bytes == first
    assert model.serialize(keep=False) is model._bytes


@pytest.mark.parametrize("source", ["in-memory", "stored"])
def test_cache_stores_skeleton_and_raw_weights_and_serves_the_same_model(tmp_path, source):
    spec_in = TensorSpec("input_0", (4, 64), torch.float32, (4, 64), ((4, 4), (64, 64)))
    spec_out = TensorSpec("output_0", (4, 32), torch.float32, (4, 32), ((4, 4), (32, 32)))
    model = OnnxModel(ir.from_proto(_proto()))
    if source == "stored":  # an entry loaded from the cache, stored again (another cache directory)
        skeleton, parts = model.parts()
        model = OnnxModel(skeleton=skeleton, weights=dict(parts))
    region = OnnxRegion(model, (0,), (spec_in,), (spec_out,))
    cache = _engine_cache.EngineCache(tmp_path, 1 << 30)
    key = store.Key("k" * 64, {"test": source})
    assert cache.store(key, EngineEntry(region, b"engine", {}))
    raw = cache.path(key).read_bytes()
    weight = numpy_helper.to_array(_proto().graph.initializer[0]).tobytes()
    assert raw.count(weight) == 1  # the weight's raw bytes, once: no protobuf around them
    loaded = cache.load(key, (spec_in,))
    assert loaded is not None and isinstance(loaded.region.source, OnnxModel)
    assert loaded.region.source.weights["w"].tobytes() == weight
    assert onnx.load_from_string(loaded.region.model) == onnx.load_from_string(region.model)
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    session = ort.InferenceSession(loaded.region.model, providers=["CPUExecutionProvider"])
    w = numpy_helper.to_array(_proto().graph.initializer[0])
    b = numpy_helper.to_array(_proto().graph.initializer[1])
    np.testing.assert_allclose(session.run(None, {"x": x})[0], np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)
    if _trt.available():  # a hit hands the stored weights to the parser by pointer
        parsed = _engine.parse_network(loaded.region.source)
        assert not parsed.errors and parsed.weights
        np.testing.assert_array_equal(_constants(parsed.network)["w"].reshape(w.shape), w)


@pytest.mark.parametrize(("table", "why"), [
    ([["w", 10**9]], "does not match"),
    ([["w", -4]], "does not match"),
    ([[3, 8192]], "does not match"),
    ([], "does not match"),
])
def test_a_corrupt_weight_table_is_a_miss_not_a_crash(tmp_path, caplog, table, why):
    spec_in = TensorSpec("input_0", (4, 64), torch.float32, (4, 64), ((4, 4), (64, 64)))
    region = OnnxRegion(OnnxModel(ir.from_proto(_proto())), (0,), (spec_in,), ())
    key = store.Key("k" * 64, {"test": "corrupt"})
    chunks = _engine_cache.encode(key, EngineEntry(region, b"engine", {}))
    header = json.loads(chunks[2])
    header["onnx"]["weights"] = table
    # a consistent, signed but wrong header: what our own writer would frame, had it a bug
    framed = store.framed_header(store.MAGIC, header)
    data = b"".join(bytes(c) for c in [*framed, *chunks[3:]])
    with pytest.raises(store.CorruptEntry, match=why):
        _engine_cache.decode(data, key)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gpu_engine_from_weights_by_pointer_matches_eager(monkeypatch, dtype):
    """CUDA weights reach the parser by pointer (copied to the host once), and the engine built from
    them gives eager's results."""
    from ..helpers import compile_and_run, regions

    taken: list[bool] = []
    original = _engine._parse_weightless

    def spy(model):
        parsed = original(model)
        taken.append(parsed is not None and not parsed.errors)
        return parsed

    monkeypatch.setattr(_engine, "_parse_weightless", spy)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 128)).eval().to("cuda", dtype)
    x = torch.randn(8, 256, device="cuda", dtype=dtype)
    y = compile_and_run(model, x, min_block_size=1, runtime="tensorrt_rtx", engine_cache_dir="")
    tol = 1e-2 if dtype == torch.float16 else 2e-3
    with torch.no_grad():
        torch.testing.assert_close(y, model(x), atol=tol, rtol=tol)
    assert taken == [True] and [r.kind for r in regions()] == ["tensorrt_rtx"]
    assert isinstance(regions()[0].onnx.source, OnnxModel) and regions()[0].onnx.source.weights


def test_a_model_larger_than_protobuf_serializes_is_refused_before_any_copy(monkeypatch):
    class Huge:  # a weight's size only: nothing may read its bytes
        nbytes = _onnx_model.PROTOBUF_LIMIT

    def copied(*args):
        raise AssertionError("the model was serialized")

    monkeypatch.setattr(_onnx_model, "fill", copied)
    model = _onnx_model.OnnxModel(skeleton=b"skeleton", weights={"w": Huge()})
    with pytest.raises(ValueError, match="larger than the 2 GiB"):
        model.serialize()
    assert model.size() == _onnx_model.PROTOBUF_LIMIT + len(b"skeleton")


def _ort_region(source, dtype) -> OnnxRegion:
    torch_dtype = torch.from_numpy(np.zeros(1, dtype)).dtype
    return OnnxRegion(source, (0,), (TensorSpec("x", (4, 64), torch_dtype, (4, 64)),),
                      (TensorSpec("y", (4, 32), torch_dtype, (4, 32)),))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_onnxruntime_takes_the_skeleton_and_its_weights_from_memory(monkeypatch, dtype):
    from rtx_backend.run.executors import OrtExecutor

    proto = _proto(dtype)
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((4, 64)).astype(dtype))
    whole = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = whole.run(None, {"x": x.numpy()})[0]

    def copied(*args, **kwargs):
        raise AssertionError("the model was serialized")

    held = OnnxModel(ir.from_proto(proto))
    assert held.weights  # (w is external in the skeleton)
    monkeypatch.setattr(OnnxModel, "serialize", copied)
    (out,) = OrtExecutor(_ort_region(held, dtype)).run((x,), (x,))
    np.testing.assert_array_equal(out.numpy(), expected)


def test_onnxruntime_loads_a_model_larger_than_protobuf_serializes(monkeypatch):
    from rtx_backend.run.executors import OrtExecutor

    held = OnnxModel(ir.from_proto(_proto()))
    monkeypatch.setattr(_onnx_model, "PROTOBUF_LIMIT", 1024)  # the model's 8 KiB weight is "too large"
    with pytest.raises(ValueError, match="larger than the 2 GiB"):
        held.serialize()
    x = torch.ones(4, 64)
    (out,) = OrtExecutor(_ort_region(held, np.float32)).run((x,), (x,))
    assert out.shape == (4, 32) and torch.isfinite(out).all()


def test_a_weight_numpy_has_no_dtype_for_sends_onnxruntime_the_whole_model():
    held = OnnxModel(ir.from_proto(_proto(np.float16)))
    assert _onnx_model.in_memory_initializers(held) is not None
    skeleton = onnx.load_from_string(held.skeleton)
    for init in skeleton.graph.initializer:
        if init.name == "w":
            init.data_type = TensorProto.BFLOAT16  # (the same two bytes an element)
    relabelled = OnnxModel(skeleton=skeleton.SerializeToString(), weights=held.weights)
    assert _onnx_model.in_memory_initializers(relabelled) is None
    assert _onnx_model.in_memory_initializers(OnnxModel(skeleton=held.skeleton, weights={})) is None


def test_a_weight_no_node_reads_is_not_handed_to_onnxruntime(monkeypatch):
    from rtx_backend.run.executors import OrtExecutor

    proto = _proto()
    unused = numpy_helper.from_array(np.ones((64, 32), np.float32), "unused")  # (large: external too)
    proto.graph.initializer.append(unused)
    held = OnnxModel(ir.from_proto(proto))
    assert set(held.weights) == {"w", "unused"}
    parts = _onnx_model.in_memory_initializers(held)
    assert parts is not None and parts[1] == ["w"]
    x = torch.ones(4, 64)
    (out,) = OrtExecutor(_ort_region(held, np.float32)).run((x,), (x,))
    expected = ort.InferenceSession(_proto().SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.numpy()})[0]
    np.testing.assert_array_equal(out.numpy(), expected)
