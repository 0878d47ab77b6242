"""The packages the package tests load: saved once for all of them."""

from __future__ import annotations

import pytest
import torch

import rtx_backend

from .packages import OPTIONS, net


@pytest.fixture(scope="package")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("pkg") / "net.pt2"
    info = rtx_backend.save(net(), (torch.randn(4, 3, 16, 16),), path, options=OPTIONS)
    return path, info


@pytest.fixture(scope="package")
def saved_dynamic(tmp_path_factory):
    path = tmp_path_factory.mktemp("pkg") / "dyn.pt2"
    rtx_backend.save(net(), (torch.randn(4, 3, 16, 16),), path, options=OPTIONS,
                     dynamic_shapes={"x": {0: (1, 4, 8)}})
    return path
