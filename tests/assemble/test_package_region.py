"""A saved region's runtime: ONNX Runtime (one warning) or a clear error where TensorRT-RTX cannot run
its engines, and a stand-in that says why for shapes no engine covers."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import rtx_backend
from rtx_backend import PackageError, RuntimeUnavailableError, _log, _targets, _trt
from rtx_backend.assemble import package_archive as _archive
from rtx_backend.assemble import package_region as _package_region

from .packages import OPTIONS, TARGETS, check, net, region_json


def test_other_tensorrt_rtx_version_runs_in_onnx_runtime_or_raises(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(_trt, "version", lambda: "1.6.1")
    with_onnx, without = tmp_path / "a.pt2", tmp_path / "b.pt2"
    rtx_backend.save(net(), (torch.randn(2, 3, 8, 8),), with_onnx, options=OPTIONS)
    rtx_backend.save(net(), (torch.randn(2, 3, 8, 8),), without, options=OPTIONS, onnx=False)
    monkeypatch.undo()
    assert _archive.verify(with_onnx)["tensorrt_rtx"] == "1.6.1"
    monkeypatch.setattr(_log, "SAID", _log.Once())
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        check(rtx_backend.load(with_onnx), torch.randn(2, 3, 8, 8))
    assert "built by TensorRT-RTX 1.6.1" in caplog.text and "ONNX Runtime" in caplog.text
    with pytest.raises(RuntimeUnavailableError, match=r"1\.6\.1"):
        rtx_backend.load(with_onnx, options={"runtime": "tensorrt_rtx"})
    with pytest.raises(PackageError, match=r"1\.6\.1.*without its ONNX models"):
        rtx_backend.load(without)


def test_other_targets_are_named(monkeypatch):
    info = {"plan": {"size": 1}, "tensorrt_rtx": _trt.version() if _trt.available() else None, "targets": TARGETS}
    if not _trt.available():
        pytest.skip("TensorRT-RTX is not importable")
    monkeypatch.setattr(_targets, "current_capability", lambda: (12, 0))
    monkeypatch.setattr(_targets, "no_cuda_reason", lambda: None)
    why = _package_region.why_not_here(info, torch.device("cuda", 0))
    assert why is not None and "SM8.6, SM8.9" in why and "SM12.0" in why
    monkeypatch.setattr(_targets, "current_capability", lambda: (8, 9))
    assert _package_region.why_not_here(info, torch.device("cuda", 0)) is None


def test_without_onnx_a_shape_outside_the_profile_is_a_clear_error():
    region = _package_region.region_specs({"region": json.loads(json.dumps(region_json())), "name": "r"})
    stand_in = _package_region._NoPyTorch("r", region, lambda args: f"region r has no engine for {tuple(args[0].shape)}")
    with pytest.raises(PackageError, match=r"no engine for \(3, 2\)"):
        stand_in(torch.randn(3, 2))
