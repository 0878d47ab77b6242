"""A zoo of real models (torchvision, timm, Hugging Face transformers), random weights, nothing
downloaded: each compiled with trtrtx, run, and compared with eager PyTorch.

    python bench/zoo.py --cpu                  # CPU: tiny configs, FP32+FP16, three target sets
    python bench/zoo.py --cpu --size full      # CPU: real-size configs (slow)
    python bench/zoo.py --gpu                  # GPU: real sizes against eager, inductor, the peer

Random initialisation can make outputs meaningless (HF's std-0.02 BatchNorm gammas drive
EfficientNet's logits to 1e-31, torchvision's ViT head is zero): `prepare` re-draws all-zero
weight matrices, sets norm layers' scales to PyTorch's defaults (with noise), recalibrates
BatchNorm statistics on random data, and checks that the output depends on the input.

torchvision's registry wheel is built for CUDA torch and does not import next to the CPU torch,
so torchvision and timm models are for the GPU machine; Hugging Face models run anywhere.
Results (JSON, markdown, PNG) go to bench/results/<date>-<device>-<TensorRT-RTX version>-zoo.*.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import functools
import importlib.util
import json
import logging
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

HERE = Path(__file__).resolve().parent

TARGET_SETS: dict[str, list[tuple[int, int]]] = {
    "turing": [(7, 5)],
    "ampere": [(8, 6)],
    "all": [(7, 5), (8, 6), (8, 9), (12, 0)],
}


# ---- models -------------------------------------------------------------------------------------

class Output(nn.Module):
    """A model called with keywords (as Hugging Face models are), returning one tensor."""

    def __init__(self, model: nn.Module, names: Sequence[str], field: str) -> None:
        super().__init__()
        self.model = model
        self.names = tuple(names)
        self.field = field

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        out = self.model(**dict(zip(self.names, args)))
        if isinstance(out, torch.Tensor):
            return out
        if isinstance(out, (tuple, list)):
            return out[0]  # type: ignore[no-any-return]
        return getattr(out, self.field)  # type: ignore[no-any-return]


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    source: str  # "transformers", "torchvision", "timm"
    build: Callable[[str], nn.Module]  # size ("tiny" or "full") -> model returning one tensor
    inputs: Callable[[str, int], tuple[torch.Tensor, ...]]  # (size, batch) -> inputs (float: fp32)


def _tokens(vocab: int, length: int) -> Callable[[str, int], tuple[torch.Tensor, ...]]:
    def make(size: str, batch: int) -> tuple[torch.Tensor, ...]:
        n = length if size == "tiny" else 128
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, vocab, (batch, n), generator=g)
        mask = torch.ones(batch, n, dtype=torch.int64)
        mask[0, n - n // 4 :] = 0  # one padded sequence: the mask path is exercised
        return ids, mask
    return make


def _image(tiny: int, full: int = 224) -> Callable[[str, int], tuple[torch.Tensor, ...]]:
    def make(size: str, batch: int) -> tuple[torch.Tensor, ...]:
        s = tiny if size == "tiny" else full
        return (torch.randn(batch, 3, s, s, generator=torch.Generator().manual_seed(1)),)
    return make


def _hf(model_cls: str, config_cls: str, tiny: dict[str, Any], full: dict[str, Any], names: Sequence[str],
        field: str) -> Callable[[str], nn.Module]:
    def build(size: str) -> nn.Module:
        import transformers

        config = getattr(transformers, config_cls)(**(tiny if size == "tiny" else full))
        if hasattr(config, "use_cache"):
            config.use_cache = False
        model = getattr(transformers, model_cls)(config)
        return Output(model, names, field)
    return build


TEXT = ("input_ids", "attention_mask")
IMAGE = ("pixel_values",)

HF: list[Entry] = [
    Entry("hf-bert", "transformers", _hf(
        "BertModel", "BertConfig",
        dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             max_position_embeddings=64),
        {}, TEXT, "last_hidden_state"), _tokens(512, 16)),
    Entry("hf-gpt2", "transformers", _hf(
        "GPT2Model", "GPT2Config",
        dict(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=64),
        {}, TEXT, "last_hidden_state"), _tokens(512, 16)),
    Entry("hf-t5-encoder", "transformers", _hf(
        "T5EncoderModel", "T5Config",
        dict(vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4),
        dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8),
        TEXT, "last_hidden_state"), _tokens(512, 16)),
    Entry("hf-llama-gqa", "transformers", _hf(
        "LlamaModel", "LlamaConfig",
        dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64),
        # Llama 3.2 1B's shape
        dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
             num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=2048, rope_theta=500000.0),
        TEXT, "last_hidden_state"), _tokens(512, 16)),
    Entry("hf-vit", "transformers", _hf(
        "ViTModel", "ViTConfig",
        dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=128),
        {}, IMAGE, "last_hidden_state"), _image(32)),
    Entry("hf-swin", "transformers", _hf(
        "SwinModel", "SwinConfig",
        dict(image_size=64, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4),
        {}, IMAGE, "last_hidden_state"), _image(64)),
    Entry("hf-resnet", "transformers", _hf(
        "ResNetForImageClassification", "ResNetConfig",
        dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="bottleneck", num_labels=10),
        dict(num_labels=1000), IMAGE, "logits"), _image(32)),
    Entry("hf-convnext", "transformers", _hf(
        "ConvNextForImageClassification", "ConvNextConfig",
        dict(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, num_labels=10),
        dict(num_labels=1000), IMAGE, "logits"), _image(32)),
    Entry("hf-efficientnet", "transformers", _hf(
        "EfficientNetForImageClassification", "EfficientNetConfig",
        dict(width_coefficient=0.25, depth_coefficient=0.1, image_size=32, hidden_dim=320, num_labels=10),  # (its top conv: 1280 x width)
        # EfficientNet-B0's shape
        dict(width_coefficient=1.0, depth_coefficient=1.0, image_size=224, hidden_dim=1280, num_labels=1000),
        IMAGE, "logits"), _image(32)),
    Entry("hf-mobilevit", "transformers", _hf(
        "MobileViTForImageClassification", "MobileViTConfig",
        dict(image_size=64, hidden_sizes=[32, 40, 48], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
             num_labels=10),
        dict(num_labels=1000), IMAGE, "logits"), _image(64, 256)),
]


def _torchvision(name: str, **kwargs: Any) -> Callable[[str], nn.Module]:
    def build(size: str) -> nn.Module:
        import torchvision

        return getattr(torchvision.models, name)(weights=None, **kwargs)  # type: ignore[no-any-return]
    return build


def _timm(name: str) -> Callable[[str], nn.Module]:
    def build(size: str) -> nn.Module:
        import timm

        return timm.create_model(name, pretrained=False)  # type: ignore[no-any-return]
    return build


TORCHVISION: list[Entry] = [
    Entry(f"tv-{n}", "torchvision", _torchvision(n, **kw), _image(224))
    for n, kw in [("resnet50", {}), ("mobilenet_v3_large", {}), ("efficientnet_b0", {}), ("convnext_tiny", {}),
                  ("vit_b_16", {}), ("swin_t", {}), ("regnet_y_400mf", {}),
                  ("googlenet", {"aux_logits": False, "init_weights": True})]
]
TIMM: list[Entry] = [
    Entry(f"timm-{n}", "timm", _timm(n), _image(224))
    for n in ["deit_small_patch16_224", "resnet50", "efficientnet_b0", "convnext_tiny"]
]
ZOO: dict[str, Entry] = {e.name: e for e in [*HF, *TORCHVISION, *TIMM]}


def available(entry: Entry) -> str | None:
    """None when the entry's package imports here, else why not."""
    module = entry.source
    if importlib.util.find_spec(module) is None:
        hint = "pip install '.[zoo]'" if module == "transformers" else f"pip install {module} next to a CUDA torch"
        return f"{module} is not installed ({hint})"
    try:
        __import__(module)
    except Exception as exc:  # torchvision's extension next to a CPU torch: torchvision::nms
        return f"{module} does not import here: {type(exc).__name__}: {exc}"
    return None


