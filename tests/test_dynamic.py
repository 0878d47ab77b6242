"""Dynamic shapes end to end: one compile and one engine serve a range of shapes.

CPU tests build engines ahead of time for SM 8.6 and run the (dynamic) ONNX models in ONNX
Runtime; GPU tests run the same sweeps through TensorRT-RTX engines and print the engine count
and the time per shape change (run with -s to see them).

Dynamo specializes sizes 0 and 1 by default, so with plain `dynamic=True` a batch of 1 after a
batch of 2 is a second compile. The sweeps run under `backed_size_oblivious=True`, the
configuration the README documents for serving batch 1 from the same engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import onnx
import pytest
import torch
from torch import nn

import rtx_backend
from rtx_backend import _trt
from rtx_backend._errors import BuildError
from rtx_backend._record import recording
from rtx_backend._types import OnnxRegion, TensorSpec
from rtx_backend.build import engine as _engine
from rtx_backend.build.profiles import EngineProfile
from rtx_backend.cache import store
from rtx_backend.export.bridge import export_region
from rtx_backend.run.executors import TrtExecutor
from rtx_backend.run.region import RegionModule

SM86 = [(8, 6)]
NO_CACHE = {"engine_cache_dir": "", "runtime_cache_path": ""}
# (batch, sequence) pairs covering batch 1..16 and sequence 8..128, both ends included
SWEEP = list(zip(range(1, 17), [8, 128, 16, 96, 24, 64, 32, 100, 40, 72, 48, 120, 56, 80, 9, 127]))


class Block(nn.Module):
    """A transformer block written out: the head split reshapes with b, s and b*s sizes."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.scale = heads, (d // heads) ** -0.5
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        qkv = self.qkv(self.ln1(x)).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = torch.softmax((q @ k.transpose(-1, -2)) * self.scale, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b * s, d)
        x = x + self.proj(y).view(b, s, d)
        return x + self.ff(self.ln2(x))


class FlattenMLP(nn.Module):
    """view/flatten of a dynamic batch: the region gets the batch as a size input."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1)).view(x.shape[0], 2, 4).sum(-1)


class SeqMLP(nn.Module):
    """Linear layers on (batch, sequence, 16): the region views its input as (b*s, 16)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.net(tokens)


def seq_mlp() -> nn.Module:
    return SeqMLP().eval()


class SmallConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean((2, 3)))


@contextlib.contextmanager
def size_oblivious() -> Iterator[None]:
    """Dynamo without 0/1 specialization: batch 1 uses the same graph as batch 2."""
    with torch.fx.experimental._config.patch(backed_size_oblivious=True):
        yield


def sweep(model: nn.Module, inputs: list[torch.Tensor], atol: float = 1e-4, **options: Any) -> list[RegionModule]:
    """Compile with dynamic=True, check every call against eager; returns the regions."""
    compiled = torch.compile(model, backend="trtrtx", dynamic=True, options={**NO_CACHE, **options})
    with torch.no_grad(), recording() as graphs:
        for x in inputs:
            torch.testing.assert_close(compiled(x), model(x), atol=atol, rtol=atol, msg=f"shape {tuple(x.shape)}")
    return [r for g in graphs for r in g.regions]


def compiles() -> int:
    """Graphs compiled: backend calls less Dynamo's restarts of the same compile (with
    dynamic=True, Dynamo makes float attributes such as LayerNorm's eps symbolic, specializes
    them, and traces again)."""
    stats = rtx_backend.stats()
    return stats.get("backend_calls", 0) - stats.get("backend_restarts", 0)


def dims(value_info: Any) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


# ---- one compile, one engine, many shapes ---------------------------------------------------------

