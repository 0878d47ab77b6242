"""dump_onnx_dir: each region's ONNX model and a JSON sidecar of its inputs, written atomically."""

from __future__ import annotations

import json
import logging

import onnx
import torch

from rtx_backend._types import OnnxRegion, TensorSpec
from rtx_backend.export.dump import dump_region

from ..helpers import compile_and_run, regions
from ..models import MLP, WithEagerOp, eval_model


def test_every_region_is_dumped_and_passes_the_onnx_checker(tmp_path):
    out = tmp_path / "dump"
    model = eval_model(WithEagerOp())
    compile_and_run(model, torch.randn(3, 16), min_block_size=1, runtime="onnxruntime",
                    torch_executed_ops=["aten.sigmoid"], dump_onnx_dir=str(out))
    models = sorted(out.glob("*.onnx"))
    assert len(models) == len(regions()) == 2
    assert not list(out.glob("*.tmp"))  # no temp files left behind
    for path in models:
        onnx.checker.check_model(str(path), full_check=True)
        sidecar = json.loads(path.with_suffix(".json").read_text())
        assert sidecar["onnx"] == path.name and path.name.startswith(sidecar["region"])
        proto = onnx.load(str(path))
        assert [i.name for i in proto.graph.input] == [i["name"] for i in sidecar["inputs"]]
        dims = [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
        assert sidecar["inputs"][0]["shape"] == dims == [3, 16]
        assert sidecar["inputs"][0]["dtype"] == "float32"
    dumped = {json.loads(p.with_suffix(".json").read_text())["region"] for p in models}
    assert dumped == {r.name for r in regions()}


def test_dynamic_dims_are_named_in_the_sidecar(tmp_path):
    model = eval_model(MLP())
    compiled = torch.compile(model, backend="trtrtx", dynamic=True,
                             options={"min_block_size": 1, "runtime": "onnxruntime", "dump_onnx_dir": str(tmp_path)})
    with torch.no_grad():
        compiled(torch.randn(5, 16))
    (sidecar_path,) = tmp_path.glob("*.json")
    spec = json.loads(sidecar_path.read_text())["inputs"][0]
    assert isinstance(spec["shape"][0], str) and spec["shape"][1] == 16
    assert spec["example_shape"] == [5, 16]
    proto = onnx.load(str(sidecar_path.with_suffix(".onnx")))
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # a named dynamic dim


def test_unwritable_directory_is_a_warning_not_a_failure(tmp_path, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    model = eval_model(MLP())
    x = torch.randn(2, 16)
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        y = compile_and_run(model, x, min_block_size=1, runtime="onnxruntime", dump_onnx_dir=str(blocker / "sub"))
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    assert "could not write region" in caplog.text
    assert [r.kind for r in regions()] == ["onnxruntime"]


def test_same_model_is_written_once_under_its_content_hash(tmp_path):
    region = OnnxRegion(b"model-bytes", (0,), (TensorSpec("input_0", (2,), torch.float16, (2,), ((2, 2),)),), ())
    first = dump_region("trtrtx_region_0", region, str(tmp_path))
    second = dump_region("trtrtx_region_0", region, str(tmp_path))
    other = dump_region("trtrtx_region_0", OnnxRegion(b"other", (0,), (), ()), str(tmp_path))
    assert first == second and first is not None and first.read_bytes() == b"model-bytes"
    assert other != first
    assert len(list(tmp_path.glob("*.onnx"))) == 2 and len(list(tmp_path.glob("*.json"))) == 2