# ---- weights that give meaningful outputs ---------------------------------------------------------

_NORMS = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm)


def prepare(model: nn.Module, inputs: Callable[[int], tuple[torch.Tensor, ...]], seed: int = 0) -> nn.Module:
    """Make a randomly initialised model's outputs depend on its input (in place; eval mode).

    Re-draws all-zero weights of two or more dimensions, gives norm layers scales near 1 (HF
    draws BatchNorm gammas with std 0.02: fifty of them multiply the signal by 1e-30),
    recalibrates BatchNorm statistics on random inputs; raises ValueError if the output still
    does not depend on the input.
    """
    torch.manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, _NORMS) and getattr(module, "weight", None) is not None:
                module.weight.uniform_(0.75, 1.25)
                if module.bias is not None:
                    module.bias.normal_(0.0, 0.05)
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                fan_in = p[0].numel()
                p.normal_(0.0, 1.0 / math.sqrt(fan_in))
    model.eval()
    batch_norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for bn in batch_norms:
        bn.reset_running_stats()
        bn.momentum = None  # a cumulative average over the calibration batches
        bn.train()
    device = next(iter(model.parameters()), torch.empty(0)).device
    with torch.no_grad():
        for i in range(4 if batch_norms else 0):
            model(*(t.to(device) for t in inputs(8 + i)))
    for bn in batch_norms:
        bn.momentum = 0.1
    model.eval()
    check_depends_on_input(model, inputs)
    return model