def test_block_sweep_compiles_once_and_builds_one_engine():
    model = Block().eval()
    with size_oblivious():
        regions = sweep(model, [torch.randn(b, s, 32) for b, s in SWEEP], min_block_size=1,
                        target_compute_capabilities=SM86)
    stats = rtx_backend.stats()
    assert compiles() == 1
    assert stats["engine_builds"] == 1
    assert "engine_rebuilds" not in stats
    (region,) = regions
    assert region.kind == "onnxruntime" and region.engine is not None
    # The first call (batch 1) is exported at batch 2: torch.export would specialize a 1.
    assert region.profile is not None
    assert region.profile.profile == {"input_0": ((1, 1, 32), (2, 8, 32), (4096, 4096, 32))}
    model_proto = onnx.load_from_string(region.onnx.model)
    inp, out = model_proto.graph.input[0], model_proto.graph.output[0]  # (a second input: the scale)
    assert (inp.name, out.name) == ("input_0", "output_0")
    batch, seq, width = dims(inp)
    assert isinstance(batch, str) and isinstance(seq, str) and batch != seq and width == 32
    assert dims(out) == [batch, seq, 32]


def test_flatten_mlp_batch_sweep_compiles_once():
    model = FlattenMLP().eval()
    with size_oblivious():
        regions = sweep(model, [torch.randn(b, 4, 16) for b in range(1, 17)], min_block_size=1,
                        target_compute_capabilities=SM86)
    assert compiles() == 1
    assert rtx_backend.stats()["engine_builds"] == 1
    assert [r.kind for r in regions] == ["onnxruntime"]


def test_conv_net_with_dynamic_image_size_compiles_once():
    # Square images: Dynamo gives equal sizes one symbol ("duck shaping"); batch below 16: on
    # CPU, PyTorch's choice of conv backend adds a guard batch < 16.
    model = SmallConv().eval()
    inputs = [torch.randn(b, 3, hw, hw) for b, hw in [(2, 16), (3, 32), (4, 24), (2, 64), (5, 10)]]
    regions = sweep(model, inputs, min_block_size=1, target_compute_capabilities=SM86)
    assert compiles() == 1
    assert rtx_backend.stats()["engine_builds"] == 1
    (lo, opt, hi) = next(iter(regions[0].profile.profile.values()))
    assert lo[1] == opt[1] == hi[1] == 3  # channels stay static
    assert opt == (2, 3, 16, 16) and hi[2] == hi[3] == 4096


def test_batch_one_recompiles_without_size_oblivious():
    """Documents Dynamo's default: 1 is specialized, so batch 1 is its own (static) graph."""
    model = FlattenMLP().eval()
    regions = sweep(model, [torch.randn(b, 4, 16) for b in (2, 3, 1)], min_block_size=1,
                    target_compute_capabilities=SM86)
    assert compiles() == 2
    assert [r.onnx.inputs[0].shape[0] for r in regions][1:] == [1]  # a second engine, batch 1 static


def test_automatic_dynamic_after_a_shape_change_compiles_a_dynamic_engine_once():
    model = FlattenMLP().eval()
    compiled = torch.compile(model, backend="trtrtx", options={**NO_CACHE, "min_block_size": 1,
                                                             "target_compute_capabilities": SM86})
    with torch.no_grad(), recording() as graphs:
        for b in (2, 4, 6, 9, 3):
            x = torch.randn(b, 4, 16)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
    assert compiles() == 2 and rtx_backend.stats()["engine_builds"] == 2
    first, second = (g.regions[0] for g in graphs)
    assert first.profile is None  # the first call's shapes: static
    assert second.profile.profile == {"input_0": ((1, 4, 16), (4, 4, 16), (4096, 4, 16))}


# ---- where the profile comes from -----------------------------------------------------------------

def test_mark_dynamic_bounds_become_the_profile():
    model = seq_mlp()
    x = torch.randn(4, 16, 16)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=16)
    torch._dynamo.mark_dynamic(x, 1, min=8, max=128)
    regions = sweep(model, [x], min_block_size=1, target_compute_capabilities=SM86)
    # min 2 means "not 0 or 1 specialized": the engine takes 1 as well
    assert regions[0].profile.profile == {"input_0": ((1, 8, 16), (4, 16, 16), (16, 128, 16))}


