"""Hugging Face generation through trtrtx: the greedy tokens are eager's, on every path.

Families: Llama, Qwen2, Mistral and Phi-3 layouts (tiny configs from bench/llm.py). Paths: Hugging
Face's own (`generation_config.compile_config`, which compiles the decode step with a static cache)
and the forward compiled by hand (prefill and decode), with the static and the default dynamic
cache, batch 1 and 4, several prompt lengths, several `generate` calls in a row.

On the CPU the regions run in ONNX Runtime; on the GPU in TensorRT-RTX, where the static cache's
one-row writes are made in the cache itself (KVCacheUpdate) and inputs copied for the engine live
until it has run (an LLM's cache counter once came back off by the prompt length)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

import rtx_backend

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="Hugging Face transformers is not installed (pip install '.[test]')")
ROOT = Path(__file__).resolve().parent.parent


def _llm():
    spec = importlib.util.spec_from_file_location("llm_bench", ROOT / "bench" / "llm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _generate(model, ids, new, **kwargs):
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                              do_sample=False, **kwargs)


def _compile(llm, model, path):
    if path == "forward":
        model.forward = torch.compile(model.forward, backend="trtrtx")
    else:
        llm._hf_compile(model, "trtrtx")


UPDATES = re.compile(r"weight_(updates|refits|rebuilds|fallbacks)|rebuilds")


@needs_transformers
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "phi3"])
@pytest.mark.parametrize("path", ["forward", "compile_config"])
def test_static_cache_generation_gives_eagers_tokens_on_either_path(family, path):
    """Tokens equal eager's over several calls and prompt lengths; no region runs in PyTorch, and
    the cache, written every step, is never taken for changed weights."""
    llm = _llm()
    eager, model = (llm.build(family, "tiny", "cpu", torch.float32) for _ in range(2))
    rtx_backend.set_default_options({"min_block_size": 1, "engine_cache_dir": ""})
    rtx_backend.reset_stats()
    try:
        _compile(llm, model, path)
        with rtx_backend.recording() as rec:
            for length in (12, 12, 7):
                ids = llm.prompt(eager, 1, length, seed=length)
                want = _generate(eager, ids, 5, cache_implementation="static", disable_compile=True)
                got = _generate(model, ids, 5, cache_implementation="static")
                assert got.tolist() == want.tolist(), (length, str(rec))
    finally:
        rtx_backend.set_default_options(None)
    assert rec.graphs, "nothing was compiled"
    assert rec.regions and all(r.runtime != "PyTorch" for r in rec.regions), str(rec)
    assert not [k for k in rtx_backend.stats() if UPDATES.search(k)]
    assert rtx_backend.stats().get("cache_writes_in_place", 0) >= 2  # each layer's keys and values


@needs_transformers
@pytest.mark.parametrize("batch", [1, 4])
def test_dynamic_cache_and_batches_give_eagers_tokens(batch):
    llm = _llm()
    eager, model = (llm.build("llama", "tiny", "cpu", torch.float32) for _ in range(2))
    rtx_backend.set_default_options({"min_block_size": 1, "engine_cache_dir": ""})
    try:
        model.forward = torch.compile(model.forward, backend="trtrtx")
        for cache in ("static", None):
            ids = llm.prompt(eager, batch, 9)
            kwargs = {"cache_implementation": cache} if cache else {}
            want = _generate(eager, ids, 4, disable_compile=True, **kwargs)
            got = _generate(model, ids, 4, **kwargs)
            assert got.tolist() == want.tolist(), cache
    finally:
        rtx_backend.set_default_options(None)


@needs_transformers
def test_one_static_cache_over_prompts_of_several_lengths_gives_eagers_tokens():
    """One StaticCache object passed to every `generate`: the cache keeps its shape while the
    prompt's length changes, so the forward's prefill graph turns dynamic in the sequence length
    with its cache writes in it (their scatter index sized by that symbol)."""
    from transformers import StaticCache

    llm = _llm()
    eager, model = (llm.build("llama", "tiny", "cpu", torch.float32) for _ in range(2))
    rtx_backend.reset_stats()
    with rtx_backend.default_options({"min_block_size": 1, "engine_cache_dir": ""}):
        model.forward = torch.compile(model.forward, backend="trtrtx")
        cache = StaticCache(config=model.config, max_cache_len=40)
        with rtx_backend.recording() as rec:
            for length in (20, 11, 16):
                ids = llm.prompt(eager, 1, length, seed=length)
                want = _generate(eager, ids, 4, disable_compile=True)
                cache.reset()
                got = _generate(model, ids, 4, past_key_values=cache)
                assert got.tolist() == want.tolist(), (length, str(rec))
    assert rec.regions and all(r.runtime != "PyTorch" for r in rec.regions), str(rec)
    assert rtx_backend.stats().get("cache_writes_in_place", 0) >= 4  # prefill and decode graphs


@needs_transformers
def test_the_decode_steps_cache_writes_reach_the_engine_as_in_place_updates(tmp_path):
    """The exported decode region writes each layer's keys and values with a ScatterElements on the
    cache input; the engine build turns every one into TensorScatter (KVCacheUpdate)."""
    import onnx

    from rtx_backend.build import cache_writes

    llm = _llm()
    model = llm.build("llama", "tiny", "cpu", torch.float32)
    llm._hf_compile(model, "trtrtx")
    with rtx_backend.default_options({"min_block_size": 1, "engine_cache_dir": "", "dump_onnx_dir": str(tmp_path)}):
        _generate(model, llm.prompt(model, 1, 10), 3, cache_implementation="static")
    found = []
    for path in tmp_path.glob("*.onnx"):
        proto = onnx.load(str(path))
        found.append(cache_writes.rewrite(proto))
    layers = model.config.num_hidden_layers
    assert [len(a) for a in found] == [2 * layers], found
    (aliases,) = found
    assert all(output != source for output, source in aliases.items())


def _llama_gpu(seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval().to("cuda", torch.float16)


@pytest.mark.gpu
@needs_transformers
@pytest.mark.parametrize("validate", [True, False])
def test_static_cache_generation_gives_eagers_tokens_on_tensorrt_rtx(validate):
    eager = _llama_gpu()
    compiled = _llama_gpu()
    compiled.forward = torch.compile(compiled.forward, backend="trtrtx", options={"validate": validate})
    for length in (32, 20):
        ids = torch.randint(0, 1000, (1, length), device="cuda")
        with torch.no_grad():
            want = eager.generate(ids, max_new_tokens=16, do_sample=False, cache_implementation="static",
                                  disable_compile=True)
            with rtx_backend.recording() as rec:
                got = [compiled.generate(ids, max_new_tokens=16, do_sample=False, cache_implementation="static")
                       for _ in range(2)]
        for tokens in got:
            assert tokens[0, length:].tolist() == want[0, length:].tolist()
        if length == 32:  # every region on TensorRT-RTX: none sent to PyTorch by first-call validation
            assert rec.runtimes == {"TensorRT-RTX"}, str(rec)


@pytest.mark.gpu
@needs_transformers
@pytest.mark.parametrize("batch", [1, 4])
def test_hugging_faces_compiled_decode_writes_the_cache_in_place_on_tensorrt_rtx(batch):
    """Hugging Face's own path on TensorRT-RTX: tokens equal eager's over calls and prompt lengths,
    and the engine's cache outputs are the cache tensors themselves (no copy per token)."""
    llm = _llm()
    eager = _llama_gpu()
    model = _llama_gpu()
    llm._hf_compile(model, "trtrtx")
    rtx_backend.reset_stats()
    with rtx_backend.recording() as rec:
        for length in (24, 24, 13):
            ids = torch.randint(0, 1000, (batch, length), generator=torch.Generator().manual_seed(length)).cuda()
            want = _generate(eager, ids, 12, cache_implementation="static", disable_compile=True)
            got = _generate(model, ids, 12, cache_implementation="static")
            assert got.tolist() == want.tolist(), (length, str(rec))
    assert rec.runtimes == {"TensorRT-RTX"}, str(rec)
    assert rtx_backend.stats().get("cache_writes_in_place", 0) >= 4
    assert rtx_backend.stats().get("engine_outputs_in_place", 0) >= 4  # 2 layers' keys and values
