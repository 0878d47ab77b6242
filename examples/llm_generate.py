"""Local LLM generation: a Llama-style model compiled with trtrtx for RTX targets, generating text
with Hugging Face's `generate`.

    python examples/llm_generate.py                       # a small random-weight Llama, nothing downloaded
    python examples/llm_generate.py --model Qwen/Qwen2.5-0.5B-Instruct --prompt "Why is the sky blue?"

`generate` compiles its decode step itself (a static cache, `mode="reduce-overhead"`); torch.compile
takes no `options=` beside a mode, so the targets reach that compile as default options. Each layer's
per-token cache write runs inside the engine, on the cache itself. The greedy tokens are compared with
eager PyTorch's. On a machine without a GPU TensorRT-RTX can run, the regions run in ONNX Runtime
and the script says so.
"""

from __future__ import annotations

import argparse
import logging
import time

import torch

import rtx_backend

TARGETS = [(8, 6), (8, 9)]  # Ampere (RTX 30xx) and Ada (RTX 40xx); add (12, 0) for Blackwell


def load(name: str | None, device: str, dtype: torch.dtype) -> tuple[torch.nn.Module, object | None]:
    """A pretrained model and its tokenizer (downloaded by Hugging Face), or a small random Llama."""
    if name:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=dtype).eval().to(device)
        return model, AutoTokenizer.from_pretrained(name)
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=2000, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval().to(device, dtype), None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a Hugging Face model id (default: a small random Llama)")
    parser.add_argument("--prompt", default="The capital of France is")
    parser.add_argument("--new-tokens", type=int, default=24)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    model, tokenizer = load(args.model, device, dtype)
    if tokenizer is not None:
        ids = tokenizer(args.prompt, return_tensors="pt").input_ids.to(device)
    else:
        ids = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1)).to(device)
    settings = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                    cache_implementation="static", attention_mask=torch.ones_like(ids))

    with torch.no_grad():
        want = model.generate(ids, disable_compile=True, **settings)  # eager PyTorch, for comparison

    from transformers import CompileConfig

    rtx_backend.set_default_options({"target_compute_capabilities": TARGETS})
    config = CompileConfig(backend="trtrtx")
    config._compile_all_devices = device == "cpu"  # Hugging Face compiles on GPUs only, unless told
    model.generation_config.compile_config = config
    with torch.no_grad(), rtx_backend.recording() as rec:
        start = time.perf_counter()
        got = model.generate(ids, **settings)  # the first call compiles the decode step
        first = time.perf_counter() - start
        start = time.perf_counter()
        got = model.generate(ids, **settings)
        second = time.perf_counter() - start
    print(rec)
    new = got[0, ids.shape[1]:]
    if tokenizer is not None:
        print("text:", tokenizer.decode(new, skip_special_tokens=True))
    else:
        print("tokens:", new.tolist())
    same = int((new == want[0, ids.shape[1]:]).sum())
    print(f"greedy tokens equal to eager PyTorch's: {same} of {new.numel()}")
    print(f"first generate (compiles) {first:.1f} s; second {second * 1e3:.0f} ms "
          f"({second / args.new_tokens * 1e3:.1f} ms per token, prefill included)")


if __name__ == "__main__":
    main()