def test_dynamic_shapes_option_overrides_by_name_and_index():
    model = seq_mlp()
    inputs = [torch.randn(2, 12, 16)]  # 12: a sequence of 16 would share the width's symbol
    regions = sweep(model, inputs, min_block_size=1, target_compute_capabilities=SM86,
                    dynamic_shapes={"tokens": {1: (4, 32, 256)}, 0: {0: (1, 2, 8)}})
    assert regions[0].profile.profile == {"input_0": ((1, 4, 16), (2, 32, 16), (8, 256, 16))}


def test_static_model_has_no_profile(monkeypatch):
    profiles = []
    original = _engine.build

    def spy(model, targets, profile, **kw):
        profiles.append(profile)
        return original(model, targets, profile, **kw)

    monkeypatch.setattr(_engine, "build", spy)
    monkeypatch.setattr("rtx_backend.assemble.region.build", spy)
    model = FlattenMLP().eval()
    compiled = torch.compile(model, backend="trtrtx", options={**NO_CACHE, "min_block_size": 1,
                                                             "target_compute_capabilities": SM86})
    with torch.no_grad(), recording() as graphs:
        compiled(torch.randn(3, 4, 16))
    assert profiles == [{}]
    assert graphs[0].regions[0].profile is None
    assert not any(s.dynamic for s in graphs[0].regions[0].onnx.inputs)


# ---- outside the profile: one widened build, right answers ----------------------------------------

def test_shape_outside_profile_triggers_exactly_one_widened_build():
    model = seq_mlp()
    compiled = torch.compile(model, backend="trtrtx", dynamic=True, options={
        **NO_CACHE, "min_block_size": 1, "target_compute_capabilities": SM86,
        "dynamic_shapes": {0: {1: (8, 16, 64)}}})  # Dynamo does not guard this range
    with torch.no_grad(), recording() as graphs:
        for b, s in [(2, 12), (3, 64), (2, 100), (4, 90), (3, 128), (2, 8)]:
            x = torch.randn(b, s, 16)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
    stats = rtx_backend.stats()
    assert compiles() == 1
    assert stats["engine_rebuilds"] == 1  # 100 doubles the max to 128: 90 and 128 fit
    assert stats["engine_builds"] == 2
    region = graphs[0].regions[0]
    lo, _opt, hi = region.profile.profile["input_0"]
    assert lo[1] == 8 and hi[1] == 128
    assert region.kind == "onnxruntime"


def test_widened_engine_is_cached_for_later_processes(tmp_path):
    """A later process (a fresh Dynamo) that meets the same shape outside the first profile loads
    the widened engine from the engine cache instead of building it again."""
    model = seq_mlp()
    options = {"engine_cache_dir": str(tmp_path / "engines"), "min_block_size": 1,
               "target_compute_capabilities": SM86, "dynamic_shapes": {0: {1: (8, 16, 64)}}}

    def run() -> dict:
        torch._dynamo.reset()
        rtx_backend.reset_stats()
        compiled = torch.compile(model, backend="trtrtx", dynamic=True, options=options)
        with torch.no_grad():
            for b, s in [(2, 12), (2, 100), (3, 16)]:
                x = torch.randn(b, s, 16)
                torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
        store.flush()
        return rtx_backend.stats()

    first = run()
    assert first["engine_builds"] == 2 and first["engine_rebuilds"] == 1 and first["profile_widenings"] == 1
    assert len(list((tmp_path / "engines").glob("*.engine"))) == 2
    again = run()
    assert "engine_builds" not in again and "engine_rebuilds" not in again
    assert again["profile_widenings"] == 1 and again["engine_cache_hits"] == 2


