"""The zoo of real models (bench/zoo.py) on the CPU: Hugging Face models from their configs,
random weights, tiny sizes. Each is compiled for the three target sets in FP32 and FP16, run
(ONNX Runtime without a GPU; engines built ahead of time for every declared target), compared
with eager PyTorch (FP16 also against FP32), and what it lowered is counted. The targets: no
crash, no whole-graph fallback, no builder rejection, no wrong output, no validation false
alarm; FP16 fully lowered on every target set, FP32 fully lowered without a Turing target.

torchvision and timm models are for the GPU machine (`python bench/zoo.py --gpu`): the
registry's torchvision wheel does not import next to the CPU torch."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("zoo_script", ROOT / "bench" / "zoo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["zoo_script"] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


zoo = _load()
pytestmark = pytest.mark.zoo  # minutes on a CPU: `nox -s zoo` (CI runs it), left out of the default run
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(
    not HAS_TRANSFORMERS, reason="Hugging Face transformers is not installed (pip install '.[zoo]')")


# MobileViT's tiny config still has nine transformer layers (its depth is fixed): ~40 s a run here,
# so CI checks it once, in FP16 on every target (`python bench/zoo.py --cpu` runs it all).
SLOW = {"hf-mobilevit": [(torch.float16, "all")]}
CASES = [pytest.param(name, dtype, targets, id=f"{name}-{str(dtype)[6:]}-{targets}")
         for name in (e.name for e in zoo.HF)
         for dtype in (torch.float32, torch.float16)
         for targets in zoo.TARGET_SETS
         if name not in SLOW or (dtype, targets) in SLOW[name]]


@needs_transformers
@pytest.mark.parametrize(("name", "dtype", "targets"), CASES)
def test_zoo_model_lowers_builds_and_agrees(name, dtype, targets):
    sets = zoo.TARGET_SETS[targets]
    row = zoo.check_cpu(name, dtype, sets)
    assert not zoo.cpu_problems(row, fp32_fully_lowered=(7, 5) not in sets), row
    assert row["engine_builds"] >= 1 and row["lowered_nodes"] > 0
    if dtype == torch.float16:
        assert row["lowered_fraction"] == 1.0, row
    if (7, 5) in sets and dtype == torch.float32:  # Turing's FP32 GEMMs stay in PyTorch, and say why
        assert set(row["eager_rules"]) <= {"fp32-gemm-turing", "min_block_size", "weights-only"}, row


def test_every_entry_says_where_it_runs():
    assert {e.source for e in zoo.ZOO.values()} == {"transformers", "torchvision", "timm"}
    for required in ("tv-resnet50", "tv-mobilenet_v3_large", "tv-efficientnet_b0", "tv-convnext_tiny",
                     "tv-vit_b_16", "tv-swin_t", "timm-deit_small_patch16_224", "hf-bert", "hf-gpt2",
                     "hf-t5-encoder", "hf-llama-gqa", "hf-swin"):
        assert required in zoo.ZOO
    for entry in zoo.ZOO.values():
        why = zoo.available(entry)
        assert why is None or entry.source in why


@needs_transformers
def test_llama_entry_has_grouped_query_attention():
    config = zoo.ZOO["hf-llama-gqa"].build("tiny").model.config
    assert config.num_key_value_heads < config.num_attention_heads


class ZeroHead(nn.Module):
    """A conv net whose BatchNorm statistics are the defaults and whose head is all zeros, with
    HF's std-0.02 BatchNorm gammas: its output is zero and does not depend on the input."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(*[m for _ in range(6) for m in (nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8))])
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)
        with torch.no_grad():
            self.head.weight.zero_()
            self.head.bias.zero_()
            for m in self.body:
                if isinstance(m, nn.BatchNorm2d):
                    m.weight.normal_(0, 0.02)

    def forward(self, x):
        return self.head(self.body(self.stem(x)).mean((2, 3)))


def _images(batch):
    return (torch.randn(batch, 3, 8, 8),)


def test_prepare_gives_outputs_that_depend_on_the_input():
    model = ZeroHead()
    with pytest.raises(ValueError, match=r"near zero|does not depend"):
        zoo.check_depends_on_input(model.eval(), _images)
    zoo.prepare(model, _images)
    assert model.head.weight.any()  # re-drawn
    assert not model.training
    for m in model.body:
        if isinstance(m, nn.BatchNorm2d):
            assert m.num_batches_tracked > 0 and not torch.allclose(m.running_var, torch.ones(8))
            assert m.weight.min() >= 0.75 and not m.training
    zoo.check_depends_on_input(model, _images)  # does not raise
    with torch.no_grad():
        y = model(*_images(4))
    assert y.std() > 1e-2


