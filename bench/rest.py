"""rest="pytorch" against rest="inductor": latency and cold compile, beside inductor's own.

    python3 bench/rest.py --gpu --out DIR        # H200: the zoo and the Turing-like partition
    python3 bench/rest.py --smoke                # CPU: one tiny model, every column (CI: it runs)

Three parts, each model compiled by every backend in one process and timed in interleaved rounds
(median and p90 of CUDA-event latencies), cold compile = the first call after torch._dynamo.reset
(engine cache empty for each part: builds are counted in):

- zoo: models of bench/zoo.py (FP16) with trtrtx rest pytorch and inductor, with and without
  CUDA graphs (trtrtx-cg: TensorRT-RTX's per-engine graphs; trtrtx-inductor-cg: inductor's
  cudagraph trees over the whole graph, engines inside), against inductor and inductor
  reduce-overhead. The issue's target: trtrtx-inductor no more than 5% slower than the better of
  inductor and inductor-ro.
- turing: the partition of an FP32 model for Turing, simulated on the H200: every GEMM kept in
  PyTorch (torch_executed_ops), ViT-B/16 and BERT-base; target: rest inductor >= 1.5x faster than
  rest pytorch.
- fallback: a model whose lowering is forced to fail (trtrtx.lower raising), so the whole
  graph goes to the rest: rest inductor should be at inductor's speed, rest pytorch at eager's.

Results: JSON (and a markdown table) named by bench.result_path(kind="rest", ...) in --out.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _load("bench")
zoo = _load("zoo")

ZOO_MODELS = ["tv-resnet50", "tv-mobilenet_v3_large", "tv-efficientnet_b0", "tv-convnext_tiny", "tv-vit_b_16",
              "tv-swin_t", "timm-deit_small_patch16_224", "hf-bert", "hf-t5-encoder"]
TURING_MODELS = ["tv-vit_b_16", "hf-bert"]
FALLBACK_MODELS = ["tv-swin_t"]
# every GEMM spelling that reaches the partitioner (the policy's "gemm" family), where it exists
GEMM_OPS = [f"aten.{n}" for n in ("mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "scaled_dot_product_attention",
                                  "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                                  "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
            if hasattr(torch.ops.aten, n)]


def backends(cache: str, extra: dict[str, Any], peers: bool,
             only: Sequence[str] = ()) -> dict[str, Callable[[Any], Callable[..., Any]]]:
    base = {"min_block_size": 1, "engine_cache_dir": str(Path(cache) / "engines"),
            "runtime_cache_path": str(Path(cache) / "runtime.cache"), **extra}
    if torch.cuda.is_available():
        base["runtime"] = "tensorrt_rtx"

    def trtrtx(**more: Any) -> Callable[[Any], Callable[..., Any]]:
        return lambda m: torch.compile(m, backend="trtrtx", dynamic=False, options={**base, **more})

    table: dict[str, Callable[[Any], Callable[..., Any]]] = {"eager": lambda m: m}
    if peers:
        table["inductor"] = lambda m: torch.compile(m, dynamic=False)
        if torch.cuda.is_available():
            table["inductor-ro"] = lambda m: torch.compile(m, mode="reduce-overhead", dynamic=False)
    table["trtrtx"] = trtrtx(rest="pytorch")
    table["trtrtx-inductor"] = trtrtx(rest="inductor")
    if torch.cuda.is_available():
        table["trtrtx-cg"] = trtrtx(rest="pytorch", cuda_graph_strategy="whole_graph_capture")
        table["trtrtx-inductor-cg"] = trtrtx(rest="inductor", cuda_graph_strategy="whole_graph_capture")
    table["trtrtx-fastest" + ("-cg" if torch.cuda.is_available() else "")] = trtrtx(
        rest="inductor", fastest=True,
        **({"cuda_graph_strategy": "whole_graph_capture"} if torch.cuda.is_available() else {}))
    return {b: f for b, f in table.items() if not only or b in only}


def measure(name: str, model: Any, x: tuple[torch.Tensor, ...], ref: torch.Tensor,
            table: dict[str, Callable[[Any], Callable[..., Any]]], rounds: int, iters: int) -> dict[str, Any]:
    import rtx_backend
    from rtx_backend._record import recording

    rows: dict[str, dict[str, Any]] = {}
    compiled: dict[str, Callable[..., Any]] = {}
    for bname, make in table.items():
        torch._dynamo.reset()
        rtx_backend.reset_stats()
        row: dict[str, Any] = {}
        try:
            fn = make(model)
            t = time.perf_counter()
            with torch.inference_mode(), recording() as graphs:
                out = fn(*x)
                bench.sync()
            row["cold_compile_s"] = round(time.perf_counter() - t, 3)
            with torch.inference_mode():
                for _ in range(3):
                    out = fn(*x)
            row["max_err_vs_fp32"] = (out.float() - ref).abs().max().item()
            if bname.startswith("trtrtx"):
                regions = [r for g in graphs for r in g.regions]
                stats = rtx_backend.stats()
                row.update(regions=len(regions), regions_in_pytorch=sum(r.kind == "pytorch" for r in regions),
                           regions_on_inductor=sum(r.chosen == "inductor" for r in regions),
                           engine_builds=stats.get("engine_builds", 0),
                           rest_inductor_graphs=stats.get("rest_inductor_graphs", 0),
                           rest_inductor_whole_graphs=stats.get("rest_inductor_whole_graphs", 0),
                           eager_ops=sum(len(g.plan.eager_ops) for g in graphs))
            compiled[bname] = fn
        except Exception as exc:  # a backend that cannot compile this model is a result too
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        rows[bname] = row
    for fn in compiled.values():  # each compile reset Dynamo: compile again (from the caches)
        with torch.inference_mode():
            fn(*x)
            fn(*x)
    lat: dict[str, list[float]] = {b: [] for b in compiled}
    for _ in range(rounds):
        for bname, fn in compiled.items():
            with torch.inference_mode():
                lat[bname] += bench.latencies(lambda fn=fn: fn(*x), iters)
    for bname, values in lat.items():
        rows[bname]["median_ms"] = round(statistics.median(values), 4)
        rows[bname]["p90_ms"] = round(bench.p90(values), 4)
    best_inductor = min((rows[b]["median_ms"] for b in ("inductor", "inductor-ro") if "median_ms" in rows.get(b, {})),
                        default=None)
    summary: dict[str, Any] = {}
    for b in ("trtrtx", "trtrtx-inductor", "trtrtx-cg", "trtrtx-inductor-cg", "trtrtx-fastest", "trtrtx-fastest-cg"):
        if best_inductor and "median_ms" in rows.get(b, {}):
            summary[f"{b}_vs_best_inductor"] = round(rows[b]["median_ms"] / best_inductor, 3)
    for suffix in ("", "-cg"):
        slow, fast = rows.get("trtrtx" + suffix, {}), rows.get("trtrtx-inductor" + suffix, {})
        if "median_ms" in slow and "median_ms" in fast:
            summary["speedup_rest_inductor_over_pytorch" + suffix.replace("-", "_")] = round(
                slow["median_ms"] / fast["median_ms"], 3)
    return {"model": name, "shape": [list(t.shape) for t in x], "backends": rows, "summary": summary}


def load(name: str, size: str, batch: int, dtype: torch.dtype, device: str) -> tuple[Any, tuple[torch.Tensor, ...],
                                                                                     torch.Tensor]:
    torch.manual_seed(0)
    entry = zoo.ZOO[name]
    base = entry.build(size).to(device)
    zoo.prepare(base, lambda b: entry.inputs(size, b))
    x32 = zoo.cast(entry.inputs(size, batch), torch.float32, device)
    with torch.inference_mode():
        ref = base(*x32).float()
    return base.to(dtype).requires_grad_(False), zoo.cast(x32, dtype, device), ref


@contextlib.contextmanager
def failing_lowering() -> Any:
    """trtrtx's lowering raises: the whole graph is the rest (Swin-T on the H200 did this)."""
    from rtx_backend.assemble import reuse as _backend

    real = _backend.lower

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("lowering forced to fail by bench/rest.py")

    _backend.lower = broken  # type: ignore[assignment]
    try:
        yield
    finally:
        _backend.lower = real  # type: ignore[assignment]


