"""The exporter's lazy registry (rtx_backend/lower/registry.py) and the bridge's way to the exporter."""

from __future__ import annotations

import logging
import sys
import types

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn
from torch.onnx._internal.exporter import _registration

import rtx_backend
from rtx_backend.export import bridge as _onnx_bridge
from rtx_backend.export.bridge import export_region
from rtx_backend.lower import registry as _registry
from rtx_backend.lower.lowering import lower

from ..models import MLP, ConvNet
from ..zoo import ResNetish, SelfAttention


class NormMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _region(model: nn.Module, x: torch.Tensor, dynamic: bool = False) -> torch.fx.GraphModule:
    """The frozen ATen graph of `model`, as one region (what the backend would hand the bridge)."""
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm, example_inputs):
        return lower(gm, example_inputs, lambda aten_gm, _args: graphs.append(aten_gm) or aten_gm.forward)

    torch._dynamo.reset()
    if dynamic:
        torch._dynamo.mark_dynamic(x, 0)
    with torch.no_grad():
        torch.compile(model, backend=backend, fullgraph=True)(x)
    (gm,) = graphs
    return gm


class _Spy:
    """Counts calls of a function and passes them on."""

    def __init__(self, fn):
        self.fn = fn
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


@pytest.fixture
def both(monkeypatch):
    """Each export_region also runs the public torch.onnx.export on the same exported program:
    returns the list of (lazy path's program, public program) pairs, and the spies."""
    pairs = []
    public = _Spy(torch.onnx.export)
    full = _Spy(_registry.full_registry)
    monkeypatch.setattr(_registry, "full_registry", full)
    to_onnx = _onnx_bridge._to_onnx

    def twice(exported, args, input_names, output_names, optimize, keep_weights=False):
        monkeypatch.setattr(torch.onnx, "export", public)
        lazy = to_onnx(exported, args, input_names, output_names, optimize, keep_weights)
        assert public.calls == 0 and full.calls == 0, "the lazy registry was not the one used"
        monkeypatch.undo()  # the public path as it is
        reference = torch.onnx.export(exported, args, dynamo=True, input_names=input_names,
                                      output_names=output_names, optimize=optimize, verbose=False, report=False)
        pairs.append((lazy, reference))
        return lazy

    monkeypatch.setattr(_onnx_bridge, "_to_onnx", twice)
    return pairs


def _run(model_bytes: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: x for i, x in zip(session.get_inputs(), inputs)})


def _inputs(region, batch: int | None = None) -> list[torch.Tensor]:
    """Random model inputs (the region's weights are inputs too); dynamic dims take `batch`."""
    torch.manual_seed(1)
    return [torch.randn([batch if isinstance(d, str) else d for d in s.shape]).to(s.dtype) for s in region.inputs]


def _check_against_graph(gm: torch.fx.GraphModule, region) -> None:
    """The ONNX model computes what the region graph computes (static shapes: all inputs tensors)."""
    inputs = _inputs(region)
    got = _run(region.model, [t.numpy() for t in inputs])
    with torch.no_grad():
        expected = gm(*inputs)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e.numpy(), atol=1e-5, rtol=1e-5)


CASES = {
    "convs+bn": (ResNetish, torch.randn(2, 3, 16, 16), False, torch.float32),
    "mlp-gelu-layernorm": (NormMLP, torch.randn(4, 16), False, torch.float32),
    "sdpa-attention": (SelfAttention, torch.randn(2, 6, 32), False, torch.float32),
    "dynamic-batch": (MLP, torch.randn(5, 16), True, torch.float32),
    "fp16-conv": (ConvNet, torch.randn(2, 3, 12, 12), False, torch.float16),
}


