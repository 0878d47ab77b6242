"""GPU probe: where a compiled zoo model's call spends the time its engine does not.

The zoo's split (`engine ms` against the whole call) leaves 0.1 to 0.4 ms per call outside the
engine on models lowered whole (one region, nothing else in the graph). For each model, with
trtrtx and TensorRT-RTX's native CUDA graphs, this prints, in CUDA-event milliseconds (median):

- `call`: the compiled model, as the zoo times it;
- `backend`: what the backend returned for the graph, called without Dynamo (its frame, guards
  and output rebuilding left out), on the graph's own example inputs;
- `engine`: the region's executor alone, on the tensors the region receives;

and, in host microseconds from the start of the call: when the engine's enqueue begins, how
long the enqueue takes on the host, and when the call returns; then torch.profiler's busiest
host events. With `--inductor`, inductor with `mode="reduce-overhead"` is timed the same way:
through Dynamo, and what it returned for the graph called without Dynamo. For a model lowered
whole, the engine alone against inductor's code without Dynamo compares the same ops, each
without the frame that both pay.

    python bench/probes/call_overhead.py --models hf-bert,tv-resnet50 [--inductor] [--save DIR]

`--save` writes `<date>-<gpu>-<TensorRT-RTX version>-call-overhead.json` and `.md` to DIR.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

import zoo  # noqa: E402

import rtx_backend  # noqa: E402
from rtx_backend._backend import trtrtx  # noqa: E402
from rtx_backend._record import recording  # noqa: E402
from rtx_backend.run import executors  # noqa: E402


def median_ms(fn: Any, iters: int) -> float:
    bench = zoo._bench_module()
    return float(statistics.median(bench.latencies(fn, iters)))


def host_marks(fn: Any, calls: int) -> dict[str, float]:
    """Host microseconds from a call's start to its enqueue, of the enqueue, and of the call."""
    marks: list[tuple[float, float]] = []
    original = executors.TrtExecutor._enqueue

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            marks.append((t, time.perf_counter()))

    executors.TrtExecutor._enqueue = timed  # type: ignore[method-assign]
    rows = []
    try:
        for _ in range(calls):
            marks.clear()
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            end = time.perf_counter()
            if marks:
                rows.append(((marks[0][0] - start) * 1e6, sum(b - a for a, b in marks) * 1e6, (end - start) * 1e6))
    finally:
        executors.TrtExecutor._enqueue = original  # type: ignore[method-assign]
    if not rows:
        return {}
    return {k: statistics.median(r[i] for r in rows) for i, k in
            enumerate(("to_enqueue_us", "enqueue_us", "call_us"))}


def top_host_events(fn: Any, top: int) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=top)
    return str(table).splitlines()


def capturing(compile: Any) -> tuple[Any, list[tuple[Any, list[Any]]]]:
    """A backend that compiles with `compile(gm, example_inputs)`, and the list in which it keeps
    each graph's callable with the example inputs, to call without Dynamo."""
    kept: list[tuple[Any, list[Any]]] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        fn = compile(gm, example_inputs)
        kept.append((fn, list(example_inputs)))
        return fn

    return keep, kept


def probe(name: str, batch: int, iters: int, inductor: bool, cache_dir: str, events: bool) -> dict[str, Any]:
    entry = zoo.ZOO[name]
    torch.manual_seed(0)
    base = entry.build("full").cuda()
    zoo.prepare(base, lambda b: entry.inputs("full", b))
    model = base.half().requires_grad_(False)
    x = zoo.cast(entry.inputs("full", batch), torch.float16, "cuda")
    options = {"min_block_size": 1, "engine_cache_dir": f"{cache_dir}/engines",
               "runtime_cache_path": f"{cache_dir}/runtime.cache", "cuda_graph_strategy": "whole_graph_capture"}
    keep, kept = capturing(lambda gm, example_inputs: trtrtx(gm, example_inputs, options=options))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=keep, dynamic=False)
    row: dict[str, Any] = {"model": name, "batch": batch}
    with torch.inference_mode():
        with recording() as graphs:
            compiled(*x)
        for _ in range(5):
            compiled(*x)
        regions = [r for g in graphs for r in g.regions]
        row["graphs"] = len(kept)
        row["regions"] = [r.kind for r in regions]
        row["call_ms"] = median_ms(lambda: compiled(*x), iters)
        if len(kept) == 1:
            fn, example = kept[0]
            row["backend_ms"] = median_ms(lambda: fn(*example), iters)
            row["backend_type"] = type(fn).__name__
        row["engine_ms"] = zoo._bench_module().engine_ms(lambda _x: compiled(*x), None, regions, iters)
        row.update(host_marks(lambda: compiled(*x), iters))
        if len(kept) == 1:
            row.update({f"backend_{k}": v for k, v in host_marks(lambda: kept[0][0](*kept[0][1]), iters).items()})
        if events:
            row["host_events"] = top_host_events(lambda: compiled(*x), 20)
        if inductor:
            row.update(inductor_ro(model, x, iters))
    row["stats"] = {k: v for k, v in rtx_backend.stats().items() if v}
    return row