def test_region_runs_out_of_profile_call_in_pytorch_when_tensorrt_cannot_widen(caplog):
    def body(x):
        return (torch.relu(x) * 2,)

    spec = TensorSpec("input_0", ("s0", 4), torch.float32, (2, 4))
    onnx_region = OnnxRegion(b"", (0,), (spec,), ())
    engine_stub = TrtExecutor.__new__(TrtExecutor)  # an engine for up to 8 rows; never called here
    widener = EngineProfile({"input_0": ((1, 4), (2, 4), (8, 4))}, _failing_build)
    region = RegionModule("r", torch.fx.symbolic_trace(body), onnx_region, b"engine", engine_stub, profile=widener)
    for rows in (9, 12):
        x = torch.randn(rows, 4)
        (y,) = region(x)
        torch.testing.assert_close(y, torch.relu(x) * 2)
    assert caplog.text.count("such calls run in PyTorch") == 1
    assert region.executor is engine_stub and region.engine == b"engine"


def _failing_build(profile):
    raise BuildError("TensorRT-RTX build failed: test")


def test_size_expressions_are_rebuilt_inside_the_region():
    """SymInt inputs s0*4 and s0//2+1 become arithmetic on sym_size: the model takes tensors only."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv())
    ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    fake = mode.from_tensor(torch.randn(6, 4), symbolic_context=ctx)
    s0 = fake.shape[0]

    def region(x, n, half):
        y = torch.ops.aten.relu.default(torch.ops.aten.view.default(x, [n]))
        return (torch.ops.aten.view.default(y, [n // 4, 4]) * 2, torch.ops.aten.new_zeros.default(x, [half]))

    gm = torch.fx.symbolic_trace(region)
    vals = {"x": fake, "n": s0 * 4, "half": s0 // 2 + 1}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            node.meta["val"] = vals[node.target]
    out = next(n for n in gm.graph.nodes if n.op == "output")
    with mode:
        results = region(fake, s0 * 4, s0 // 2 + 1)
    for arg, val in zip(out.args[0], results):
        arg.meta["val"] = val
    exported = export_region(gm, optimize=False)
    assert exported.tensor_args == (0,)
    proto = onnx.load_from_string(exported.model)
    assert [i.name for i in proto.graph.input] == ["input_0"]
    assert isinstance(dims(proto.graph.input[0])[0], str)
    import onnxruntime as ort

    session = ort.InferenceSession(exported.model, providers=["CPUExecutionProvider"])
    for rows in (2, 7, 33):
        x = torch.randn(rows, 4)
        y, z = session.run(None, {"input_0": x.numpy()})
        torch.testing.assert_close(torch.from_numpy(y), torch.relu(x) * 2)
        assert z.shape == (rows // 2 + 1,)


# ---- GPU: the same sweep through TensorRT-RTX engines ---------------------------------------------

SWEEP_RANGES = {"x": {0: (1, 4, 16), 1: (8, 64, 128)}}


def _gpu_sweep(strategy: str, options: dict[str, Any]) -> dict[str, Any]:
    """Block sweep in FP16: every call matches eager; returns the numbers the lead records."""
    model = Block().eval().to("cuda", torch.float16)
    compiled = torch.compile(model, backend="trtrtx", dynamic=True, options={
        **NO_CACHE, "min_block_size": 1, "runtime": "tensorrt_rtx",
        "dynamic_shapes_kernel_specialization_strategy": strategy, **options})
    first, steady = [], []
    with torch.no_grad(), size_oblivious(), recording() as graphs:
        start = time.perf_counter()
        compiled(torch.randn(2, 8, 32, device="cuda", dtype=torch.float16))
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - start
        for b, s in SWEEP:
            x = torch.randn(b, s, 32, device="cuda", dtype=torch.float16)
            start = time.perf_counter()
            y = compiled(x)
            torch.cuda.synchronize()
            first.append(time.perf_counter() - start)
            start = time.perf_counter()
            for _ in range(5):
                compiled(x)
            torch.cuda.synchronize()
            steady.append((time.perf_counter() - start) / 5)
            torch.testing.assert_close(y, model(x), atol=2e-2, rtol=2e-2, msg=f"shape {(b, s)}")
    stats = rtx_backend.stats()
    regions = [r for g in graphs for r in g.regions]
    assert compiles() == 1
    assert regions and all(r.kind == "tensorrt_rtx" for r in regions)
    assert stats["engine_builds"] == len(regions) and "engine_rebuilds" not in stats
    return {
        "strategy": strategy, "ranges": "dynamic_shapes option" if options else "default",
        "regions": len(regions), "engines": stats["engine_builds"], "recompiles": compiles() - 1,
        "compile_s": round(compile_s, 3), "shapes": len(SWEEP),
        "shape_change_ms_median": round(1e3 * sorted(first)[len(first) // 2], 3),
        "shape_change_ms_max": round(1e3 * max(first), 3),
        "steady_ms_median": round(1e3 * sorted(steady)[len(steady) // 2], 3),
        "torch": torch.__version__, "tensorrt_rtx": _trt.version(), "gpu": torch.cuda.get_device_name(),
    }


def _report(record: dict[str, Any]) -> None:
    """Print the numbers (pytest -s); append them to $RTX_BACKEND_DYNAMIC_JSON when set."""
    print("\ndynamic sweep:", json.dumps(record))
    path = os.environ.get("RTX_BACKEND_DYNAMIC_JSON")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["lazy", "eager", "none"])
def test_gpu_sweep_one_engine_per_strategy(strategy):
    """Batch 1..16 x sequence 8..128 through one engine, for each kernel-specialization strategy.

    Records the first-call time at each new shape (the cost of a shape change) and the steady
    time at that shape.
    """
    _report(_gpu_sweep(strategy, {"dynamic_shapes": SWEEP_RANGES}))


@pytest.mark.gpu
def test_gpu_sweep_with_default_ranges():
    """The same sweep with the profile trtrtx picks by itself (batch and sequence up to 4096)."""
    _report(_gpu_sweep("lazy", {}))


@pytest.mark.gpu
def test_gpu_shape_outside_profile_gets_a_widened_engine():
    model = Block().eval().to("cuda", torch.float16)
    compiled = torch.compile(model, backend="trtrtx", dynamic=True, options={
        **NO_CACHE, "min_block_size": 1, "runtime": "tensorrt_rtx", "dynamic_shapes": {"x": {1: (8, 16, 64)}}})
    with torch.no_grad(), recording() as graphs:
        for b, s in [(2, 12), (3, 64), (2, 100), (4, 90)]:
            x = torch.randn(b, s, 32, device="cuda", dtype=torch.float16)
            torch.testing.assert_close(compiled(x), model(x), atol=2e-2, rtol=2e-2)
    assert rtx_backend.stats()["engine_rebuilds"] == len(graphs[0].regions)
    assert all(r.kind == "tensorrt_rtx" for r in graphs[0].regions)


@pytest.mark.gpu
def test_gpu_transformer_encoder_fast_path_sweeps_sequence_lengths_in_one_engine():
    """nn.TransformerEncoder in eval takes its fused fast path; with dynamic shapes Dynamo needs
    a meta kernel for it (torch < 2.13 has none: rtx_backend registers one), else every layer
    runs in PyTorch and nothing is compiled."""
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval().to("cuda", torch.float16)
    compiled = torch.compile(model, backend="trtrtx", dynamic=True, options={
        **NO_CACHE, "min_block_size": 1, "runtime": "tensorrt_rtx"})
    with torch.inference_mode(), recording() as graphs:
        for n in (8, 16, 40, 128):
            x = torch.randn(4, n, 64, device="cuda", dtype=torch.float16)
            torch.testing.assert_close(compiled(x), model(x), atol=2e-2, rtol=2e-2)
    regions = [r for g in graphs for r in g.regions]
    assert compiles() == 1
    assert regions and all(r.kind == "tensorrt_rtx" for r in regions)
    assert rtx_backend.stats()["engine_builds"] == len(regions)
