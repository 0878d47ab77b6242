"""The executors' own helpers (the executors themselves are exercised through their region
modules in test_region.py and test_cuda_graphs.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from rtx_backend.run.executors import contiguous_strides


@pytest.mark.parametrize("shape", [(), (5,), (2, 3), (4, 1, 7), (2, 0, 3), (0,), (1, 1), (3, 2, 1, 8)])
def test_contiguous_strides_are_torchs(shape):
    assert contiguous_strides(shape) == torch.empty(shape).stride()


def test_contiguous_strides_import_nothing_symbolic():
    code = ("import sys, torch; from rtx_backend.run.executors import contiguous_strides\n"
            "contiguous_strides((8, 1000)); print('sympy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False"], out.stdout