def test_check_depends_on_input_refuses_a_constant_model():
    class Constant(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x):
            return self.w * 1.0 + x.sum() * 0

    with pytest.raises(ValueError, match="does not depend"):
        zoo.check_depends_on_input(Constant(), _images)


def test_cpu_problems_names_each_failure():
    good = {"whole_graph_fallbacks": 0, "builder_rejections": 0, "validation_failures": 0, "regions_in_pytorch": 0,
            "regions": 2, "regions_with_engine": 2, "matches_eager": True, "fp16_as_close_to_fp32_as_eager": None,
            "repeatable": True, "eager_nodes": 0, "dtype": "float32", "eager_rules": []}
    assert zoo.cpu_problems(good, True) == []
    assert zoo.cpu_problems({"error": "boom"}, True) == ["crashed: boom"]
    assert "validation_failures = 1" in zoo.cpu_problems({**good, "validation_failures": 1}, True)
    assert zoo.cpu_problems({**good, "regions_with_engine": 1}, True) == ["only 1 of 2 regions have an engine"]
    fp32_on_turing = {**good, "eager_nodes": 3, "eager_rules": ["fp32-gemm-turing"]}
    assert zoo.cpu_problems(fp32_on_turing, False) == []
    assert zoo.cpu_problems(fp32_on_turing, True)
    assert zoo.cpu_problems({**fp32_on_turing, "dtype": "float16"}, False)
    wrong = {**good, "matches_eager": False, "vs_eager": "x", "fp16_vs_fp32": None}
    assert zoo.cpu_problems(wrong, True)[0].startswith("wrong output")


def test_gpu_plan_covers_both_batches_and_resumes_by_key():
    plan = zoo.gpu_plan(["hf-bert", "tv-resnet50", "hf-llama-gqa"], [torch.float16], "")
    assert ("hf-bert", 1, torch.float16) in plan and ("hf-bert", 16, torch.float16) in plan
    assert ("tv-resnet50", 32, torch.float16) in plan and ("hf-llama-gqa", 4, torch.float16) in plan
    assert zoo.gpu_plan(["hf-bert"], [torch.float16], "large") == [("hf-bert", 16, torch.float16)]


def test_gpu_command_refuses_without_a_gpu(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert zoo.main(["--gpu", "--models", "hf-bert"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out


def test_gpu_run_saves_json_markdown_and_plot_after_every_configuration_and_resumes(tmp_path, monkeypatch):
    """The GPU driver (children faked): every configuration's result is in all three files as soon
    as it is done, so a run cut short keeps its plot too; a timeout is a result; a second run
    with the same --tag skips what the first one measured."""
    import argparse
    import json
    import subprocess

    bench = zoo._bench_module()
    plotted: list[int] = []
    monkeypatch.setattr(bench, "plot", lambda results, path: plotted.append(len(results["configs"])) or True)
    children: list[str] = []

    def fake_run(command, timeout, capture_output, text):
        config = command[command.index("--gpu-child") + 1]
        children.append(config)
        name, batch, dtype = config.split(":")
        if name == "hf-gpt2":
            raise subprocess.TimeoutExpired(command, timeout)
        out = command[command.index("--child-json") + 1]
        row = {"median_ms": 1.0, "p90_ms": 1.1, "cold_compile_s": 3.0, "max_err_vs_fp32": 1e-3}  # as a child writes
        Path(out).write_text(json.dumps({"model": name, "shape": [int(batch), 128], "dtype": dtype,
                                         "backends": {"eager": row, "trtrtx": row}}))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    args = argparse.Namespace(models="hf-bert,hf-gpt2", dtypes="float16", batches="small", out=str(tmp_path),
                              tag="-test", budget_s=0, cache_dir=str(tmp_path / "cache"), rounds=1, iters=1,
                              backends="eager,trtrtx", timeout_s=5)
    assert zoo.gpu_main(args) == 0
    assert children == ["hf-bert:1:float16", "hf-gpt2:1:float16"]
    assert plotted == [1, 2, 2]  # after each configuration, and once more at the end
    saved = json.loads(next(tmp_path.glob("*-zoo-test.json")).read_text())
    assert [c["model"] for c in saved["configs"]] == ["hf-bert", "hf-gpt2"]
    assert saved["configs"][1]["error"] == "timed out after 5s"
    assert "hf-bert" in next(tmp_path.glob("*-zoo-test.md")).read_text()
    children.clear()
    assert zoo.gpu_main(args) == 0
    assert children == []  # both were measured (the timeout is a result too)