def check_depends_on_input(model: nn.Module, inputs: Callable[[int], tuple[torch.Tensor, ...]]) -> None:
    """Raise ValueError unless two different inputs give clearly different, finite outputs."""
    device = next(iter(model.parameters()), torch.empty(0)).device
    a = tuple(t.to(device) for t in inputs(2))
    torch.manual_seed(123)
    b = tuple(torch.randn_like(t) if t.is_floating_point() else torch.randint_like(t, 0, int(t.max()) + 1)
              for t in a)
    with torch.no_grad():
        ya, yb = model(*a).double(), model(*b).double()
    scale = max(ya.norm().item(), yb.norm().item())
    if not (math.isfinite(scale) and scale > 1e-6 * math.sqrt(ya.numel())):
        raise ValueError(f"output is {'not finite' if not math.isfinite(scale) else 'near zero'} (norm {scale:.3g})")
    if (ya - yb).norm().item() < 1e-3 * scale:
        raise ValueError("output does not depend on the input")


def build(entry: Entry, size: str, seed: int = 0) -> tuple[nn.Module, Callable[[int], tuple[torch.Tensor, ...]]]:
    """The entry's model, prepared (FP32, eval), and its input factory (batch -> inputs)."""
    torch.manual_seed(seed)
    model = entry.build(size)

    def inputs(batch: int) -> tuple[torch.Tensor, ...]:
        return entry.inputs(size, batch)

    return prepare(model, inputs, seed), inputs


