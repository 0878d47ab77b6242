"""The benchmark tables of the README and docs/ (performance, zoo, rest, weights, deploy), made from bench/results/*.json.

    python bench/report.py            # print the tables (or name some: python bench/report.py zoo_gpu)
    python bench/report.py --write    # put them into README.md and the docs pages
    python bench/report.py --check    # exit 1 when those files are not what the results say

Each table sits between `<!-- report:NAME -->` and `<!-- /report -->` in its file, so the
numbers in the docs are always the ones in the saved results. A result file is named
<date>-<gpu>-<TensorRT-RTX version>-<kind> (bench.py's --tag is the kind); the README's table
takes, per model, batch and dtype, the latest result of the TensorRT-RTX version that
Torch-TensorRT-RTX runs on (the like-for-like peer). Each other table says above it which GPU,
versions and result files it was made from.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
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


README_DTYPES = ("fp16", "float16", "torch.float16")


def readme_table(results: list[tuple[str, dict[str, Any]]], dtypes: tuple[str, ...] = README_DTYPES) -> str:
    """Per model, batch and dtype (FP16 in the README, every dtype in `bench_table`): the latest
    result of the version with the most peers."""
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
                if c["dtype"] in dtypes:
                    latest[(c["model"], c["shape"][0], c["dtype"])] = (stem, r, c)
    order = list(MODELS)
    which = "in FP16 (what RTX GPUs run best; FP32 in docs/performance.md)" if dtypes == README_DTYPES else ""
    lines = [f"Median latency {which}, best trtrtx strategy "
             f"over each peer (below 1: trtrtx is faster); {with_peer[-1][1]['env'].get('gpu', '?')}, "
             f"TensorRT-RTX {chosen}:".replace("latency , ", "latency, "), "",
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


# ---- the tables of docs/performance.md and docs/zoo.md -------------------------------------------
# The zoo's tables and `fastest` read the result kinds they name (the <kind> of
# <date>-<device>-<version>-<kind>); where two results hold the same configuration, the later date
# wins, and on the same date the kind named later in the list. `starts` and `overhead` take every
# saved run, which ran on hosts of different speed, and give medians and ranges.

ZOO_MODELS = {
    "hf-bert": "BERT-base (seq 128)", "hf-gpt2": "GPT-2 (seq 128)", "hf-t5-encoder": "T5-small encoder (seq 128)",
    "hf-llama-gqa": "Llama 3.2 1B shape, GQA (seq 128)", "tv-resnet50": "ResNet-50", "tv-mobilenet_v3_large": "MobileNetV3-L",
    "tv-efficientnet_b0": "EfficientNet-B0", "tv-convnext_tiny": "ConvNeXt-T", "tv-vit_b_16": "ViT-B/16",
    "tv-swin_t": "Swin-T", "timm-deit_small_patch16_224": "DeiT-S (timm)",
}
_STEM = re.compile(r"\d{4}-\d\d-\d\d-(?P<device>.+?)-(?P<version>\d+\.\d+\.\d+)-(?P<kind>[a-z][a-z-]*)")


def kind(stem: str) -> str:
    """The kind of a result file (`zoo`, `zoo-small-batch`, ...); "" for a name without one."""
    m = _STEM.fullmatch(stem)
    return m["kind"] if m else ""


def _zoo_name(model: str) -> str:
    return ZOO_MODELS.get(model, model)


def _zoo_order(model: str) -> int:
    return list(ZOO_MODELS).index(model) if model in ZOO_MODELS else len(ZOO_MODELS)


def _of_kinds(results: list[tuple[str, dict[str, Any]]], kinds: tuple[str, ...],
              gpu: bool = True) -> list[tuple[str, dict[str, Any]]]:
    """The results of these kinds (on a GPU, or on the CPU), oldest first: by date, then by the
    kind's place in `kinds`."""
    chosen = [(s, r) for s, r in results if kind(s) in kinds and bool(_env(r).get("gpu")) == gpu]
    return sorted(chosen, key=lambda sr: (_env(sr[1]).get("date", ""), kinds.index(kind(sr[0]))))


def _vkey(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".") if x.isdigit())


def _newest_version(results: list[tuple[str, dict[str, Any]]]) -> str:
    return max((version(r) for _, r in results), key=_vkey)


