"""Local LLM generation through Hugging Face `generate`: greedy tokens and time per token of eager
PyTorch, inductor and trtrtx, on language models of several families (random weights, nothing
downloaded).

    python bench/llm.py --gpu                 # GPU: 0.5-1B configs, FP16, batch 1
    python bench/llm.py --gpu --models llama  # one family
    python bench/llm.py --cpu                 # CPU: tiny configs, tokens only (regions on ONNX Runtime)

Each backend runs Hugging Face's own compiled path: a static cache, and the decode step compiled by
`generate` through `generation_config.compile_config` (inductor: Hugging Face's default
`CompileConfig()`, mode "reduce-overhead"; trtrtx: `CompileConfig(backend="trtrtx")`). Eager is the
same `generate` with `disable_compile=True`. trtrtx also runs the other path, the model's forward
compiled by hand (`model.forward = torch.compile(model.forward, backend="trtrtx")`), which compiles
prefill too.

Per token = (time of `generate` with N new tokens - time with 1) / (N - 1); prefill = the time with 1
new token (prompt processed, one token sampled). Medians of several runs after two warm-up runs.

Tokens: each backend's greedy tokens against eager's. Random weights make near-ties between the top
two logits common, so where a token differs the step's margin is shown: eager's top-2 gap against
the difference between the two backends' logits at that step (a tie when the gap is smaller).
Results (JSON and markdown) go to bench/results/<date>-<device>-<TensorRT-RTX version>-llm.*.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import functools
import json
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent

# (config class, model class, 0.5-1B config, tiny config). The big ones are real models' shapes.
FAMILIES: dict[str, tuple[str, str, dict[str, Any], dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM",  # TinyLlama-style, 12 of its 22 layers (0.6B)
              dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=12,
                   num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=2048),
              dict(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",  # Qwen2.5-0.5B's shape
              dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                   num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                   tie_word_embeddings=True, rope_theta=1000000.0),
              dict(vocab_size=1000, hidden_size=112, intermediate_size=224, num_hidden_layers=2,
                   num_attention_heads=7, num_key_value_heads=1, max_position_embeddings=256,
                   tie_word_embeddings=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM",  # Mistral's layout, 12 layers of 2048 (0.6B)
                dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=12,
                     num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096,
                     sliding_window=4096),
                dict(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                     sliding_window=256)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM",  # Phi-3's fused qkv and gate_up projections, 0.7B
             dict(vocab_size=32064, hidden_size=2048, intermediate_size=5632, num_hidden_layers=12,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096,
                  pad_token_id=0),
             dict(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0)),
}


def build(family: str, size: str, device: str, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    """A model of `family` at `size` ("full" or "tiny"), random weights from `seed`, eval mode."""
    import transformers

    config_cls, model_cls, full, tiny = FAMILIES[family]
    config = getattr(transformers, config_cls)(**(full if size == "full" else tiny))
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    return model.to(device, dtype)  # type: ignore[no-any-return]


def prompt(model: torch.nn.Module, batch: int, length: int, seed: int = 1) -> torch.Tensor:
    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed)).to(device)


def generate(model: torch.nn.Module, ids: torch.Tensor, new: int, cache: Any = None, **kwargs: Any) -> Any:
    """Greedy `generate` of `new` tokens; with `cache` (a StaticCache), in that cache, reset first:
    the same cache tensors whatever `new` is, so that timing a shorter run compiles nothing new."""
    if cache is not None:
        cache.reset()
        kwargs["past_key_values"] = cache
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*past_key_values.* is deprecated")  # (its new name is 5.x only)
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                              do_sample=False, return_dict_in_generate=True, output_logits=True, **kwargs)


def compare_tokens(want: Any, got: Any, length: int) -> dict[str, Any]:
    """Tokens of `got` against `want` (eager): how many new tokens match, and at the first that does
    not, eager's top-2 margin and the two runs' largest logit difference at that step."""
    a, b = want.sequences[:, length:], got.sequences[:, length:]
    same = (a == b)
    result: dict[str, Any] = {"tokens": int(a.numel()), "matching": int(same.sum())}
    if bool(same.all()):
        result["match"] = True
        return result
    diffs = (~same).nonzero()
    row, step = (int(v) for v in diffs[diffs[:, 1].argmin()])
    want_logits = want.logits[step][row].float()
    top2 = want_logits.topk(2).values
    margin = float(top2[0] - top2[1])
    noise = float((got.logits[step][row].float() - want_logits).abs().max())
    result.update(match=False, first_wrong_step=step, row=row, eager_top2_margin=margin, logit_difference=noise,
                  tie=margin <= noise)
    return result


def timed(fn: Callable[[], Any], runs: int, device: str) -> float:
    """Median seconds of `fn` over `runs` calls."""
    times = []
    for _ in range(runs):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _hf_compile(model: torch.nn.Module, backend: str) -> None:
    from transformers import CompileConfig

    config = CompileConfig(backend=backend)
    config._compile_all_devices = True  # Hugging Face compiles on GPUs only, unless told (the CPU run)
    model.generation_config.compile_config = config


PATHS: dict[str, Callable[[torch.nn.Module], dict[str, Any]]] = {
    "eager": lambda m: {"disable_compile": True},
    "inductor": lambda m: (_hf_compile(m, "inductor"), {})[1],
    "trtrtx": lambda m: (_hf_compile(m, "trtrtx"), {})[1],
    "trtrtx-forward": lambda m: (setattr(m, "forward", torch.compile(m.forward, backend="trtrtx")), {})[1],
}


def run_family(family: str, size: str, device: str, paths: Sequence[str], new: int, length: int, runs: int,
               batch: int = 1, on_path: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    import rtx_backend

    dtype = torch.float16 if device == "cuda" else torch.float32
    base = build(family, size, device, dtype)
    ids = prompt(base, batch, length)
    row: dict[str, Any] = {"model": family, "size": size, "batch": batch, "prompt": length, "new_tokens": new,
                           "dtype": str(dtype).removeprefix("torch."),
                           "params_m": round(sum(p.numel() for p in base.parameters()) / 1e6, 1), "paths": {}}
    want = None
    for path in paths:
        model = base if path == "eager" else copy.deepcopy(base)
        kwargs = PATHS[path](model)
        from transformers import StaticCache

        kwargs["cache"] = StaticCache(config=model.config, max_cache_len=length + new)
        entry: dict[str, Any] = {}
        with rtx_backend.recording() as rec:
            start = time.perf_counter()
            first = generate(model, ids, new, **kwargs)
            entry["first_generate_s"] = round(time.perf_counter() - start, 2)
            second = generate(model, ids, new, **kwargs)
        if path == "eager":
            want = first
        else:
            assert want is not None
            entry["first"] = compare_tokens(want, first, length)
            entry["second"] = compare_tokens(want, second, length)
            if path.startswith("trtrtx"):
                entry["regions"] = sorted({r.runtime for r in rec.regions})
                entry["graphs"] = len(rec.graphs)
        whole = timed(functools.partial(generate, model, ids, new, **kwargs), runs, device)
        one = timed(functools.partial(generate, model, ids, 1, **kwargs), runs, device)
        entry["ms_per_token"] = round((whole - one) / (new - 1) * 1e3, 3)
        entry["prefill_ms"] = round(one * 1e3, 2)
        print(f"{family} {path}: {entry}", flush=True)
        row["paths"][path] = entry
        if on_path is not None:
            on_path(row)  # saved after each path: a run cut short keeps what it measured
        if model is not base:
            del model
        torch._dynamo.reset()
        if device == "cuda":
            torch.cuda.empty_cache()
    return row


def environment(device: str) -> dict[str, Any]:
    import transformers

    env: dict[str, Any] = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
                           "transformers": transformers.__version__, "python": platform.python_version()}
    if device == "cuda":
        import rtx_backend._trt as _trt

        env["gpu"] = torch.cuda.get_device_name()
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        env["tensorrt_rtx"] = _trt.version()
    else:
        env["gpu"] = "cpu"
    return env


def save(results: dict[str, Any], out: Path) -> Path:
    env = results["env"]
    name = env["gpu"].replace(" ", "-") if env["gpu"] != "cpu" else "cpu"
    version = ".".join(str(env.get("tensorrt_rtx", "ort")).split(".")[:3])
    stem = out / f"{env['date']}-{name}-{version}-llm"
    out.mkdir(parents=True, exist_ok=True)
    Path(f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    Path(f"{stem}.md").write_text(markdown(results))
    return stem


def markdown(results: dict[str, Any]) -> str:
    env = results["env"]
    gpu = env["gpu"] if "RTX" in env["gpu"] or env["gpu"] == "cpu" else f"{env['gpu']}, not an RTX GPU"
    lines = [f"# LLM generation, {gpu} (TensorRT-RTX {env.get('tensorrt_rtx', '-')}, torch {env['torch']}, "
             f"transformers {env['transformers']})", "",
             "Hugging Face `generate`, greedy, static cache, batch 1; ms per new token (median).", "",
             "| model | params | eager ms | inductor-ro ms | trtrtx ms | trtrtx / inductor | prefill ms "
             "(inductor / trtrtx) | tokens match |", "|---|---|---|---|---|---|---|---|"]
    for row in results["rows"]:
        p = row["paths"]
        ms = functools.partial(_ms, p)

        ratio = (f"{p['trtrtx']['ms_per_token'] / p['inductor']['ms_per_token']:.2f}x"
                 if "trtrtx" in p and "inductor" in p else "-")
        match = []
        for path in ("inductor", "trtrtx", "trtrtx-forward"):
            if path in p:
                t = p[path]["first"]
                match.append(f"{path} {'yes' if t['match'] else ('tie' if t.get('tie') else 'NO')}")
        lines.append(f"| {row['model']} | {row['params_m']:.0f}M | {ms('eager')} | {ms('inductor')} | {ms('trtrtx')} "
                     f"| {ratio} | {ms('inductor', 'prefill_ms')} / {ms('trtrtx', 'prefill_ms')} | {', '.join(match)} |")
    return "\n".join(lines) + "\n"


def _ms(paths: dict[str, Any], path: str, key: str = "ms_per_token") -> str:
    return f"{paths[path][key]:.2f}" if path in paths else "-"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--gpu", action="store_true", help="0.5-1B configs on the GPU, FP16")
    mode.add_argument("--cpu", action="store_true", help="tiny configs on the CPU, FP32")
    parser.add_argument("--models", default="llama,qwen2,mistral", help=f"of {', '.join(FAMILIES)}")
    parser.add_argument("--paths", default="eager,inductor,trtrtx", help=f"of {', '.join(PATHS)}")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args(argv)
    device = "cuda" if args.gpu else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU here: run with --cpu", file=sys.stderr)
        return 2
    paths = args.paths.split(",")
    if paths[0] != "eager":
        paths.insert(0, "eager")
    results: dict[str, Any] = {"env": environment(device), "rows": []}
    size = "full" if args.gpu else "tiny"
    stem = Path()

    def keep(row: dict[str, Any]) -> None:
        nonlocal stem
        if row not in results["rows"]:
            results["rows"].append(row)
        stem = save(results, Path(args.out))

    for family in args.models.split(","):
        run_family(family, size, device, paths, args.new_tokens, args.prompt, args.runs, on_path=keep)
    print(markdown(results))
    print(f"saved {stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