def inductor_ro(model: torch.nn.Module, x: tuple[torch.Tensor, ...], iters: int) -> dict[str, Any]:
    """Inductor with reduce-overhead's CUDA graphs: the compiled model, and the code inductor
    returned for Dynamo's graph called without Dynamo (one graph only). torch.compile does not
    hand out the callable a backend returned, so inductor is called as a backend here, through
    its entry point compile_fx (private; the probe's only private API), with the config that
    mode="reduce-overhead" sets."""
    from torch._inductor.compile_fx import compile_fx

    keep, kept = capturing(  # with the config that "reduce-overhead" sets
        lambda gm, example_inputs: compile_fx(gm, example_inputs, config_patches={"triton.cudagraphs": True}))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=keep, dynamic=False)
    row: dict[str, Any] = {}
    with torch.inference_mode():
        for _ in range(5):
            compiled(*x)
        row["inductor_ro_ms"] = median_ms(lambda: compiled(*x), iters)
        if len(kept) == 1:
            fn, example = kept[0]
            for _ in range(3):
                fn(*example)
            row["inductor_ro_backend_ms"] = median_ms(lambda: fn(*example), iters)
    row["inductor_graphs"] = len(kept)
    return row


NOTE = ("Each model alone in one process (bench/probes/call_overhead.py), FP16, trtrtx with native CUDA graphs "
        "and lowered whole (one region). call: the compiled model; backend: what the backend returned, called "
        "without Dynamo on the graph's example inputs; engine: the region's executor alone; inductor-ro: inductor "
        "with mode='reduce-overhead', through Dynamo and without it (CUDA-event medians of {iters} calls). "
        "engine / inductor-ro backend compares the same ops, each without Dynamo's frame. Host microseconds "
        "(medians): from the call's start to the engine's enqueue, through Dynamo and without it.")


def table(rows: list[dict[str, Any]]) -> str:
    def ms(row: dict[str, Any], key: str) -> str:
        return f"{row[key]:.3f}" if isinstance(row.get(key), float) else "-"

    lines = ["| model | batch | call ms | backend ms | engine ms | inductor-ro ms | inductor-ro backend ms "
             "| engine / inductor-ro backend | to enqueue us (without Dynamo) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | - | {row['error'][:120]} |  |  |  |  |  |  |")
            continue
        ratio = (f"{row['engine_ms'] / row['inductor_ro_backend_ms']:.2f}"
                 if row.get("engine_ms") and row.get("inductor_ro_backend_ms") else "-")
        enqueue = (f"{row['to_enqueue_us']:.0f} ({row.get('backend_to_enqueue_us', 0):.0f})"
                   if "to_enqueue_us" in row else "-")
        lines.append(f"| {row['model']} | {row['batch']} | {ms(row, 'call_ms')} | {ms(row, 'backend_ms')} "
                     f"| {ms(row, 'engine_ms')} | {ms(row, 'inductor_ro_ms')} | {ms(row, 'inductor_ro_backend_ms')} "
                     f"| {ratio} | {enqueue} |")
    return "\n".join(lines)


def save(rows: list[dict[str, Any]], folder: Path, iters: int, kind: str) -> Path:
    bench = zoo._bench_module()
    env = zoo._environment()
    stem = folder / bench.result_name(env, kind)
    note = NOTE.format(iters=iters)
    stem.with_name(stem.name + ".json").write_text(json.dumps({"env": env, "note": note, "rows": rows}, indent=1))
    stem.with_name(stem.name + ".md").write_text(
        f"# {stem.name}\n\n```\n{json.dumps(env, indent=1)}\n```\n\n{note}\n\n{table(rows)}\n")
    return stem


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="hf-bert,tv-resnet50")
    parser.add_argument("--batch", type=int, default=0, help="0: the zoo's large batch")
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--inductor", action="store_true")
    parser.add_argument("--events", action="store_true", help="print torch.profiler's busiest host events")
    parser.add_argument("--out", default="", help="a JSON file for the rows")
    parser.add_argument("--save", default="", help="a folder for the dated result (.json and .md)")
    parser.add_argument("--kind", default="call-overhead",
                        help="the saved result's kind, after its date, GPU and version (letters and dashes)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("call_overhead: needs a CUDA GPU")
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as cache_dir:
        for name in args.models.split(","):
            entry = zoo.ZOO[name]
            batch = args.batch or (zoo.LLM_BATCHES if name == "hf-llama-gqa" else zoo.BATCHES[entry.source])[-1]
            try:
                row = probe(name, batch, args.iters, args.inductor, cache_dir, args.events)
            except Exception as exc:  # one model's failure is a result too
                row = {"model": name, "error": f"{type(exc).__name__}: {exc}"[:500]}
            events = row.pop("host_events", [])
            print(f"== {name}: {json.dumps(row)}", flush=True)
            print("\n".join(events), flush=True)
            rows.append(row)
            if args.save:  # after every model: a run cut short keeps what it measured
                stem = save(rows, Path(args.save), args.iters, args.kind)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    if args.save:
        print(f"saved {stem}.json and .md")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