def cast(inputs: Sequence[torch.Tensor], dtype: torch.dtype, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    return tuple(t.to(device, dtype) if t.is_floating_point() else t.to(device) for t in inputs)


# ---- CPU: lowered, built for every target, correct -------------------------------------------------

@contextlib.contextmanager
def _captured(records: list[logging.LogRecord]) -> Any:
    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler, logger = Keep(logging.WARNING), logging.getLogger("rtx_backend")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def check_cpu(name: str, dtype: torch.dtype, targets: Sequence[tuple[int, int]], size: str = "tiny",
              batch: int = 2, prepared: tuple[nn.Module, Callable[[int], tuple[torch.Tensor, ...]]] | None = None
              ) -> dict[str, Any]:
    """Compile one zoo model with trtrtx for `targets` (regions run in ONNX Runtime without a GPU;
    engines are built ahead of time for the targets), run it, compare it with eager PyTorch (FP16:
    also with FP32) and count what was lowered. Returns one JSON-able row."""
    import rtx_backend
    from rtx_backend._record import recording
    from rtx_backend.plan.partition import compute_nodes
    from rtx_backend.run.compare import compare, judge_by_fp32

    model32, inputs = prepared or build(ZOO[name], size)
    x32 = inputs(batch)
    with torch.no_grad():
        ref32 = model32(*x32)
    model = copy.deepcopy(model32).to(dtype)
    x = cast(x32, dtype)
    with torch.no_grad():
        eager = model(*x)
    torch._dynamo.reset()
    rtx_backend.reset_stats()
    records: list[logging.LogRecord] = []
    options = {"target_compute_capabilities": [tuple(t) for t in targets]}
    row: dict[str, Any] = {"model": name, "dtype": str(dtype).removeprefix("torch."),
                           "targets": [list(t) for t in targets]}
    start = time.perf_counter()
    try:
        compiled = torch.compile(model, backend="trtrtx", options=options)
        with torch.no_grad(), recording() as graphs, _captured(records):
            out = compiled(*x)
            again = compiled(*x)
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:500]
        return row
    finally:
        torch._dynamo.reset()
    row["seconds"] = round(time.perf_counter() - start, 2)
    stats = rtx_backend.stats()
    regions = [r for g in graphs for r in g.regions]
    lowered = sum(compute_nodes(r.graph_module.graph.nodes) for r in regions)
    eager_rules: set[str] = set()
    eager_nodes = 0
    for g in graphs:
        by_name = {n.name: n for n in g.plan.graph_module.graph.nodes}
        for node_name, _op in g.plan.eager_ops:
            if node_name in by_name and compute_nodes([by_name[node_name]]):
                eager_nodes += 1
                reason = g.plan.reasons.get(node_name)
                eager_rules.add(reason.rule if reason is not None else "unknown")
    messages = [r.getMessage() for r in records]
    check = compare(out, eager)
    fp32 = judge_by_fp32(out, eager, ref32) if dtype != torch.float32 else None
    row.update(
        graphs=len(graphs),
        whole_graph_fallbacks=sum("this graph runs in PyTorch" in m for m in messages),
        builder_rejections=sum("build failed" in m for m in messages),
        validation_failures=stats.get("validation_failures", 0),
        regions=len(regions),
        regions_with_engine=sum(r.engine is not None for r in regions),
        regions_in_pytorch=sum(r.kind == "pytorch" for r in regions),
        engine_builds=stats.get("engine_builds", 0),
        lowered_nodes=lowered,
        eager_nodes=eager_nodes,
        eager_rules=sorted(eager_rules),
        lowered_fraction=round(lowered / max(lowered + eager_nodes, 1), 4),
        matches_eager=check.passed,
        vs_eager=check.summary(),
        fp16_vs_fp32=fp32.summary() if fp32 is not None else None,
        fp16_as_close_to_fp32_as_eager=fp32.passed if fp32 is not None else None,
        repeatable=bool(torch.equal(out, again)),
        warnings=messages[:5],
    )
    return row


def cpu_problems(row: dict[str, Any], fp32_fully_lowered: bool) -> list[str]:
    """What is wrong with a `check_cpu` row, against the zoo's targets (empty: all good)."""
    if "error" in row:
        return [f"crashed: {row['error']}"]
    problems = [f"{k} = {row[k]}" for k in ("whole_graph_fallbacks", "builder_rejections", "validation_failures",
                                             "regions_in_pytorch") if row[k]]
    if not row["regions"]:
        problems.append("no region")
    if row["regions_with_engine"] != row["regions"]:
        problems.append(f"only {row['regions_with_engine']} of {row['regions']} regions have an engine")
    if not (row["matches_eager"] or row["fp16_as_close_to_fp32_as_eager"]):
        problems.append(f"wrong output: {row['vs_eager']}; {row['fp16_vs_fp32']}")
    if not row["repeatable"]:
        problems.append("a second call gave another result")
    if row["eager_nodes"] and (row["dtype"] != "float32" or fp32_fully_lowered):
        problems.append(f"{row['eager_nodes']} compute node(s) in PyTorch: {row['eager_rules']}")
    return problems


def _short(version: str | None) -> str:
    """A TensorRT-RTX version as result names carry it (major.minor.patch)."""
    return ".".join((version or "0.0.0").split(".")[:3])


def _file(stem: Path, extension: str) -> Path:
    """stem + extension (stems hold version numbers: with_suffix would cut them)."""
    return stem.with_name(stem.name + extension)