@pytest.mark.parametrize("case", list(CASES))
def test_lazy_registry_exports_what_the_public_exporter_exports(case, both):
    factory, x, dynamic, dtype = CASES[case]
    torch.manual_seed(0)
    model = factory().eval().to(dtype)
    region = export_region(_region(model, x.to(dtype), dynamic), optimize=True)
    ((lazy, reference),) = both
    lazy_proto, ref_proto = lazy.model_proto, reference.model_proto
    assert [n.op_type for n in lazy_proto.graph.node] == [n.op_type for n in ref_proto.graph.node]
    assert onnx.load_from_string(region.model).graph.node[0].op_type == lazy_proto.graph.node[0].op_type
    assert region.dynamic == dynamic
    inputs = [t.numpy() for t in _inputs(region, batch=3)]
    got, expected = _run(region.model, inputs), _run(ref_proto.SerializeToString(), inputs)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g.astype(np.float32), e.astype(np.float32), atol=1e-5, rtol=1e-5)


def test_lazy_registry_names_what_the_full_one_names_and_builds_the_same_entries():
    lazy = _registry.lazy_registry()
    full = _registration.ONNXRegistry.from_torchlib(_registry.opset_version())
    assert lazy.opset_version == full.opset_version
    assert lazy.functions.keys() == full.functions.keys()
    assert all(lazy.functions[k][0].fx_target == full.functions[k][0].fx_target for k in full.functions)
    for op in (torch.ops.aten.gelu.default, torch.ops.aten.convolution.default, torch.ops.aten.add.Tensor,
               torch.ops.prims.convert_element_type.default, torch.ops.aten.scaled_dot_product_attention.default):
        got, want = lazy.get_decomps(op), full.get_decomps(op)
        assert [(d.onnx_function, d.is_complex, d.is_custom, d.opset_introduced, str(d.signature)) for d in got] == [
            (d.onnx_function, d.is_complex, d.is_custom, d.opset_introduced, str(d.signature)) for d in want]
        assert all(d.signature is not None for d in got)


def test_a_failed_lazy_export_is_retried_with_the_full_registry(monkeypatch):
    empty = _Spy(lambda opset=None: _registration.ONNXRegistry())  # translates nothing
    full = _Spy(_registry.full_registry)
    monkeypatch.setattr(_registry, "lazy_registry", empty)
    monkeypatch.setattr(_registry, "full_registry", full)
    gm = _region(_seeded(NormMLP), torch.randn(4, 16))
    rtx_backend.reset_stats()
    region = export_region(gm)
    assert empty.calls == 1 and full.calls == 1
    assert rtx_backend.stats()["exports_with_full_registry"] == 1
    _check_against_graph(gm, region)
    assert {n.op_type for n in onnx.load_from_string(region.model).graph.node} >= {"Gemm", "LayerNormalization"}


def _seeded(factory):
    torch.manual_seed(0)
    return factory().eval()


@pytest.mark.parametrize("how", ["no _core.export", "other signature", "module not importable"])
def test_a_changed_private_api_falls_back_to_the_public_exporter(how, monkeypatch):
    public = _Spy(torch.onnx.export)
    monkeypatch.setattr(torch.onnx, "export", public)
    if how == "no _core.export":
        monkeypatch.setattr(_registry, "_core", types.SimpleNamespace())
    elif how == "other signature":
        monkeypatch.setattr(_registry, "_core", types.SimpleNamespace(export=lambda model, args, *, registry: None))
    else:
        monkeypatch.delattr(rtx_backend.lower, "registry")
        monkeypatch.setitem(sys.modules, "rtx_backend.lower.registry", None)  # importing it raises ImportError
    gm = _region(_seeded(NormMLP), torch.randn(4, 16))
    region = export_region(gm)
    assert public.calls == 1
    _check_against_graph(gm, region)


def test_a_second_export_builds_no_registry_and_infers_no_unneeded_signature(monkeypatch):
    export_region(_region(_seeded(ResNetish), torch.randn(2, 3, 16, 16)))  # the process's first, maybe
    index = _registry.index()
    inferred, pending = index.inferred, len(index.pending)
    rebuilds = _Spy(_registration.ONNXRegistry.from_torchlib.__func__)
    monkeypatch.setattr(_registration.ONNXRegistry, "from_torchlib", classmethod(rebuilds))
    full = _Spy(_registry.full_registry)
    monkeypatch.setattr(_registry, "full_registry", full)
    gm = _region(_seeded(ResNetish), torch.randn(2, 3, 16, 16))
    region = export_region(gm)
    assert rebuilds.calls == 0 and full.calls == 0
    assert index.inferred == inferred and len(index.pending) == pending  # all its ops were filled in before
    assert len(index.pending) > 0.8 * len(index.functions)  # most of torchlib was never touched
    _check_against_graph(gm, region)


