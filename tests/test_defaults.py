"""Default options: how targets and other options reach compiles that are given `mode=` only
(Hugging Face's CompileConfig), for the process or for a with-block."""

from __future__ import annotations

import pytest
import torch

import rtx_backend
from rtx_backend import _backend, _defaults


@pytest.fixture
def seen(monkeypatch):
    """The Options of every compile (the backend's own parse, spied on)."""
    monkeypatch.setattr(_defaults, "PROCESS", _defaults.ProcessDefaults())
    found = []
    original = _backend.options_for_mode

    def spy(mode, options=None):
        opts = original(mode, options)
        found.append(opts)
        return opts

    monkeypatch.setattr(_backend, "options_for_mode", spy)
    return found


def _compile_and_run(**kwargs):
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    compiled = torch.compile(model, backend="trtrtx", **kwargs)
    with torch.no_grad():
        x = torch.randn(2, 8)
        torch.testing.assert_close(compiled(x), model(x))


def test_process_defaults_reach_a_compile_given_mode_only(seen):
    rtx_backend.set_default_options({"target_compute_capabilities": [(8, 6)], "min_block_size": 1,
                                     "engine_cache_dir": ""})
    _compile_and_run(mode="reduce-overhead")  # what Hugging Face's CompileConfig passes
    (opts,) = seen
    assert opts.target_compute_capabilities == ((8, 6),) and opts.min_block_size == 1
    assert opts.cuda_graph_strategy == "whole_graph_capture"  # the mode still applies
    rtx_backend.set_default_options(None)
    _compile_and_run()
    assert seen[-1].target_compute_capabilities is None and seen[-1].min_block_size == 5


def test_given_options_override_the_defaults_key_by_key(seen):
    rtx_backend.set_default_options({"min_block_size": 1, "engine_cache_dir": ""})
    _compile_and_run(options={"min_block_size": 2})
    assert seen[-1].min_block_size == 2 and not seen[-1].engine_cache_dir  # the default kept: no cache
    _compile_and_run(options=rtx_backend.Options(min_block_size=3))  # an Options object: as it is
    assert seen[-1].min_block_size == 3 and seen[-1].engine_cache_dir  # its own default cache, not ""


def test_a_block_sets_defaults_for_its_compiles_only(seen):
    rtx_backend.set_default_options({"min_block_size": 1})
    with rtx_backend.default_options({"engine_cache_dir": "", "target_compute_capabilities": (8, 9)}):
        _compile_and_run()
        with rtx_backend.default_options({"min_block_size": 4}):  # nested: over the outer block's
            _compile_and_run()
    _compile_and_run()
    inner_block, nested, after = seen
    assert inner_block.min_block_size == 1 and inner_block.target_compute_capabilities == ((8, 9),)
    assert nested.min_block_size == 4 and nested.target_compute_capabilities == ((8, 9),)
    assert after.min_block_size == 1 and after.target_compute_capabilities is None


@pytest.mark.parametrize("bad", [{"min_blok_size": 1}, {"runtime": "vulkan"}, ["min_block_size"]])
def test_bad_defaults_are_refused_where_they_are_written(seen, bad):
    with pytest.raises(rtx_backend.OptionsError):
        rtx_backend.set_default_options(bad)
    with pytest.raises(rtx_backend.OptionsError), rtx_backend.default_options(bad):
        pass
    assert _defaults.PROCESS.get() is None


def test_an_iterator_given_as_a_default_serves_every_compile(seen):
    rtx_backend.set_default_options({"target_compute_capabilities": iter([(8, 6)]), "engine_cache_dir": ""})
    _compile_and_run()
    _compile_and_run()
    assert [o.target_compute_capabilities for o in seen] == [((8, 6),), ((8, 6),)]


def test_explain_follows_the_defaults_as_a_compile_does(seen):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval()
    x = torch.randn(2, 8)
    assert "fp32-gemm-turing" not in str(rtx_backend.explain(model, x))
    rtx_backend.set_default_options({"target_compute_capabilities": [(7, 5)]})
    assert "fp32-gemm-turing" in str(rtx_backend.explain(model, x))  # FP32 GEMMs: not on Turing
    assert "fp32-gemm-turing" not in str(rtx_backend.explain(model, x, options={"target_compute_capabilities": [(8, 6)]}))
