"""Hugging Face generation through a compiled forward: the greedy tokens are eager's.

A Llama-style model with a static cache makes regions whose inputs include the cache's int64
position counters; the engine must read each of them as given (copies of inputs made for the
engine live until it has run). GPU only: on the CPU the regions run in ONNX Runtime."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import rtx_backend

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="Hugging Face transformers is not installed (pip install '.[test]')")


def _llama(seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval().to("cuda", torch.float16)


@pytest.mark.gpu
@needs_transformers
@pytest.mark.parametrize("validate", [True, False])
def test_static_cache_generation_gives_eagers_tokens_on_tensorrt_rtx(validate):
    eager = _llama()
    compiled = _llama()
    compiled.forward = torch.compile(compiled.forward, backend="trtrtx", options={"validate": validate})
    for length in (32, 20):
        ids = torch.randint(0, 1000, (1, length), device="cuda")
        with torch.no_grad():
            want = eager.generate(ids, max_new_tokens=16, do_sample=False, cache_implementation="static")
            with rtx_backend.recording() as rec:
                got = [compiled.generate(ids, max_new_tokens=16, do_sample=False, cache_implementation="static")
                       for _ in range(2)]
        for tokens in got:
            assert tokens[0, length:].tolist() == want[0, length:].tolist()
        if length == 32:  # every region on TensorRT-RTX: none sent to PyTorch by first-call validation
            assert rec.runtimes == {"TensorRT-RTX"}, str(rec)


def _tiny_llama_cpu(seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


@needs_transformers
@pytest.mark.parametrize("path", ["forward", "compile_config"])
def test_generation_through_either_path_gives_eagers_tokens_with_no_weight_updates(path):
    """On the CPU the regions run in ONNX Runtime. Hugging Face's own path compiles the decode step,
    whose static cache tensors (marked static, written every step) are state, not weights: no
    region may run in PyTorch for "changed weights", and nothing is refitted or rebuilt."""
    import re

    from transformers import CompileConfig

    eager, model = _tiny_llama_cpu(), _tiny_llama_cpu()
    rtx_backend.set_default_options({"min_block_size": 1, "engine_cache_dir": ""})
    try:
        if path == "forward":
            model.forward = torch.compile(model.forward, backend="trtrtx")
        else:
            config = CompileConfig(backend="trtrtx")
            config._compile_all_devices = True  # Hugging Face compiles on GPUs only, unless told
            model.generation_config.compile_config = config
        ids = torch.randint(0, 1000, (1, 12))
        with torch.no_grad(), rtx_backend.recording() as rec:
            want = eager.generate(ids, max_new_tokens=6, do_sample=False, cache_implementation="static")
            got = [model.generate(ids, max_new_tokens=6, do_sample=False, cache_implementation="static")
                   for _ in range(2)]
    finally:
        rtx_backend.set_default_options(None)
    if not rec.graphs:
        pytest.skip("this transformers compiles generate's decode step on GPUs only")
    for tokens in got:
        assert tokens.tolist() == want.tolist()
    assert rec.regions and all(r.runtime != "PyTorch" for r in rec.regions), str(rec)
    assert not [k for k in rtx_backend.stats() if re.search(r"weight_(updates|refits|rebuilds|fallbacks)|rebuilds", k)]