def test_entries_are_filled_in_once_across_threads():
    import concurrent.futures

    index = _registry._Index(_registry.opset_version())  # a private one: counts start at zero
    ops = [torch.ops.aten.gelu.default, torch.ops.aten.mm.default, torch.ops.aten.relu.default]
    deferred = sum(id(m) in index._ids for op in ops for m in index.functions[op.name()])
    assert deferred > 0
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: [_registry.LazyRegistry(index).get_decomps(op) for op in ops], range(8)))
    assert all(r == results[0] for r in results)
    assert index.inferred == deferred  # each entry once, whatever the number of threads and registries


def _program(fn, *args: torch.Tensor) -> torch.export.ExportedProgram:
    class Wrapped(nn.Module):
        def forward(self, *xs):
            return fn(*xs)

    return torch.export.export(Wrapped(), args, strict=False)


@pytest.mark.parametrize("fn, skips, changes", [
    (lambda x: torch.relu(torch.ops.aten.addmm(x, x, x)), True, False),  # ops the registry translates
    (lambda x: (torch.ops.aten.t(x) * 2).sum(0, keepdim=True), True, False),
    # a getitem of a tuple output: the pass only adds an unused getitem of the other output
    (lambda x: torch.ops.aten.max_pool2d_with_indices(x[None], [2, 2])[0], True, True),
    (lambda x: torch.ops.aten.reshape(x, (-1,)), True, True),  # composite, decomposed to view; kept (see below)
    # composite, and kept by the pass: what the bridge makes of CUDA's fused attention kernels
    (lambda x: torch.nn.functional.scaled_dot_product_attention(x[None], x[None], x[None]), True, False),
    (lambda x: torch.ops.aten.add_(x.clone(), 1), False, True),  # in place: the pass functionalizes it
    (lambda x: torch.ops.aten.rsub(x, 1.0), False, True),  # the registry has no rsub: decomposed to sub
    (lambda x: torch.cond(x.sum() > 0, lambda y: y + 1, lambda y: y - 1, (x,)), False, None),  # subgraphs
])
def test_already_decomposed_verdicts_against_what_the_pass_does(fn, skips, changes):
    from torch.onnx._internal.exporter import _fx_passes

    registry = _registry.lazy_registry()
    program = _program(fn, torch.randn(4, 4))
    assert _registry.already_decomposed(program, registry) is skips
    if changes is not None:  # the claim itself: what the pass does to the same program
        decomposed = _fx_passes.decompose_with_registry(_program(fn, torch.randn(4, 4)), registry)
        graph = [(n.op, str(n.target)) for n in program.graph.nodes]
        assert ([(n.op, str(n.target)) for n in decomposed.graph.nodes] != graph) is changes


def test_a_decomposed_region_is_translated_without_the_pass_and_as_the_public_exporter_does(both):
    rtx_backend.reset_stats()
    gm = _region(_seeded(MLP), torch.randn(5, 16))
    region = export_region(gm)
    assert rtx_backend.stats()["exports_without_redecomposition"] == 1
    ((lazy, reference),) = both  # the public exporter decomposes: same ONNX ops, same results
    assert [n.op_type for n in lazy.model_proto.graph.node] == [n.op_type for n in reference.model_proto.graph.node]
    _check_against_graph(gm, region)