def _gpu(name: str) -> str:
    return name if "RTX" in name else f"{name} (not an RTX GPU)"


def measured(used: list[tuple[str, dict[str, Any]]], what: str, peer: bool = False) -> str:
    """The line above a table: the GPU, the versions (Torch-TensorRT-RTX's with `peer`) and the
    files it was made from."""
    envs = [_env(r) for _, r in used]
    gpus = sorted({_gpu(e["gpu"]) if e.get("gpu") else "CPU" for e in envs})
    versions = sorted({version(r) for _, r in used}, key=_vkey)
    torches = sorted({str(e.get("torch")) for e in envs if e.get("torch")})
    peers = sorted({str(e["torch_tensorrt"]) for e in envs if e.get("torch_tensorrt")}) if peer else []
    files = ", ".join(f"`{s}`" for s, _ in used)
    return (f"{', '.join(gpus)}, TensorRT-RTX {', '.join(versions)}, torch {', '.join(torches)}"
            + (f", Torch-TensorRT-RTX {', '.join(peers)}" if peers else "") + f"; {what} (bench/results: {files}):")


def _latest(used: list[tuple[str, dict[str, Any]]], rows: Any, key: Any
            ) -> tuple[dict[Any, tuple[str, dict[str, Any]]], list[tuple[str, dict[str, Any]]]]:
    """Per `key(row)`, the last of the `rows(result)` of `used` (oldest first), with its file's
    stem; and the results those rows come from."""
    latest: dict[Any, tuple[str, dict[str, Any]]] = {}
    for stem, r in used:
        for row in rows(r):
            latest[key(row)] = (stem, row)
    stems = {s for s, _ in latest.values()}
    return latest, [(s, r) for s, r in used if s in stems]


