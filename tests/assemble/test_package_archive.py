"""The package's archive: a truncated, altered, foreign or wrongly signed file is refused before
torch.export.load reads any of it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import rtx_backend
from rtx_backend import PackageError

from .packages import OPTIONS, check, net, rewrite


def test_truncated_archive_is_a_clear_error(saved, tmp_path):
    path, _ = saved
    data = Path(path).read_bytes()
    for size in (0, 100, len(data) // 2, len(data) - 10):
        target = tmp_path / f"t{size}.pt2"
        target.write_bytes(data[:size])
        with pytest.raises(PackageError, match=r"truncated|cannot be read"):
            rtx_backend.load(target)


def test_altered_member_is_refused_before_torch_export_load(saved, tmp_path, monkeypatch):
    path, _ = saved
    called = []
    monkeypatch.setattr(torch.export, "load", lambda *a, **k: called.append(a))

    def flip(name, data):
        return bytes([data[0] ^ 1]) + data[1:] if name.endswith("weights/weight_0") else data

    with pytest.raises(PackageError, match="altered"):
        rtx_backend.load(rewrite(path, tmp_path / "flip.pt2", flip))
    with pytest.raises(PackageError, match="altered"):
        rtx_backend.load(rewrite(path, tmp_path / "manifest.pt2", lambda n, d: d.replace(b'"format": 1', b'"format": 1 ') if n.endswith("trtrtx.json") else d.replace(b"relu", b"tanh")))
    assert called == []


def test_a_pt2_we_did_not_write_is_refused(tmp_path):
    path = tmp_path / "plain.pt2"
    torch.export.save(torch.export.export(net(), (torch.randn(2, 3, 8, 8),)), str(path))
    with pytest.raises(PackageError, match=r"not a package saved by rtx_backend\.save"):
        rtx_backend.load(path)
    (tmp_path / "text.pt2").write_text("hello")
    with pytest.raises(PackageError, match="cannot be read"):
        rtx_backend.load(tmp_path / "text.pt2")


def test_signed_package_checks_the_key(tmp_path):
    path = tmp_path / "signed.pt2"
    rtx_backend.save(net(), (torch.randn(2, 3, 8, 8),), path, options={**OPTIONS, "runtime": "onnxruntime"}, key=b"k" * 32)
    check(rtx_backend.load(path, key=b"k" * 32), torch.randn(2, 3, 8, 8))
    with pytest.raises(PackageError, match="not signed with the given key"):
        rtx_backend.load(path, key=b"x" * 32)
