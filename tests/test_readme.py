"""The README stays true to the code: every option has a row, every policy rule is explained,
the explain sample is what explain prints, the benchmark tables are the saved results, and
nothing in the user-facing text speaks of how it was developed."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import torch

import rtx_backend
from rtx_backend import Options
from rtx_backend.plan.policy import RULES
from rtx_backend.tools.explain import FIXES

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = {p.name: p.read_text() for p in (ROOT / "docs").glob("*.md")}


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end >= 0 else None]


def test_readme_is_short():
    assert len(README.splitlines()) <= 250


def test_the_two_commands_are_there_and_the_test_command_is_what_ci_runs():
    commands = re.findall(r"```bash\n(.+?)\n```", section("The two commands"))
    assert commands[0].endswith("python examples/quickstart.py")
    assert commands[1].endswith("python -m pytest -q")
    assert "python -m pytest -q" in (ROOT / ".ci" / "run").read_text()
    text = section("The two commands")
    assert "minutes" in text and "-rs" in text  # how long the tests take; how to see skip reasons


def test_options_table_lists_exactly_the_options():
    rows = re.findall(r"^\| `(\w+)` \|", section("Options"), re.M)
    assert rows == [f.name for f in dataclasses.fields(Options)]


def test_mode_is_documented():
    text = section("Options")
    assert 'mode="reduce-overhead"' in text and "whole_graph_capture" in text and "max-autotune" in text


def test_targets_section_names_every_policy_rule():
    text = section("Targets and what each rules out")
    missing = [rule.name for rule in RULES if f"`{rule.name}`" not in text]
    assert missing == []


def test_explain_rules_table_names_every_other_rule():
    text = section("Reading explain")
    others = set(FIXES) - {r.name for r in RULES} - {"not-an-op"}
    assert sorted(r for r in others if f"`{r}`" not in text) == []


def test_explain_sample_is_what_explain_prints():
    spec = importlib.util.spec_from_file_location("turing_targets", ROOT / "examples" / "turing_targets.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.manual_seed(0)
    model = example.VideoClassifier().eval()
    report = rtx_backend.explain(model, torch.randn(2, 3, 4, 16, 16),
                                 options={"min_block_size": 1, "target_compute_capabilities": example.TURING})
    (sample,) = re.findall(r"```\n(trtrtx explain:.+?)\n```", section("Reading explain"), re.S)
    assert sample == str(report)


def test_examples_table_lists_every_example():
    names = sorted(p.name for p in (ROOT / "examples").iterdir() if p.suffix in (".py", ".ipynb"))
    listed = re.findall(r"^\| `examples/([\w.]+)` \|", section("Quickstart"), re.M)
    assert sorted(listed) == names


def test_benchmark_tables_are_the_saved_results():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "report.py"), "--check"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "<!-- report:readme -->\n| " not in README  # the block holds a table, not nothing
    assert re.search(r"<!-- report:readme -->\n.+\n\n\| model \| batch", README)


def test_performance_and_zoo_pages_name_the_gpu_of_every_table_and_say_it_is_not_an_rtx_gpu():
    """Their tables are generated (bench/report.py), each under a line naming the GPU and the
    TensorRT-RTX version it was measured with; the pages read as a guide, not as a log."""
    for name in ("performance.md", "zoo.md"):
        text = DOCS[name]
        assert "not an RTX GPU" in text and "H200" in text, name
        blocks = re.findall(r"<!-- report:(\w+) -->\n(.*)\n", text)
        assert len(blocks) >= 3, name
        for table, first in blocks:
            if table not in ("readme", "bench"):  # (the README's table and its FP32 twin: their own header line)
                assert re.match(r"(.+ \(not an RTX GPU\)|.*RTX.*|CPU), TensorRT-RTX \d+\.\d+\.\d+", first), (name, first)
        assert not re.search(r"^#+ .*\d{4}-\d\d-\d\d", text, re.M), name  # no dated sections
        assert not re.search(r"\bused to\b", text), name


GUIDES = ("performance.md", "zoo.md", "rest.md", "deploy.md", "weights.md", "design.md")


def test_guide_pages_read_as_a_guide_and_their_tables_name_the_gpu():
    """No dated sections, no "used to"; every generated table of these pages says which GPU it
    comes from, and a page that quotes H200 numbers says that it is not an RTX GPU."""
    for name in GUIDES:
        text = DOCS[name]
        assert not re.search(r"^#+ .*\d{4}-\d\d-\d\d", text, re.M), name
        assert not re.search(r"\bused to\b|\bnot explained yet\b|\bnot measured yet\b", text, re.I), name
        for table, first in re.findall(r"<!-- report:(\w+) -->\n(.*)\n", text):
            if table not in ("readme", "bench"):
                assert re.match(r"(.+ \(not an RTX GPU\)|.*RTX.*|CPU), TensorRT-RTX \d+\.\d+\.\d+", first), (name, first)
        if "H200" in text:
            assert "not an RTX GPU" in text, name


def test_docs_exist_and_are_linked():
    for name in ("design.md", "caches.md", "performance.md"):
        assert name in DOCS and f"(docs/{name})" in README


# Words that speak of how the software was made, not of what it is.
DEVELOPMENT = re.compile(r"\bsessions?\b|\brun [A-Z]\d+\b|\b(fifth|sixth|seventh|eighth|ninth|tenth) round\b|"
                         r"\bthe [\d.]+ ?(s|us|x)? target\b|\btarget is (met|out of reach)\b|Noticed and not", re.I)
ALLOWED = re.compile(r"ONNX Runtime sessions?|its ONNX Runtime session|nox sessions?", re.I)


def test_no_development_history_in_readme_docs_or_results():
    texts = {"README.md": README, **{f"docs/{k}": v for k, v in DOCS.items()}}
    results = ROOT / "bench" / "results"
    for path in results.iterdir():
        texts[f"bench/results/{path.name} (name)"] = path.name
        if path.suffix in (".md", ".json"):
            texts[f"bench/results/{path.name}"] = path.read_text()
    found = {name: m.group(0) for name, text in texts.items()
             for m in [DEVELOPMENT.search(ALLOWED.sub("", text))] if m}
    assert found == {}


def test_results_are_named_by_date_gpu_version_and_kind():
    stems = {p.stem for p in (ROOT / "bench" / "results").iterdir()}
    assert stems and all(re.fullmatch(r"\d{4}-\d\d-\d\d-[\w-]+-\d+\.\d+\.\d+(-[a-z-]+)?", s) for s in stems), stems
