"""The README stays true to the code: every option has a row, every policy rule is explained."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from rtx_backend import Options
from rtx_backend._policy import RULES

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end >= 0 else None]


def test_options_table_lists_exactly_the_options():
    rows = re.findall(r"^\| `(\w+)` \|", section("Options"), re.M)
    assert rows == [f.name for f in dataclasses.fields(Options)]


def test_targets_section_names_every_policy_rule():
    text = section("Targets and what each rules out")
    missing = [rule.name for rule in RULES if f"`{rule.name}`" not in text]
    assert missing == []


def test_examples_table_lists_every_example():
    examples = Path(__file__).resolve().parent.parent / "examples"
    names = sorted(p.name for p in examples.iterdir() if p.suffix in (".py", ".ipynb"))
    listed = re.findall(r"^\| `examples/([\w.]+)` \|", section("Quickstart"), re.M)
    assert sorted(listed) == names
