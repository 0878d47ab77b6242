"""Every private torch entry point of the package resolves with the installed torch: a torch
upgrade that moves one fails here, in CI, not at a user's first compile."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rtx_backend import _torch_compat

PACKAGE = Path(_torch_compat.__file__).parent


@pytest.mark.parametrize(("name", "resolve", "cuda_only"), _torch_compat.ENTRY_POINTS,
                         ids=[e[0] for e in _torch_compat.ENTRY_POINTS])
def test_the_entry_point_resolves(name, resolve, cuda_only):
    if cuda_only and torch.version.cuda is None:
        pytest.skip(f"{name} exists in CUDA builds of torch only (this one is CPU-only)")
    assert resolve() is not None, name


def _private_torch_imports(path: Path) -> list[str]:
    """`import torch._x` / `from torch._x import ...` / `from torch.y import _x` in a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module and node.module.startswith("torch"):
            parts = node.module.split(".")
            if any(p.startswith("_") for p in parts) or any(a.name.startswith("_") for a in node.names):
                found.append(f"from {node.module} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names
                      if a.name.startswith("torch") and any(p.startswith("_") for p in a.name.split("."))]
    return found


def test_only_the_compat_module_imports_private_torch_modules():
    offenders = {str(p.relative_to(PACKAGE)): imports for p in sorted(PACKAGE.rglob("*.py"))
                 if p.name != "_torch_compat.py" and (imports := _private_torch_imports(p))}
    assert offenders == {}


def test_importing_the_package_imports_neither_dynamo_nor_aot_autograd_nor_the_exporter():
    code = ("import sys, rtx_backend; print([m for m in ('torch._dynamo', 'torch._functorch.aot_autograd', "
            "'torch.onnx._internal.exporter._core') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout
    assert out.strip() == "[]"


def test_the_cuda_driver_version_is_the_drivers_own_or_unknown():
    version = _torch_compat.cuda_driver_version()
    if torch.cuda.is_available() and torch.version.cuda is not None:
        assert isinstance(version, int) and version >= 10000, version  # e.g. 13000 for CUDA 13.0
    else:
        assert version == "?" or (isinstance(version, int) and version >= 10000), version


def test_an_error_past_dynamo_is_still_ours_with_our_message():
    from rtx_backend._errors import OptionsError
    from rtx_backend._errors import RegionRefused as Refused  # (its own __init__ and fields)

    cause = KeyError("k")
    error = OptionsError("unknown option(s) 'x'")
    error.__cause__ = cause
    passed = _torch_compat.past_dynamo(error)
    assert isinstance(passed, OptionsError) and isinstance(passed, _torch_compat.dynamo_exc().ShortenTraceback)
    assert str(passed) == "unknown option(s) 'x'" and passed.__cause__ is cause
    passed.args = (passed.args[0] + "\nSet TORCHDYNAMO_VERBOSE=1 ...",)  # what Dynamo appends
    assert str(passed) == "unknown option(s) 'x'"
    refused = _torch_compat.past_dynamo(Refused({"add": "why"}))
    assert isinstance(refused, Refused) and refused.reasons == {"add": "why"}
    assert _torch_compat.past_dynamo(passed) is passed
