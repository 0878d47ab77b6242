"""Logging contract: silence at the default WARNING level unless something is wrong; one INFO
line per compiled graph (regions, engines built or loaded from the cache, seconds)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import pytest

from rtx_backend import _trt

COMPILE = """
import logging, sys, torch
from torch import nn
torch.manual_seed(0)  # the same weights in every process: the same engine-cache key
level = sys.argv[1]
if level != "default":
    logging.basicConfig(level=getattr(logging, level), format="%(levelname)s %(name)s: %(message)s")
options = dict(eval(sys.argv[2]))
m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
c = torch.compile(m, backend="trtrtx", options=options)
with torch.no_grad():
    x = torch.randn(2, 8)
    assert torch.allclose(c(x), m(x), atol=1e-4)
"""


def compile_in_subprocess(tmp_path, level: str, options: dict) -> subprocess.CompletedProcess:
    env = {**os.environ, "RTX_BACKEND_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", COMPILE, level, repr(options)], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_clean_compile_prints_nothing(tmp_path):
    out = compile_in_subprocess(tmp_path, "default", {"min_block_size": 1, "runtime": "onnxruntime"})
    assert (out.stdout, out.stderr) == ("", "")


def test_info_line_counts_regions_and_engines(tmp_path):
    options = {"min_block_size": 1, "target_compute_capabilities": [(8, 6)]}
    first = compile_in_subprocess(tmp_path, "INFO", options)
    second = compile_in_subprocess(tmp_path, "INFO", options)  # same cache: the compiled graph is reused
    pattern = r"INFO rtx_backend: trtrtx: compiled a graph in [\d.]+s: 1 region\(s\) .*{} engine\(s\) built, {} loaded from cache"
    assert len(re.findall(pattern.format(1, 0), first.stderr)) == 1, first.stderr
    reused = r"INFO rtx_backend: trtrtx: reused a compiled graph from the graph cache in [\d.]+s: 1 region\(s\)"
    assert len(re.findall(reused, second.stderr)) == 1 and "engine cache hit" in second.stderr, second.stderr
    assert "DEBUG" not in first.stderr
    # Above INFO, only the one warning that the regions run in ONNX Runtime (the model is on the CPU).
    loud = [line for line in first.stderr.splitlines() if not line.startswith("INFO ")]
    assert len(loud) == 1 and "regions run in ONNX Runtime instead" in loud[0], first.stderr


@pytest.mark.skipif(not _trt.available(), reason="TensorRT-RTX is not installed (pip install tensorrt-rtx)")
def test_tensorrt_rtx_messages_at_interpreter_exit_are_dropped_and_never_raise(monkeypatch):
    """Engines freed while the interpreter exits log through a half torn-down logging module; an
    exception there would make TensorRT-RTX print an [ERROR] block of its own."""
    severity = _trt.trt().ILogger.Severity
    monkeypatch.setattr(sys, "is_finalizing", lambda: True)
    late = _trt._Logger()
    late.log(severity.ERROR, "freed at exit")
    assert late.errors == []
    monkeypatch.setattr(sys, "is_finalizing", lambda: False)
    live = _trt._Logger()

    def broken(*args, **kwargs):
        raise TypeError("catching classes that do not inherit from BaseException is not allowed")

    monkeypatch.setattr(logging.getLogger("rtx_backend.trt"), "debug", broken)
    live.log(severity.ERROR, "build failed")  # does not raise into TensorRT-RTX's callback
    assert live.errors == ["build failed"]