def cpu_main(args: argparse.Namespace) -> int:
    """Every Hugging Face model (and torchvision/timm where they import), FP32 and FP16, the three
    target sets; prints one line per run and what is wrong, saves JSON and markdown."""
    names = [n for n in (args.models.split(",") if args.models else ZOO) if n]
    rows, failures = [], 0
    for name in names:
        why = available(ZOO[name])
        if why is not None:
            print(f"{name}: skipped: {why}")
            continue
        try:
            prepared = build(ZOO[name], args.size)
        except Exception as exc:
            print(f"{name}: could not be built: {type(exc).__name__}: {exc}")
            failures += 1
            continue
        for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
            for label, targets in TARGET_SETS.items():
                row = check_cpu(name, dtype, targets, args.size, prepared=prepared)
                row["problems"] = cpu_problems(row, fp32_fully_lowered=(7, 5) not in targets)
                failures += bool(row["problems"])
                rows.append(row)
                print(f"{name:18} {row['dtype']:8} {label:7} {row.get('seconds', '-'):>6}s "
                      f"lowered {row.get('lowered_nodes', '-')}/{row.get('lowered_nodes', 0) + row.get('eager_nodes', 0)} "
                      f"regions {row.get('regions', '-')} {'; '.join(row['problems']) or 'ok'}", flush=True)
    env = _environment()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    stem = Path(args.out) / f"{env['date']}-cpu-{_short(env.get('tensorrt_rtx'))}-zoo{args.tag}"
    _file(stem, ".json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    lines = ["| model | dtype | targets | s | lowered | in PyTorch (rules) | regions | problems |", "|" + "---|" * 8]
    for r in rows:
        lines.append(f"| {r['model']} | {r['dtype']} | {r['targets']} | {r.get('seconds', '-')} | "
                     f"{r.get('lowered_nodes', '-')} | {r.get('eager_nodes', '-')} {r.get('eager_rules', '')} | "
                     f"{r.get('regions', '-')} | {'; '.join(r['problems']) or 'ok'} |")
    _file(stem, ".md").write_text(f"# {stem.name}\n\n" + "\n".join(lines) + "\n")
    print(f"{len(rows)} runs, {failures} with problems; saved {stem}.json and .md")
    return 1 if failures else 0


# ---- GPU: against eager, inductor, inductor reduce-overhead and the peer -----------------------------

BATCHES = {"transformers": (1, 16), "torchvision": (1, 32), "timm": (1, 32)}
BACKGROUND = "trtrtx-bg"  # trtrtx-cg with option engine_build="background"
LLM_BATCHES = (1, 4)  # Llama 1B at 128 tokens


@functools.cache
def _bench_module() -> Any:
    """bench/bench.py (a script, not a package module), loaded once."""
    spec = importlib.util.spec_from_file_location("bench_script", HERE / "bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _environment() -> dict[str, Any]:
    env: dict[str, Any] = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
                           "python": platform.python_version()}
    for package in ("tensorrt_rtx", "torch_tensorrt", "transformers", "torchvision", "timm"):
        with contextlib.suppress(Exception):
            env[package] = __import__(package).__version__
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    return env


def gpu_config(name: str, batch: int, dtype: torch.dtype, backends: Sequence[str], rounds: int, iters: int,
               cache_dir: str) -> dict[str, Any]:
    """One model at one batch and dtype, every backend: cold compile, median/p90 latency in
    interleaved rounds, max error against FP32 eager, and trtrtx's engine time alone."""
    import rtx_backend
    from rtx_backend._record import recording
    from rtx_backend._stats import stage_seconds

    bench = _bench_module()
    entry = ZOO[name]
    torch.manual_seed(0)
    base = entry.build("full").cuda()
    prepare(base, lambda b: entry.inputs("full", b))
    x32 = cast(entry.inputs("full", batch), torch.float32, "cuda")
    with torch.inference_mode():
        ref = base(*x32).float()
    model = base.to(dtype).requires_grad_(False)
    x = cast(x32, dtype, "cuda")
    table = bench.backend_table(False, cache_dir, background=BACKGROUND in backends)  # (only when named)
    rows: dict[str, dict[str, Any]] = {}
    compiled: dict[str, Callable[..., Any]] = {}
    regions: dict[str, list[Any]] = {}
    for bname in [b for b in table if not backends or b in backends]:
        torch._dynamo.reset()
        rtx_backend.reset_stats()
        row: dict[str, Any] = {}
        try:
            fn = table[bname](model)
            t = time.perf_counter()
            with torch.inference_mode(), recording() as graphs:
                out = fn(*x)
                torch.cuda.synchronize()
            row["cold_compile_s"] = time.perf_counter() - t
            if bname == BACKGROUND:  # the first call ran in PyTorch: when did the engines take over?
                rtx_backend.wait_for_updates(600)
                row["engines_ready_s"] = time.perf_counter() - t
            regions[bname] = [r for g in graphs for r in g.regions]
            with torch.inference_mode():
                for _ in range(3):
                    out = fn(*x)
            row["max_err_vs_fp32"] = (out.float() - ref).abs().max().item()
            row["rel_rms_err_vs_fp32"] = ((out.float() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
            if "trtrtx" in bname:
                stats = rtx_backend.stats()
                row["engine_builds"] = stats.get("engine_builds", 0)
                row["validation_failures"] = stats.get("validation_failures", 0)
                row["stage_s"] = stage_seconds({}, stats)
                row["stats"] = stats  # (e.g. whether the exporter decomposed the program again)
            compiled[bname] = fn
            row["lat"] = []
        except Exception as exc:  # a backend that cannot compile this model is a result too
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        rows[bname] = row
    for bname, fn in compiled.items():  # each compile reset Dynamo: compile again (from caches)
        with torch.inference_mode(), recording() as graphs:
            fn(*x)
        if graphs:
            regions[bname] = [r for g in graphs for r in g.regions]
    torch.cuda.synchronize()
    for _ in range(rounds):
        for bname, fn in compiled.items():
            with torch.inference_mode():
                rows[bname]["lat"] += bench.latencies(lambda fn=fn: fn(*x), iters)
    for bname, row in rows.items():
        lat = row.pop("lat", None)
        if lat:
            row["median_ms"] = statistics.median(lat)
            row["p90_ms"] = bench.p90(lat)
            if "trtrtx" in bname:
                row["regions"] = len(regions.get(bname, []))
                row["regions_in_pytorch"] = sum(r.kind == "pytorch" for r in regions.get(bname, []))
                if row["regions_in_pytorch"]:  # why, as rtx_backend.recording() says it
                    row["why_in_pytorch"] = sorted({r.why for r in regions[bname] if r.kind == "pytorch"})
                with contextlib.suppress(Exception):
                    row["engine_ms"] = bench.engine_ms(lambda _x, fn=compiled[bname]: fn(*x), None,
                                                       regions[bname], iters)
    shape = [batch, *x[0].shape[1:]]
    return {"model": name, "shape": shape, "dtype": str(dtype).removeprefix("torch."), "backends": rows}


def gpu_plan(names: Sequence[str], dtypes: Sequence[torch.dtype], batches: str) -> list[tuple[str, int, torch.dtype]]:
    plan = []
    for name in names:
        entry = ZOO[name]
        sizes = LLM_BATCHES if name == "hf-llama-gqa" else BATCHES[entry.source]
        if batches:
            sizes = tuple(sizes[0] if b == "small" else sizes[-1] for b in batches.split(","))
        plan += [(name, b, d) for d in dtypes for b in sizes]
    return plan


def gpu_main(args: argparse.Namespace) -> int:
    """Each configuration in a child process with a timeout (a crash or a hang is a result, not
    the end of the run); results are saved after every configuration, and a rerun with the same
    --tag resumes where the last one stopped (so the zoo can run in pieces of --budget-s)."""
    import subprocess
    import tempfile

    bench = _bench_module()
    names = [n for n in (args.models.split(",") if args.models else ZOO) if n]
    skipped = {n: why for n in names if (why := available(ZOO[n])) is not None}
    for n, why in skipped.items():
        print(f"{n}: skipped: {why}")
    plan = gpu_plan([n for n in names if n not in skipped], [getattr(torch, d) for d in args.dtypes.split(",")],
                    args.batches)
    env = _environment()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    stem = Path(args.out) / f"{env['date']}-{env.get('gpu', 'cpu').replace(' ', '-')}-{_short(env.get('tensorrt_rtx'))}-zoo{args.tag}"
    results: dict[str, Any] = {"env": env, "backends": ["eager", "inductor", "inductor-ro", "torch_tensorrt",
                                                        "trtrtx", "trtrtx-cg", BACKGROUND], "configs": []}
    if _file(stem, ".json").exists():
        results["configs"] = json.loads(_file(stem, ".json").read_text()).get("configs", [])
    done = {(c["model"], c["shape"][0], c["dtype"]) for c in results["configs"]}
    start = time.monotonic()
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="zoo-cache-")
    for name, batch, dtype in plan:
        key = (name, batch, str(dtype).removeprefix("torch."))
        if key in done:
            continue
        if args.budget_s and time.monotonic() - start > args.budget_s:
            print(f"budget of {args.budget_s}s spent: run the same command again to go on")
            break
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            path = f.name
        command = [sys.executable, __file__, "--gpu-child", f"{name}:{batch}:{key[2]}", "--child-json", path,
                   "--rounds", str(args.rounds), "--iters", str(args.iters), "--cache-dir", cache_dir,
                   "--backends", args.backends]
        t = time.monotonic()
        try:
            proc = subprocess.run(command, timeout=args.timeout_s, capture_output=True, text=True)
            config = json.loads(Path(path).read_text()) if proc.returncode == 0 else {
                "model": name, "shape": [batch], "dtype": key[2], "backends": {},
                "error": f"exit {proc.returncode}: {' '.join((proc.stderr or '').strip().splitlines()[-1:])}"}
        except subprocess.TimeoutExpired:
            config = {"model": name, "shape": [batch], "dtype": key[2], "backends": {},
                      "error": f"timed out after {args.timeout_s}s"}
        config["seconds"] = round(time.monotonic() - t, 1)
        results["configs"].append(config)
        _save(bench, results, stem)
        summary = {b: round(r["median_ms"], 3) if "median_ms" in r else r.get("error", "-")[:60]
                   for b, r in config["backends"].items()}
        print(f"{name} batch {batch} {key[2]}: {config.get('error') or summary} ({config['seconds']}s)", flush=True)
    print(_save(bench, results, stem))
    print(f"saved {stem}.json, .md, .png")
    return 0


def _save(bench: Any, results: dict[str, Any], stem: Path) -> str:
    """The results as JSON, markdown and PNG (after every configuration: a run cut short keeps all
    three); returns the markdown tables."""
    text: str = bench.save(results, stem)
    bench.plot(results, _file(stem, ".png"))
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--cpu", action="store_true", help="lowering, builds and correctness on the CPU")
    mode.add_argument("--gpu", action="store_true", help="latency against the other backends on a GPU")
    mode.add_argument("--gpu-child", default=None, help=argparse.SUPPRESS)
    mode.add_argument("--list", action="store_true", help="list the zoo and whether each model can be built here")
    parser.add_argument("--models", default="", help="comma-separated subset (default: every model)")
    parser.add_argument("--size", default="tiny", choices=["tiny", "full"], help="CPU: config sizes")
    parser.add_argument("--dtypes", default=None, help="default: float32,float16 on CPU, float16 on GPU")
    parser.add_argument("--batches", default="", help="GPU: small,large (default both)")
    parser.add_argument("--backends", default="", help="GPU: comma-separated subset of backends")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--timeout-s", type=int, default=900, help="GPU: per configuration")
    parser.add_argument("--budget-s", type=int, default=0, help="GPU: start no configuration after this long")
    parser.add_argument("--cache-dir", default="")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--tag", default="")
    parser.add_argument("--child-json", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.list:
        for name, entry in ZOO.items():
            print(f"{name:32} {entry.source:13} {available(entry) or 'ok'}")
        return 0
    if args.cpu:
        args.dtypes = args.dtypes or "float32,float16"
        return cpu_main(args)
    args.dtypes = args.dtypes or "float16"
    if args.gpu_child:
        name, batch, dtype = args.gpu_child.split(":")
        config = gpu_config(name, int(batch), getattr(torch, dtype), [b for b in args.backends.split(",") if b],
                            args.rounds, args.iters, args.cache_dir)
        Path(args.child_json).write_text(json.dumps(config))
        return 0
    if not torch.cuda.is_available():
        print("--gpu needs a CUDA GPU (use --cpu here)")
        return 2
    return gpu_main(args)


if __name__ == "__main__":
    sys.exit(main())
