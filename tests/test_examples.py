"""The examples run (smoke): every script in examples/, and the dynamic-shapes notebook."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))
NO_GPU = not torch.cuda.is_available()


def run_example(name: str) -> str:
    out = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True,
                         timeout=600, env=dict(os.environ), cwd=EXAMPLES)
    assert out.returncode == 0, f"{name} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out.stdout


# What each example must say, besides where it ran.
EXPECTED = {
    "quickstart.py": ["trtrtx: 1 graph(s) compiled", "runs on",
                      "second start (compile + run)", "1 of 1 engine(s) loaded from the engine cache, none built"],
    "deploy.py": ["saved smallnet.pt2 for [(8, 6), (8, 9)]", "loaded and ran in", "max abs error vs FP32 eager"],
    "llm_generate.py": ["greedy tokens equal to eager PyTorch's:", "first generate (compiles)", "1 graph(s) compiled"],
    "turing_targets.py": ["kept in PyTorch, by rule", "run the model in FP16", "fp32-gemm-turing", "conv3d-turing", "bf16-turing",
                          "float32   Ampere SM8.6: 1 region(s); kept in PyTorch: none"],
}


@pytest.mark.parametrize("name", SCRIPTS)
def test_example_runs(name):
    stdout = run_example(name)
    assert stdout.strip(), f"{name} printed nothing"
    if NO_GPU:
        assert "ONNX Runtime" in stdout or "onnxruntime" in stdout, f"{name} does not say where it ran"
    for text in EXPECTED.get(name, []):
        assert text in stdout, f"{name} did not print {text!r}:\n{stdout}"


def test_notebook_is_stripped_and_executes():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    path = EXAMPLES / "dynamic_shapes.ipynb"
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "strip the outputs before committing"
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(EXAMPLES)}}).execute()
    text = "".join(o.get("text", "") for c in code for o in c.outputs)
    assert text.count("graphs compiled: 1; engines built: 1") == 2, text
    assert "dynamic input dims: ['s" in text
    if NO_GPU:
        assert "regions run on: ONNX Runtime" in text


def test_examples_use_only_public_names():
    """What a user copies from an example must be the package's public API."""
    import json
    import re

    import rtx_backend

    for path in sorted(EXAMPLES.iterdir()):
        if path.suffix == ".ipynb":
            text = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
        elif path.suffix == ".py":
            text = path.read_text()
        else:
            continue
        assert not re.search(r"rtx_backend\._\w+|from rtx_backend\._", text), f"{path.name} uses a private module"
        used = set(re.findall(r"rtx_backend\.(\w+)", text))
        assert used <= set(rtx_backend.__all__) | {"__version__"}, f"{path.name}: {used - set(rtx_backend.__all__)}"
