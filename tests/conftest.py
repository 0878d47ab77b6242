"""Shared fixtures: GPU gating, isolated caches, fresh Dynamo state per test."""

from __future__ import annotations

import pytest
import torch
import torch.ao.quantization.fx._decomposed

import rtx_backend
from rtx_backend import _trt

# The quantized_decomposed op library is loaded by a process's first torch.compile (inductor's
# decompositions import it). Loaded here, before any test runs, so that what the exporter's
# registries name (tests/lower/) does not depend on whether a compile ran first.


def gpu_skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return ("no CUDA GPU visible to torch here (a CPU-only torch, or no GPU): this test runs TensorRT-RTX "
                "engines; run it on a machine with an RTX GPU and a CUDA build of torch")
    if not _trt.available():
        return f"TensorRT-RTX cannot be used here ({_trt.unavailable_reason()}); pip install tensorrt-rtx"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = gpu_skip_reason()
    if reason is None:
        return
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    """Each test gets empty caches and a reset Dynamo, so counts and results are its own."""
    monkeypatch.setenv("RTX_BACKEND_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # this test's own cache key
    torch._dynamo.reset()
    rtx_backend.reset_stats()
    yield
    rtx_backend.wait_for_updates(60)  # (no engine built behind one test lands in the next one's counts)
    torch._dynamo.reset()
