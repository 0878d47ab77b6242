"""The benchmark tables of the README and docs/performance.md, made from bench/results/*.json.

    python bench/report.py            # print the tables
    python bench/report.py --write    # put them into README.md and docs/performance.md
    python bench/report.py --check    # exit 1 when those files are not what the results say

Each table sits between `<!-- report:NAME -->` and `<!-- /report -->` in its file, so the
numbers in the docs are always the ones in the saved results. A result file is named
<date>-<gpu>-<TensorRT-RTX version>-<kind> (bench.py's --tag is the kind); the README's table
takes, per model, batch and dtype, the latest result of the TensorRT-RTX version that
Torch-TensorRT-RTX runs on (the like-for-like peer).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
PEERS = (("torch_tensorrt", "Torch-TensorRT-RTX"), ("inductor-ro", "inductor reduce-overhead"), ("inductor", "inductor"))
MODELS = {"mlp-4x4096": "MLP 4x4096", "resnet18": "ResNet-18", "resnet50": "ResNet-50",
          "encoder-6x768": "Encoder 6x768, seq 256", "conv3d": "conv3d"}
STARTS = {"cold": "cold (no cache)", "warm": "warm (engine, graph and runtime caches)",
          "warm_engine_cache_only": "engine cache only", "warm_no_runtime_cache": "without the runtime cache"}



def _env(result: dict) -> dict:
    """A result's environment record ("env" in the bench's files, "environment" in some)."""
    return result.get("env") or result.get("environment") or {}

def load(results: Path = RESULTS) -> list[tuple[str, dict[str, Any]]]:
    """(file stem, result) of every saved result, oldest first (by date, then name)."""
    files = sorted(results.glob("*.json"), key=lambda p: (_env(json.loads(p.read_text())).get("date", ""), p.name))
    return [(p.stem, json.loads(p.read_text())) for p in files if not p.stem.endswith("-smoke")]


def version(result: dict[str, Any]) -> str:
    return ".".join(str(_env(result).get("tensorrt_rtx") or "none").split(".")[:3])


def wrong(config: dict[str, Any], backend: str) -> bool:
    """Whether a backend's result is far off FP32 eager: an error above 0.1 and ten times the
    largest error of the peers on the same model (eager's where no peer ran); not judged where
    nothing ran beside it. bench.py marks its tables with it too."""
    rows = config["backends"]
    err = rows.get(backend, {}).get("max_err_vs_fp32")
    others = [rows[p]["max_err_vs_fp32"] for p, _ in PEERS if "max_err_vs_fp32" in rows.get(p, {})]
    if not others and "max_err_vs_fp32" in rows.get("eager", {}):
        others = [rows["eager"]["max_err_vs_fp32"]]
    if not others:  # nothing ran beside it (one backend's cold compile): FP16's own error is unknown
        return False
    return err is not None and err > max(0.1, 10 * max(others))


def _best(config: dict[str, Any]) -> tuple[float, str] | None:
    """trtrtx's better strategy (median ms, backend), wrong results left out."""
    rows = config["backends"]
    ours = [(rows[k]["median_ms"], k) for k in ("trtrtx", "trtrtx-cg")
            if "median_ms" in rows.get(k, {}) and not wrong(config, k)]
    return min(ours) if ours else None


def _ratio(config: dict[str, Any], peer: str, best: float) -> str:
    row = config["backends"].get(peer, {})
    return f"{best / row['median_ms']:.2f}" if "median_ms" in row else "-"


def _label(config: dict[str, Any]) -> tuple[str, str, str]:
    return MODELS.get(config["model"], config["model"]), str(config["shape"][0]), config["dtype"].replace("float", "fp")


def _is_zoo(stem: str) -> bool:
    """A result of bench/zoo.py (`...-zoo`, or a kind of it: `...-zoo-cold`)."""
    return stem.endswith("-zoo") or "-zoo-" in stem


def readme_table(results: list[tuple[str, dict[str, Any]]]) -> str:
    """Per model, batch and dtype: the latest result of the version with the most peers."""
    # the bench models with the peer measured beside them (the zoo has its own page, docs/zoo.md)
    with_peer = [(stem, r) for stem, r in results
                 if "torch_tensorrt" in r.get("backends", []) and not _is_zoo(stem)]
    if not with_peer:
        return "(no saved result with Torch-TensorRT-RTX)"
    chosen = version(with_peer[-1][1])
    latest: dict[tuple[str, int, str], tuple[str, dict[str, Any], dict[str, Any]]] = {}
    for stem, r in with_peer:
        if version(r) == chosen:
            for c in r["configs"]:
                latest[(c["model"], c["shape"][0], c["dtype"])] = (stem, r, c)
    order = list(MODELS)
    lines = [f"Median latency, best trtrtx strategy over each peer (below 1: trtrtx is faster); "
             f"{with_peer[-1][1]['env'].get('gpu', '?')}, TensorRT-RTX {chosen}:", "",
             "| model | batch | dtype | trtrtx ms | vs " + " | vs ".join(name for _, name in PEERS) + " | result |",
             "|---|---|---|---|" + "---|" * len(PEERS) + "---|"]
    for key in sorted(latest, key=lambda k: (order.index(k[0]) if k[0] in order else 99, k[2], k[1])):
        stem, _r, c = latest[key]
        best = _best(c)
        model, batch, dtype = _label(c)
        if best is None:
            cells = ["wrong results"] + ["-"] * len(PEERS)
        else:
            cells = [f"{best[0]:.3f}"] + [_ratio(c, p, best[0]) for p, _ in PEERS]
        lines.append(f"| {model} | {batch} | {dtype} | " + " | ".join(cells) + f" | `{stem.split('-', 3)[-1]}` |")
    return "\n".join(lines)


def models_table(result: dict[str, Any]) -> str:
    peers = [(p, n) for p, n in PEERS if p in result.get("backends", [])]
    head = ["model", "batch", "dtype", "trtrtx / trtrtx-cg ms", *(f"vs {n}" for _, n in peers), "cold compile s, trtrtx (or as named)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in result["configs"]:
        rows = c["backends"]
        model, batch, dtype = _label(c)
        ms = " / ".join(f"{rows[k]['median_ms']:.3f}{' WRONG' if wrong(c, k) else ''}" if "median_ms" in rows.get(k, {})
                        else "-" for k in ("trtrtx", "trtrtx-cg"))
        best = _best(c)
        ratios = [_ratio(c, p, best[0]) if best else "-" for p, _ in peers]
        cold = rows.get("trtrtx", {}).get("cold_compile_s")
        others = ", ".join(f"{b} {r['cold_compile_s']:.2f}" for b, r in rows.items() if "cold_compile_s" in r)
        # (a run of other backends alone, such as inductor's cold compiles: theirs, named)
        cells = [model, batch, dtype, ms, *ratios, f"{cold:.2f}" if cold is not None else others or "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def starts_table(result: dict[str, Any]) -> str:
    lines = ["| start | first result s (median) | samples |", "|---|---|---|"]
    for kind, row in result["fresh_process"].items():
        samples = row.get("first_result_samples_s", [round(row["first_result_s"], 3)])
        lines.append(f"| {STARTS.get(kind, kind)} | {row['first_result_s']:.2f} | {', '.join(map(str, samples))} |")
    return "\n".join(lines)


def overhead_table(result: dict[str, Any]) -> str:
    lines = ["| cuda_graph_strategy | call us | TensorRT-RTX enqueue us | Dynamo's floor us | trtrtx's own us |",
             "|---|---|---|---|---|"]
    def us(row: dict[str, Any], key: str) -> str:
        return f"{row[key]:.1f}" if key in row else "-"

    for strategy, row in result["overhead"].items():
        lines.append(f"| {strategy} | {us(row, 'call_us')} | {us(row, 'enqueue_us')} | {us(row, 'dynamo_floor_us')} | "
                     f"{us(row, 'ours_us')} |")
    return "\n".join(lines)


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def sweep_table(result: dict[str, Any]) -> str:
    sweep = result["dynamic_sweep"]
    lines = ["| backend | compiled graphs | recompiles | graph breaks | engine builds | first call s | later calls s (max) |",
             "|---|---|---|---|---|---|---|"]
    for backend, row in sweep.items():
        if backend == "lengths" or not isinstance(row, dict):
            continue
        calls = [p["first_call_s"] for p in row.get("per_length", [])]
        if not calls:
            error = (str(row.get("error") or "?").strip().splitlines() or ["?"])[0][:80]
            lines.append(f"| {backend} | failed: {error} | | | | | |")
            continue
        lines.append(f"| {backend} | {row.get('compiled_graphs', '-')} | {row.get('recompiles', '-')} | "
                     f"{row.get('graph_breaks', '-')} | {_or_dash(row.get('engine_builds'))} | {calls[0]:.2f} | "
                     f"{max(calls[1:], default=0):.3f} |")
    return "\n".join(lines)


def performance_tables(results: list[tuple[str, dict[str, Any]]]) -> str:
    """One section per saved result, newest first."""
    out = []
    for stem, r in reversed(results):
        env = _env(r)
        driver = str(env.get("driver") or "-").splitlines()[0]
        out.append(f"### `{stem}`\n\n{env.get('gpu', 'cpu')}, driver {driver}, TensorRT-RTX "
                   f"{env.get('tensorrt_rtx')}, torch {env.get('torch')}"
                   + (f", Torch-TensorRT-RTX {env['torch_tensorrt']}" if env.get("torch_tensorrt") else "") + ".")
        if r.get("configs"):
            out.append(models_table(r))
        if r.get("fresh_process"):
            out.append("Fresh-process starts (ResNet-18 FP16, to the first result):\n\n" + starts_table(r))
        if r.get("overhead"):
            out.append("Host time per call (one-engine FP16 MLP):\n\n" + overhead_table(r))
        if r.get("dynamic_sweep"):
            lengths = r["dynamic_sweep"].get("lengths", [])
            out.append(f"Dynamic sequence lengths {lengths} (encoder):\n\n" + sweep_table(r))
        if r.get("weight_check"):
            out.append("The weight check (weights=\"checked\"):\n\n" + weight_check_table(r["weight_check"]))
        if r.get("parts"):
            out.append(rest_tables(r["parts"]))
        if r.get("note") and r.get("rows"):  # a probe's result (bench/probes): what it measured, and its rows
            out.append(f"{r['note']} Rows: [`{stem}.md`](../bench/results/{stem}.md).")
    return "\n\n".join(out)


def weight_check_table(rows: dict[str, Any]) -> str:
    lines = ["| model | weights | host time of the check, us | call ms, checked / frozen |", "|---|---|---|---|"]
    for name, row in rows.items():
        call = (f"{row['checked_ms']:.3f} / {row['frozen_ms']:.3f}" if "checked_ms" in row else "-")
        lines.append(f"| {name} | {row.get('weights', '-')} | {row.get('check_us', '-')} | {call} |")
    return "\n".join(lines)


def rest_tables(parts: dict[str, Any]) -> str:
    """bench/rest.py: median ms (cold compile s) per backend, per part."""
    out = []
    for part, configs in parts.items():
        names = list(dict.fromkeys(b for c in configs for b in c.get("backends", {})))
        lines = [f"{part} (bench/rest.py; median ms, cold compile s in brackets):", "",
                 "| model | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for c in configs:
            cells = []
            for b in names:
                row = c["backends"].get(b, {})
                cells.append("error" if "error" in row else
                             f"{row['median_ms']:.3f} ({row.get('cold_compile_s', 0):.1f})" if "median_ms" in row else "-")
            lines.append(f"| {c['model']} | " + " | ".join(cells) + " |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


TABLES = {"readme": readme_table, "performance": performance_tables}
FILES = {ROOT / "README.md": ("readme",), ROOT / "docs" / "performance.md": ("readme", "performance")}
_BLOCK = re.compile(r"(<!-- report:(?P<name>\w+) -->\n)(?:.*?\n)??(<!-- /report -->)", re.S)


def fill(text: str, results: list[tuple[str, dict[str, Any]]]) -> str:
    """`text` with every report block replaced by the current table."""
    return _BLOCK.sub(lambda m: m.group(1) + TABLES[m["name"]](results) + "\n" + m.group(3), text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="update README.md and docs/performance.md")
    parser.add_argument("--check", action="store_true", help="exit 1 when they are out of date")
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args()
    results = load(Path(args.results))
    if not (args.write or args.check):
        print(readme_table(results), "\n", performance_tables(results), sep="\n")
        return
    stale = []
    for path in FILES:
        if not path.exists():
            continue
        text = path.read_text()
        new = fill(text, results)
        if new != text:
            stale.append(str(path.relative_to(ROOT)))
            if args.write:
                path.write_text(new)
    if args.check and stale:
        sys.exit(f"out of date with bench/results: {', '.join(stale)} (run python bench/report.py --write)")
    print("updated: " + (", ".join(stale) or "nothing") if args.write else "up to date")


if __name__ == "__main__":
    main()
