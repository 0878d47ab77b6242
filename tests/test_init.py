"""help(rtx_backend) is useful: the package docstring points to the tools, every public name
has a docstring, and help(Options) shows every option with its note."""

from __future__ import annotations

import dataclasses
import inspect

import rtx_backend


def test_package_docstring_points_to_the_public_functions_and_docs():
    doc = rtx_backend.__doc__ or ""
    for name in ("explain", "recording", "crosscheck", "Options", "stats", "reset_stats", "preload",
                 "save_runtime_cache", "python -m rtx_backend info", "README", "docs/", "reduce-overhead"):
        assert name in doc, name


def test_every_public_name_has_a_docstring():
    missing = [n for n in rtx_backend.__all__ if not inspect.getdoc(getattr(rtx_backend, n))]
    assert missing == []


def test_help_of_options_lists_every_field_with_its_note():
    doc = rtx_backend.Options.__doc__ or ""
    for f in dataclasses.fields(rtx_backend.Options):
        line = next((ln for ln in doc.splitlines() if ln.strip().startswith(f"{f.name} (default")), "")
        assert line and "): " in line, f"{f.name} has no note in help(Options)"
    assert "Regions with fewer compute nodes stay in PyTorch" in doc