def test_a_region_with_a_reshape_skips_the_pass_and_exports_what_the_public_exporter_exports(both):
    """The reshape that our lowering puts before a classifier stays a reshape: the exporter
    translates it into the same ONNX Reshape as the view that the pass would make of it."""
    rtx_backend.reset_stats()
    gm = _region(_seeded(ResNetish), torch.randn(2, 3, 16, 16))
    assert torch.ops.aten.reshape.default in {n.target for n in gm.graph.nodes}
    region = export_region(gm)
    assert rtx_backend.stats()["exports_without_redecomposition"] == 1
    ((lazy, reference),) = both
    assert sorted(n.op_type for n in lazy.model_proto.graph.node) == sorted(n.op_type for n in reference.model_proto.graph.node)
    assert "Reshape" in {n.op_type for n in lazy.model_proto.graph.node}
    _check_against_graph(gm, region)


def test_the_pass_is_skipped_only_in_the_exporting_thread(monkeypatch):
    import concurrent.futures

    from torch.onnx._internal.exporter import _fx_passes

    checks = _Spy(_registry.already_decomposed)
    monkeypatch.setattr(_registry, "already_decomposed", checks)
    program = _program(lambda x: torch.relu(x) + 1, torch.randn(4, 4))
    registry = _registry.lazy_registry()
    with _registry._skipping_redecomposition():
        assert _fx_passes.decompose_with_registry(program, registry) is program
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # another thread's export: the pass runs
            other = pool.submit(_fx_passes.decompose_with_registry, program, registry).result()
    assert other is not program and checks.calls == 1
    assert _fx_passes.decompose_with_registry(program, registry) is not program  # and after, here
    assert checks.calls == 1


def test_a_program_the_check_cannot_read_gets_the_pass_and_is_counted(monkeypatch, caplog):
    from torch.onnx._internal.exporter import _fx_passes

    def unreadable(program, registry):
        raise AttributeError("no such thing here")

    monkeypatch.setattr(_registry, "already_decomposed", unreadable)
    program = _program(lambda x: torch.relu(x) + 1, torch.randn(4, 4))
    rtx_backend.reset_stats()
    with caplog.at_level(logging.DEBUG, logger="rtx_backend"), _registry._skipping_redecomposition():
        assert _fx_passes.decompose_with_registry(program, _registry.lazy_registry()) is not program
    stats = rtx_backend.stats()
    assert stats["exports_redecomposed"] == 1 and stats["exports_redecomposed_unchecked"] == 1, stats
    assert "exports_without_redecomposition" not in stats
    assert any("AttributeError: no such thing here" in r.getMessage() for r in caplog.records)


def test_an_exporter_that_bypasses_the_patched_pass_is_counted(monkeypatch):
    """Where the exporter would run its decomposition pass some other way, nothing is skipped and
    the export says so (a counter the GPU runs' results keep)."""
    rtx_backend.reset_stats()
    with _registry._skipping_redecomposition():
        pass  # an export that never reached decompose_with_registry
    assert rtx_backend.stats()["exports_pass_not_seen"] == 1
    rtx_backend.reset_stats()
    export_region(_region(_seeded(MLP), torch.randn(5, 16)))
    stats = rtx_backend.stats()
    assert stats["exports_without_redecomposition"] == 1 and "exports_pass_not_seen" not in stats, stats


def test_a_region_with_plain_attention_skips_the_pass_and_exports_what_the_public_exporter_exports(both):
    """On CUDA the bridge turns the fused attention kernels into the plain op (unfuse_attention),
    which is composite: the pass keeps it as it is, so the export skips the pass."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    def attention(q, k, v):
        return (torch.ops.aten.scaled_dot_product_attention.default(q, k, v) * 2.0,)

    gm = torch.fx.symbolic_trace(attention)
    FakeTensorProp(gm).propagate(*(torch.randn(2, 4, 8, 16) for _ in range(3)))
    assert torch.ops.aten.scaled_dot_product_attention.default in {n.target for n in gm.graph.nodes}
    rtx_backend.reset_stats()
    region = export_region(gm)
    assert rtx_backend.stats()["exports_without_redecomposition"] == 1
    ((lazy, reference),) = both
    assert sorted(n.op_type for n in lazy.model_proto.graph.node) == sorted(n.op_type for n in reference.model_proto.graph.node)
    _check_against_graph(gm, region)