def _latest_configs(used: list[tuple[str, dict[str, Any]]], wanted: Any = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Per (model, batch, dtype), the last config of `used` that `wanted` accepts; and the files used."""
    latest, files = _latest(used, lambda r: [c for c in r.get("configs", []) if wanted is None or wanted(c)],
                            lambda c: (c["model"], c["shape"][0], c["dtype"]))
    return [c for _, c in latest.values()], [s for s, _ in files]


def _ms(row: dict[str, Any]) -> str:
    return f"{row['median_ms']:.3f}" if "median_ms" in row else ("fails" if "error" in row else "-")


def _geomean(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.geometric_mean(values):.2f} ({len(values)}; {sum(v <= 1.0 for v in values)} at most 1.0)"


def _ours(config: dict[str, Any]) -> tuple[float, str] | None:
    """trtrtx's better strategy where its regions all ran on TensorRT-RTX (else None)."""
    best = _best(config)
    if best is None or config["backends"][best[1]].get("regions_in_pytorch"):
        return None
    return best


def _by_model(items: dict[tuple[str, int], Any]) -> list[tuple[str, Any, Any]]:
    """(model, its large-batch item or None, its batch-1 item or None), in the zoo's order."""
    models = sorted({m for m, _ in items}, key=_zoo_order)
    return [(m, next((v for (n, b), v in items.items() if n == m and b != 1), None), items.get((m, 1)))
            for m in models]


def zoo_gpu_table(results: list[tuple[str, dict[str, Any]]]) -> str:
    """The zoo at real size against eager and inductor: the newest TensorRT-RTX version measured
    beside inductor reduce-overhead, large batch and batch 1."""
    used = _of_kinds(results, ("zoo", "zoo-small-batch"))
    used = [(s, r) for s, r in used if any("inductor-ro" in c["backends"] for c in r.get("configs", []))]
    if not used:
        return "(no saved zoo result beside inductor)"
    chosen = _newest_version(used)
    configs, stems = _latest_configs([(s, r) for s, r in used if version(r) == chosen],
                                     lambda c: "median_ms" in c["backends"].get("inductor-ro", {}))
    lines = [measured([(s, r) for s, r in used if s in stems], "FP16, median ms; trtrtx: its faster strategy, "
                      "without or with TensorRT-RTX's CUDA graphs (CG); ratio: best trtrtx / inductor reduce-overhead, "
                      "below 1.0 trtrtx is faster (`in PyTorch`: a region of trtrtx's ran in PyTorch)"), "",
             "| model | batch | eager | inductor | inductor reduce-overhead | trtrtx, best | ratio | engine alone "
             "| batch | inductor reduce-overhead | trtrtx, no CG | trtrtx, CG | ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios: dict[bool, list[float]] = {False: [], True: []}

    def cells(c: dict[str, Any] | None, small: bool) -> list[str]:
        if c is None:
            return ["-"] * (5 if small else 7)
        rows = c["backends"]
        best = _ours(c)
        ratio = "-"
        if best is not None:
            ratios[small].append(best[0] / rows["inductor-ro"]["median_ms"])
            ratio = f"{ratios[small][-1]:.2f}"
        elif _best(c) is not None:
            ratio = "in PyTorch"
        if small:
            return [str(c["shape"][0]), *(_ms(rows.get(b, {})) for b in ("inductor-ro", "trtrtx", "trtrtx-cg")), ratio]
        engine = f"{rows[best[1]]['engine_ms']:.3f}" if best and "engine_ms" in rows[best[1]] else "-"
        return [str(c["shape"][0]), *(_ms(rows.get(b, {})) for b in ("eager", "inductor", "inductor-ro")),
                f"{best[0]:.3f}" if best else "-", ratio, engine]

    for model, large, small in _by_model({(c["model"], c["shape"][0]): c for c in configs}):
        lines.append(f"| {_zoo_name(model)} | " + " | ".join(cells(large, False) + cells(small, True)) + " |")
    lines.append("| geometric mean (models; at most 1.0) | | | | | | "
                 f"{_geomean(ratios[False])} | | | | | | {_geomean(ratios[True])} |")
    return "\n".join(lines)


def zoo_peer_table(results: list[tuple[str, dict[str, Any]]]) -> str:
    """The zoo beside Torch-TensorRT-RTX, on the TensorRT-RTX version it runs on."""
    used = [(s, r) for s, r in _of_kinds(results, ("zoo",))
            if any("torch_tensorrt" in c["backends"] for c in r.get("configs", []))]
    if not used:
        return "(no saved zoo result with Torch-TensorRT-RTX)"
    chosen = _newest_version(used)
    configs, stems = _latest_configs([(s, r) for s, r in used if version(r) == chosen],
                                     lambda c: "torch_tensorrt" in c["backends"])
    lines = [measured([(s, r) for s, r in used if s in stems], "FP16, median ms; trtrtx: its faster strategy; "
                      "ratio: trtrtx / Torch-TensorRT-RTX", peer=True), "",
             "| model | batch | Torch-TensorRT-RTX | trtrtx | ratio | batch | Torch-TensorRT-RTX | trtrtx | ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    ratios: dict[bool, list[float]] = {False: [], True: []}

    def cells(c: dict[str, Any] | None, small: bool) -> list[str]:
        if c is None:
            return ["-"] * 4
        peer = c["backends"]["torch_tensorrt"]
        best = _ours(c)
        ours = _best(c)
        mine = f"{best[0]:.3f}" if best else f"{ours[0]:.3f} (in PyTorch)" if ours else "-"
        ratio = "-"
        if best is not None and "median_ms" in peer:
            ratios[small].append(best[0] / peer["median_ms"])
            ratio = f"{ratios[small][-1]:.2f}"
        return [str(c["shape"][0]), "fails to compile" if "error" in peer else _ms(peer), mine, ratio]

    for model, large, small in _by_model({(c["model"], c["shape"][0]): c for c in configs}):
        lines.append(f"| {_zoo_name(model)} | " + " | ".join(cells(large, False) + cells(small, True)) + " |")
    lines.append(f"| geometric mean (models; at most 1.0) | | | | {_geomean(ratios[False])} | | | | "
                 f"{_geomean(ratios[True])} |")
    return "\n".join(lines)


COLD_KINDS = ("zoo-cold-inductor", "zoo-cold-trtrtx", "zoo-cold-trtrtx-threads", "zoo-cold-trtrtx-bg")


def zoo_cold_table(results: list[tuple[str, dict[str, Any]]]) -> str:
    """Cold compiles: each model and backend alone in a fresh process with empty caches."""
    used = _of_kinds(results, COLD_KINDS)
    if not used:
        return "(no saved cold-compile result)"
    chosen = _newest_version(used)
    cold: dict[tuple[str, int], dict[str, tuple[str, dict[str, Any]]]] = {}
    for stem, r in used:
        if version(r) != chosen:
            continue
        for c in r.get("configs", []):
            ran = {b: row for b, row in c["backends"].items() if "cold_compile_s" in row}
            if len(ran) == 1:  # one backend in its process: nothing it ran was warmed by another
                (b, row), = ran.items()
                cold.setdefault((c["model"], c["shape"][0]), {})[b] = (stem, row)
    stems = {s for per in cold.values() for s, _ in per.values()}
    lines = [measured([(s, r) for s, r in used if s in stems], "FP16, large batch, seconds from the first call's "
                      "start to its result, one cold run each; export and build: trtrtx's stages"), "",
             "| model | batch | trtrtx | export | build | inductor | trtrtx / inductor "
             "| `engine_build=\"background\"`: first result | engines in place |",
             "|---|---|---|---|---|---|---|---|---|"]

    def seconds(row: dict[str, Any] | None, key: str = "cold_compile_s") -> str:
        return f"{row[key]:.1f}" if row and key in row else "-"

    def order(key: tuple[str, int]) -> float:
        per = cold[key]
        if "trtrtx" in per and "inductor" in per:
            return per["trtrtx"][1]["cold_compile_s"] / per["inductor"][1]["cold_compile_s"]
        return 99.0

    for key in sorted(cold, key=order):
        per = {b: row for b, (_, row) in cold[key].items()}
        ours, theirs, bg = per.get("trtrtx"), per.get("inductor"), per.get("trtrtx-bg")
        stages = (ours or {}).get("stage_s", {})
        ratio = f"{ours['cold_compile_s'] / theirs['cold_compile_s']:.2f}" if ours and theirs else "-"
        lines.append(f"| {_zoo_name(key[0])} | {key[1]} | {seconds(ours)} | "
                     + " | ".join(f"{stages[s]:.1f}" if s in stages else "-" for s in ("export", "build"))
                     + f" | {seconds(theirs)} | {ratio} | {seconds(bg)} | {seconds(bg, 'engines_ready_s')} |")
    return "\n".join(lines)


def zoo_calls_table(results: list[tuple[str, dict[str, Any]]]) -> str:
    """bench/probes/call_overhead.py: a call split into Dynamo's frame, trtrtx's own code and the
    engine, beside inductor reduce-overhead's code for the same graph."""
    used = _of_kinds(results, ("call-overhead", "call-overhead-small-batch"))
    latest, files = _latest(
        used, lambda r: [row for row in r.get("rows", []) if "engine_ms" in row and "inductor_ro_backend_ms" in row],
        lambda row: (row["model"], row["batch"]))
    if not latest:
        return "(no saved call-overhead result)"
    lines = [measured(files, "FP16, TensorRT-RTX's CUDA graphs, each model one "
                      "region, CUDA-event medians of 100 calls, ms; without Dynamo: the callable the backend "
                      "returned, called directly"), "",
             "| model | batch | trtrtx call | without Dynamo | engine alone | inductor reduce-overhead call "
             "| without Dynamo | engine / inductor's code |", "|---|---|---|---|---|---|---|---|"]
    for key in sorted(latest, key=lambda k: (k[1] == 1, _zoo_order(k[0]))):
        row = latest[key][1]
        cells = [f"{row[k]:.3f}" for k in ("call_ms", "backend_ms", "engine_ms", "inductor_ro_ms", "inductor_ro_backend_ms")]
        lines.append(f"| {_zoo_name(key[0])} | {key[1]} | " + " | ".join(cells)
                     + f" | {row['engine_ms'] / row['inductor_ro_backend_ms']:.2f} |")
    return "\n".join(lines)


def fastest_table(results: list[tuple[str, dict[str, Any]]]) -> str:
    """bench/rest.py: `fastest=True` (with rest="inductor" and CUDA graphs) against inductor reduce-overhead."""
    used = _of_kinds(results, ("rest-zoo-fastest-all", "rest-zoo-fastest-small"))
    latest, files = _latest(
        used, lambda r: [c for c in r.get("parts", {}).get("zoo", [])
                         if all("median_ms" in c["backends"].get(b, {}) for b in ("trtrtx-fastest-cg", "inductor-ro"))],
        lambda c: (c["model"], c["shape"][0][0]))
    if not latest:
        return "(no saved result of fastest)"
    lines = [measured(files, "FP16, median ms; fastest: `options={\"rest\": "
                      "\"inductor\", \"fastest\": True, \"cuda_graph_strategy\": \"whole_graph_capture\"}`; ratio: "
                      "fastest / inductor reduce-overhead; cold: cold compile s, inductor reduce-overhead / fastest"), "",
             "| model | batch | inductor reduce-overhead | fastest | ratio | kept | cold "
             "| batch | inductor reduce-overhead | fastest | ratio | kept | cold |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios: dict[bool, list[float]] = {False: [], True: []}

    def cells(item: tuple[str, dict[str, Any]] | None, small: bool) -> list[str]:
        if item is None:
            return ["-"] * 6
        c = item[1]
        ro, ours = c["backends"]["inductor-ro"], c["backends"]["trtrtx-fastest-cg"]
        ratios[small].append(ours["median_ms"] / ro["median_ms"])
        kept = ("inductor (whole graph)" if ours.get("rest_inductor_whole_graphs") else
                "inductor" if ours.get("regions_on_inductor") else "TensorRT-RTX")
        return [str(c["shape"][0][0]), f"{ro['median_ms']:.3f}", f"{ours['median_ms']:.3f}", f"{ratios[small][-1]:.2f}",
                kept, f"{ro['cold_compile_s']:.0f} / {ours['cold_compile_s']:.0f}"]

    for model, large, small in _by_model(latest):
        lines.append(f"| {_zoo_name(model)} | " + " | ".join(cells(large, False) + cells(small, True)) + " |")
    lines.append(f"| geometric mean (models; at most 1.0) | | | | {_geomean(ratios[False])} | | | | | | "
                 f"{_geomean(ratios[True])} | | |")
    return "\n".join(lines)


def _spread(values: list[float], digits: int) -> tuple[str, str]:
    """(median, "min-max") of the values."""
    return f"{statistics.median(values):.{digits}f}", f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def starts_table(results: list[tuple[str, dict[str, Any]]]) -> str:
    """Fresh-process starts (bench.py --parts starts), every saved round, per TensorRT-RTX version."""
    used = [(s, r) for s, r in results if r.get("fresh_process") and _env(r).get("gpu")]
    if not used:
        return "(no saved start result)"
    lines = [measured(used, "ResNet-18 FP16 in a fresh process, seconds from the start to the first result; "
                      "each round in a new cache directory, on hosts of different speed"), "",
             "| start | TensorRT-RTX | median s | range s | rounds |", "|---|---|---|---|---|"]
    for start, label in STARTS.items():
        for v in sorted({version(r) for _, r in used}, key=_vkey):
            samples = [x for _, r in used if version(r) == v and start in r["fresh_process"]
                       for x in r["fresh_process"][start].get("first_result_samples_s",
                                                              [r["fresh_process"][start]["first_result_s"]])]
            if samples:
                median, span = _spread(samples, 2)
                lines.append(f"| {label} | {v} | {median} | {span} | {len(samples)} |")
    return "\n".join(lines)


def overhead_table(results: list[tuple[str, dict[str, Any]]]) -> str:
    """Host time per call (bench.py --parts overhead), every saved run, per TensorRT-RTX version."""
    used = [(s, r) for s, r in results if r.get("overhead") and _env(r).get("gpu")]
    if not used:
        return "(no saved overhead result)"
    keys = (("call_us", "call"), ("enqueue_us", "TensorRT-RTX's enqueue"), ("dynamo_floor_us", "Dynamo's floor"),
            ("ours_us", "trtrtx's own"))
    lines = [measured(used, "a one-engine FP16 MLP, host microseconds per call, medians of the saved runs "
                      "(range in brackets), on hosts of different speed"), "",
             "| TensorRT-RTX | cuda_graph_strategy | runs | " + " | ".join(n for _, n in keys) + " |",
             "|---|---|---|" + "---|" * len(keys)]
    for v in sorted({version(r) for _, r in used}, key=_vkey):
        runs = [r["overhead"] for _, r in used if version(r) == v]
        for strategy in dict.fromkeys(s for run in runs for s in run):
            cells = []
            for key, _ in keys:
                values = [run[strategy][key] for run in runs if key in run.get(strategy, {})]
                cells.append("{} ({})".format(*_spread(values, 1)) if len(values) > 1 else
                             f"{values[0]:.1f}" if values else "-")
            lines.append(f"| {v} | {strategy} | {sum(strategy in run for run in runs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


_TARGET_SETS = {"[[7, 5]]": "Turing", "[[8, 6]]": "Ampere", "[[7, 5], [8, 6], [8, 9], [12, 0]]": "all four"}


def zoo_cpu_table(results: list[tuple[str, dict[str, Any]]]) -> str:
    """bench/zoo.py --cpu: per model, dtype and target set, the compute nodes lowered, and problems."""
    used = _of_kinds(results, ("zoo",), gpu=False)
    if not used:
        return "(no saved CPU zoo result)"
    stem, r = used[-1]
    rows = r["rows"]
    columns = list(dict.fromkeys((row["dtype"], json.dumps(row["targets"])) for row in rows))
    problems = sum(bool(row.get("problems")) for row in rows)
    seconds = sum(row.get("seconds", 0) for row in rows)
    lines = [measured([(stem, r)], f"tiny configurations, no GPU: engines built ahead of time, regions run in "
                      f"ONNX Runtime; {len(rows)} runs in {seconds:.0f} s, {problems} with a problem; "
                      "cells: compute nodes lowered / all, and the regions"), "",
             "| model | " + " | ".join(f"{d.replace('float', 'fp')}, {_TARGET_SETS.get(t, t)}" for d, t in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for model in dict.fromkeys(row["model"] for row in rows):
        cells = []
        for d, t in columns:
            row = next((x for x in rows if x["model"] == model and x["dtype"] == d and json.dumps(x["targets"]) == t), None)
            if row is None:
                cells.append("-")
                continue
            total = row.get("lowered_nodes", 0) + row.get("eager_nodes", 0)
            cell = f"{row.get('lowered_nodes', '-')}/{total}, {row.get('regions', '-')}"
            cells.append(cell + (f" ({'; '.join(row['problems'])})" if row.get("problems") else ""))
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---- the tables of docs/rest.md, docs/weights.md and docs/deploy.md -------------------------------

REST_CASES = {"rest-turing": "every GEMM kept in PyTorch (`torch_executed_ops`, as for Turing)",
              "rest-fallback": "lowering failed: the whole graph is the rest",
              "rest-zoo": "fully lowered: one region, glue around it"}


def rest_table(results: list[tuple[str, dict[str, Any]]]) -> str:
    """bench/rest.py: the graph outside the regions run in PyTorch or compiled by inductor."""
    used = _of_kinds(results, tuple(REST_CASES))
    rows = [(kind(stem), c) for stem, r in used for part in r.get("parts", {}).values() for c in part
            if "median_ms" in c["backends"].get("trtrtx-cg", {}) and "median_ms" in c["backends"].get("trtrtx-inductor-cg", {})]
    if not rows:
        return "(no saved result of bench/rest.py)"
    lines = [measured(used, "FP16, median ms, with CUDA graphs (`cuda_graph_strategy=\"whole_graph_capture\"`: "
                      "TensorRT-RTX's own per engine with the rest in PyTorch, inductor's over the whole graph with "
                      "the rest in inductor); ratio: rest in inductor / rest in PyTorch"), "",
             "| case | model | batch | rest in PyTorch | rest in inductor | ratio | inductor reduce-overhead |",
             "|---|---|---|---|---|---|---|"]
    for case, c in sorted(rows, key=lambda kc: (list(REST_CASES).index(kc[0]), _zoo_order(kc[1]["model"]))):
        b = c["backends"]
        eager, ind = b["trtrtx-cg"]["median_ms"], b["trtrtx-inductor-cg"]["median_ms"]
        lines.append(f"| {REST_CASES[case]} | {_zoo_name(c['model'])} | {c['shape'][0][0]} | {eager:.3f} | {ind:.3f} "
                     f"| {ind / eager:.2f} | {_ms(b.get('inductor-ro', {}))} |")
    return "\n".join(lines)


REFIT_MODELS = {"resnet50": "ResNet-50", "encoder-6x768": "encoder 6x768"}


def refit_table(results: list[tuple[str, dict[str, Any]]]) -> str:
    """bench/refit.py: refittable engines against engines built again, per TensorRT-RTX version."""
    used = _of_kinds(results, ("refit",))
    if not used:
        return "(no saved result of bench/refit.py)"
    lines = [measured(used, "FP16, batch 1, each model compiled from empty caches, then every weight changed "
                      "twice; a change: from the call that saw it until the engines had the new weights; "
                      "call that saw it: `-` where it waited for the update"), "",
             "| TensorRT-RTX | model | engines built | a change | cold build s | call ms | a change s "
             "| change / cold build | call that saw it ms |", "|---|---|---|---|---|---|---|---|---|"]
    for _, r in used:
        for model, runs in r.get("models", {}).items():
            for row in runs:
                stats = row.get("stats", {})
                how = ("refits" if stats.get("weight_refits") else "builds again" if stats.get("weight_rebuilds")
                       else "-")
                changes = [row[k] for k in ("change_1_s", "change_2_s") if k in row]
                calls = [row[k] for k in ("change_1_call_s", "change_2_call_s") if k in row]
                share = f"{100 * changes[-1] / row['cold_build_s']:.0f}%" if changes else "-"
                lines.append(f"| {version(r)} | {REFIT_MODELS.get(model, model)} | "
                             f"{'refittable' if row['refittable'] else 'not refittable'} | {how} | "
                             f"{row['cold_build_s']:.2f} | {row['median_ms']:.3f} | "
                             f"{', '.join(f'{x:.2f}' for x in changes) or '-'} | {share} | "
                             f"{', '.join(f'{1000 * x:.0f}' for x in calls) or '-'} |")
    return "\n".join(lines)


CHECK_MODELS = {"mlp-2x256": "MLP 2x256", "mlp-4x4096": "MLP 4x4096", "resnet50-like": "ResNet-50-like"}


def weight_check_table(results: list[tuple[str, dict[str, Any]]]) -> str:
    """bench.py --parts weights: the host time of the per-call weight check, and a whole call checked and frozen."""
    used = [(s, r) for s, r in results if r.get("weight_check") and _env(r).get("gpu")]
    if not used:
        return "(no saved weight-check result)"
    stem, r = used[-1]
    checks = {k: v for k, v in r["weight_check"].items() if "check_us" in v}
    calls = {k: v for k, v in r["weight_check"].items() if "checked_ms" in v}
    lines = [measured([(stem, r)], "host microseconds of the check per call; a whole call: "
                      "ResNet-50-like, batch 1, FP16, TensorRT-RTX's CUDA graphs, median ms"), "",
             "| model | weights | check us | call, `weights=\"checked\"` ms | call, `weights=\"frozen\"` ms |",
             "|---|---|---|---|---|"]
    for model, row in checks.items():
        call = next((v for k, v in calls.items() if k.startswith(model)), None)
        lines.append(f"| {CHECK_MODELS.get(model, model)} | {row['weights']} | {row['check_us']:.1f} | "
                     + (f"{call['checked_ms']:.3f} | {call['frozen_ms']:.3f} |" if call else "- | - |"))
    return "\n".join(lines)


def package_table(results: list[tuple[str, dict[str, Any]]]) -> str:
    """bench/package.py: a saved `.pt2` loaded in a fresh process, against the compiled model with warm caches."""
    used = _of_kinds(results, ("package", "package-bytecode-off"))
    if not used:
        return "(no saved result of bench/package.py)"
    lines = [measured(used, "ResNet-18 FP16, batch 1, medians of fresh processes, the runtime cache present but in the third column; "
                      "compiled: `torch.compile` with warm engine, graph and runtime caches"), "",
             "| Python bytecode | `load` to first result s | the same, runtime cache empty "
             "| from process start s, package / compiled | `import torch` s | steady ms, package / compiled "
             "| archive MB (`onnx=False`) |", "|---|---|---|---|---|---|---|"]
    for _, r in used:
        load, first, warm = r["load"], r.get("load_first_process", {}), r["compile_warm"]
        steady, archive = r["steady_state"], r["archive"]
        cached = "cached" if str(_env(r).get("bytecode", "")).startswith("cached") else "not cached"
        lines.append(f"| {cached} | {load['load_to_first_result_s']:.2f} | "
                     + (f"{first['load_to_first_result_s']:.2f}" if "load_to_first_result_s" in first else "-")
                     + f" | {load['from_process_start_s']:.2f} / {warm['from_process_start_s']:.2f} | "
                     f"{load['import_torch_s']:.2f} | {steady['package']['median_ms']:.3f} / "
                     f"{steady['compiled']['median_ms']:.3f} | {archive['size_bytes'] / 1e6:.1f} "
                     f"({archive['size_without_onnx_bytes'] / 1e6:.1f}) |")
    return "\n".join(lines)


def llm_table(results: list[tuple[str, dict[str, Any]]]) -> str:
    """bench/llm.py's rows from the newest GPU result: ms per generated token of each backend."""
    found = [(stem, r) for stem, r in results if stem.endswith("-llm") and _env(r).get("gpu") != "cpu"]
    if not found:
        return "(no LLM results yet: python bench/llm.py --gpu)"
    stem, result = found[-1]
    env = _env(result)
    lines = [f"{_gpu(env['gpu'])}, TensorRT-RTX {version(result)}, torch {env['torch']}, transformers "
             f"{env['transformers']}; FP16, batch 1, median ms per generated token (bench/results: `{stem}`):", "",
             "| model | params | eager ms | inductor-ro ms | trtrtx ms | trtrtx / inductor-ro | tokens match |",
             "|---|---|---|---|---|---|---|"]
    for row in result.get("rows", []):
        p = row["paths"]
        cell = [f"{p[k]['ms_per_token']:.2f}" if k in p else "-" for k in ("eager", "inductor", "trtrtx")]
        ratio = (f"{p['trtrtx']['ms_per_token'] / p['inductor']['ms_per_token']:.2f}x"
                 if "trtrtx" in p and "inductor" in p else "-")
        match = "yes" if all(p[k]["first"]["match"] and p[k]["second"]["match"] for k in p if k != "eager") else "no"
        lines.append(f"| {row['model']} | {row['params_m']:.0f}M | {' | '.join(cell)} | {ratio} | {match} |")
    return "\n".join(lines)


def bench_table(results: list[tuple[str, dict[str, Any]]]) -> str:
    """The README's table with FP32 too (docs/performance.md)."""
    return readme_table(results, ("fp16", "float16", "torch.float16", "fp32", "float32", "torch.float32"))


TABLES = {"readme": readme_table, "bench": bench_table, "zoo_gpu": zoo_gpu_table, "zoo_peer": zoo_peer_table, "zoo_cold": zoo_cold_table,
          "zoo_calls": zoo_calls_table, "zoo_cpu": zoo_cpu_table, "fastest": fastest_table, "starts": starts_table,
          "overhead": overhead_table, "rest": rest_table, "refit": refit_table, "weight_check": weight_check_table,
          "package": package_table, "llm": llm_table}
FILES = (ROOT / "README.md", *(ROOT / "docs" / f"{name}.md" for name in ("performance", "zoo", "rest", "weights", "deploy")))
_BLOCK = re.compile(r"(<!-- report:(?P<name>\w+) -->\n)(?:.*?\n)??(<!-- /report -->)", re.S)


def fill(text: str, results: list[tuple[str, dict[str, Any]]]) -> str:
    """`text` with every report block replaced by the current table."""
    def table(m: re.Match[str]) -> str:
        if m["name"] not in TABLES:
            raise SystemExit(f"no table named {m['name']!r} (there are: {', '.join(TABLES)})")
        return m.group(1) + TABLES[m["name"]](results) + "\n" + m.group(3)
    return _BLOCK.sub(table, text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tables", nargs="*", choices=[[], *TABLES], metavar="NAME",
                        help=f"print these tables (default: all): {', '.join(TABLES)}")
    parser.add_argument("--write", action="store_true", help="update README.md and the docs pages that hold tables")
    parser.add_argument("--check", action="store_true", help="exit 1 when they are out of date")
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args()
    results = load(Path(args.results))
    if not (args.write or args.check):
        print("\n\n".join(f"{name}:\n\n{TABLES[name](results)}" for name in args.tables or TABLES))
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