def table_md(parts: dict[str, list[dict[str, Any]]]) -> str:
    lines = []
    for part, configs in parts.items():
        names = sorted({b for c in configs for b in c["backends"]}, key=lambda b: list(configs[0]["backends"]).index(b)
                       if b in configs[0]["backends"] else 99)
        lines += [f"## {part}", "", "| model | " + " | ".join(f"{b} ms (cold s)" for b in names) + " | summary |",
                  "|---" * (len(names) + 2) + "|"]
        for c in configs:
            cells = []
            for b in names:
                row = c["backends"].get(b, {})
                cells.append("error" if "error" in row else
                             f"{row.get('median_ms', float('nan')):.3f} ({row.get('cold_compile_s', float('nan')):.1f})")
            lines.append(f"| {c['model']} | " + " | ".join(cells) + f" | {json.dumps(c['summary'])} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="the H200 run: full-size models, FP16, CUDA")
    parser.add_argument("--smoke", action="store_true", help="CPU: one tiny model, few iterations")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--parts", default="zoo,turing,fallback")
    parser.add_argument("--models", default="", help="comma-separated zoo names (default: each part's list)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--backends", default="", help="comma-separated subset of the backends (default: all)")
    parser.add_argument("--tag", default="", help="added to the result file's name, e.g. the part measured")
    args = parser.parse_args(argv)
    if args.gpu and not torch.cuda.is_available():
        parser.error("--gpu needs CUDA")
    device, dtype = ("cuda", torch.float16) if args.gpu else ("cpu", torch.float32)
    size = "full" if args.gpu else "tiny"
    if args.smoke:
        args.rounds, args.iters, args.batch = 1, 3, 2
    chosen = [m for m in args.models.split(",") if m]
    lists = {"zoo": ZOO_MODELS, "turing": TURING_MODELS, "fallback": FALLBACK_MODELS}
    if not args.gpu:
        lists = {k: ["hf-bert"] for k in lists}  # torchvision does not import next to the CPU torch
    env = bench.environment()
    results: dict[str, Any] = {"environment": env, "gemm_ops": GEMM_OPS, "parts": {}}
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    path = bench.result_path("-".join(t for t in ("rest", args.tag, "smoke" if args.smoke else "") if t), env, out)
    for part in [p for p in args.parts.split(",") if p]:
        configs = results["parts"].setdefault(part, [])
        for name in chosen or lists[part]:
            problem = zoo.available(zoo.ZOO[name])
            if problem:
                configs.append({"model": name, "skipped": problem, "backends": {}, "summary": {}})
                continue
            with tempfile.TemporaryDirectory() as cache:
                extra = {"torch_executed_ops": GEMM_OPS} if part == "turing" else {}
                table = backends(cache, extra, peers=not args.smoke or part == "fallback",
                                 only=[b for b in args.backends.split(",") if b])
                model, x, ref = load(name, size, args.batch, dtype, device)
                with failing_lowering() if part == "fallback" else contextlib.nullcontext():
                    config = measure(name, model, x, ref, table, args.rounds, args.iters)
            configs.append(config)
            print(json.dumps({"part": part, "model": name, "summary": config["summary"],
                              "median_ms": {b: r.get("median_ms", r.get("error")) for b, r in config["backends"].items()},
                              "cold_s": {b: r.get("cold_compile_s") for b, r in config["backends"].items()}}),
                  flush=True)
            path.write_text(json.dumps(results, indent=1) + "\n")  # after every model: a crash keeps the rest
            del model, x, ref
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    path.write_text(json.dumps(results, indent=1) + "\n")
    md = path.with_name(path.name.removesuffix(".json") + ".md")
    md.write_text(table_md({k: [c for c in v if c["backends"]] for k, v in results["parts"].items()}))
    print(f"saved {path} and {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
