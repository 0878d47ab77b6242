"""explain: graphs, graph breaks, regions and every node kept in PyTorch, without a build."""

from __future__ import annotations

import inspect
import json
import logging
import re

import pytest
import torch
from torch import nn

import rtx_backend
from rtx_backend.tools import explain as _explain

from ..models import WithEagerOp, eval_model

TURING = [(7, 5)]


def line_of(obj, text: str) -> int:
    """The line number of the first source line of `obj` that contains `text`."""
    lines, start = inspect.getsourcelines(obj)
    return start + next(i for i, line in enumerate(lines) if text in line)


class Breaks(nn.Module):
    """Three graph breaks: print(), .item() and torch._dynamo.graph_break()."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.a(x)) * 2
        print("explain test: a print() breaks the graph")
        z = torch.tanh(self.b(y)) + 1
        if z.sum().item() > 1e9:
            z = z * 2
        torch._dynamo.graph_break()
        return torch.sigmoid(z)


def compute_ops(region) -> dict[str, int]:
    """A region's op histogram without the free ops (transposes) the partitioner may place anywhere."""
    return {op: k for op, k in region.ops.items() if op not in ("aten.t", "aten.view")}


def test_graph_breaks_are_listed_with_reason_and_line(capsys):
    model = eval_model(Breaks(), torch.float16)
    report = rtx_backend.explain(model, torch.randn(2, 8, dtype=torch.float16),
                                 options={"min_block_size": 1, "target_compute_capabilities": TURING})
    assert "a print() breaks the graph" in capsys.readouterr().out  # the model really ran
    breaks = report.graph_breaks
    assert [b.line for b in breaks] == [line_of(Breaks.forward, "print("), line_of(Breaks.forward, ".item()"),
                                        line_of(Breaks.forward, "graph_break()")]
    assert all(b.file == __file__ for b in breaks)
    assert "print" in breaks[0].reason
    assert "Tensor.item()" in breaks[1].reason
    assert "torch._dynamo.graph_break()" in breaks[2].reason
    # Dynamo compiles the pieces with ops: [addmm, relu, mul] before print; [addmm, tanh, add, sum]
    # up to .item(); nothing between .item() and graph_break(); [sigmoid] after.
    assert len(report.graphs) == 3
    assert [compute_ops(r) for r in report.regions] == [
        {"aten.addmm": 1, "aten.relu": 1, "aten.mul.Tensor": 1},
        {"aten.addmm": 1, "aten.tanh": 1, "aten.add.Tensor": 1, "aten.sum": 1},
        {"aten.sigmoid": 1},
    ]
    assert [r.graph for r in report.regions] == [0, 1, 2]
    assert report.eager_nodes == ()  # FP16: Turing runs all of it
    first = report.regions[0]
    assert [(t.shape, t.dtype) for t in first.inputs] == [((2, 8), "float16")]
    assert (first.outputs[0].shape, first.outputs[0].dtype) == ((2, 8), "float16")
    assert first.nodes == 3


def test_fallbacks_list_rule_target_and_source_line():
    model = eval_model(WithEagerOp())  # FP32: its GEMMs cannot run on Turing
    report = rtx_backend.explain(model, torch.randn(3, 16), options={
        "min_block_size": 1, "target_compute_capabilities": TURING, "torch_executed_ops": ["aten.sigmoid"]})
    compute = [(n.op, n.rule, n.target) for n in report.eager_nodes if n.op != "aten.t"]
    assert compute == [
        ("aten.addmm", "fp32-gemm-turing", (7, 5)),
        ("aten.sigmoid", "torch_executed_ops", None),
        ("aten.addmm", "fp32-gemm-turing", (7, 5)),
    ]
    assert all(n.rule for n in report.eager_nodes) and "unknown" not in {n.rule for n in report.eager_nodes}
    assert [compute_ops(r) for r in report.regions] == [
        {"aten.tanh": 1, "aten.mul.Tensor": 1, "aten.add.Tensor": 1},
        {"aten.relu": 1, "aten.sub.Tensor": 1},
    ]
    sigmoid = next(n for n in report.eager_nodes if n.op == "aten.sigmoid")
    source = inspect.getsourcefile(WithEagerOp)
    assert sigmoid.where == f"{source}:{line_of(WithEagerOp.forward, 'torch.sigmoid(')}"
    assert report.targets == ((7, 5),) and report.targets_declared

    # The same model on Ampere: FP32 GEMMs are fine there, only the listed op stays in PyTorch.
    ampere = rtx_backend.explain(model, torch.randn(3, 16), options={
        "min_block_size": 1, "target_compute_capabilities": [(8, 6)], "torch_executed_ops": ["aten.sigmoid"]})
    assert [(n.op, n.rule) for n in ampere.eager_nodes] == [("aten.sigmoid", "torch_executed_ops")]
    assert len(ampere.regions) == 2


def test_report_prints_a_table_and_converts_to_json():
    model = eval_model(WithEagerOp())
    report = rtx_backend.explain(model, torch.randn(3, 16), options={
        "min_block_size": 1, "target_compute_capabilities": TURING, "torch_executed_ops": ["aten.sigmoid"]})
    text = str(report)
    assert text.splitlines()[0] == (f"trtrtx explain: 1 graph(s), 0 graph break(s), {len(report.regions)} "
                                    f"region(s), {len(report.eager_nodes)} node(s) kept in PyTorch")
    assert "targets: SM7.5 (declared)" in text
    assert re.search(r"aten\.addmm +fp32-gemm-turing +SM7\.5 +models\.py:\d+ +TensorRT-RTX cannot run FP32 GEMMs", text)
    assert re.search(r"aten\.sigmoid +torch_executed_ops +- ", text)
    assert "trtrtx_region_0" in text and "f32[3,16]" in text
    data = json.loads(json.dumps(report.to_dict()))
    assert data["summary"] == {"graphs": 1, "graph_breaks": 0, "regions": len(report.regions),
                               "eager_nodes": len(report.eager_nodes)}
    assert data["targets"] == [[7, 5]]
    eager = data["graphs"][0]["eager"]
    assert {"node", "op", "rule", "message", "target", "where"} <= set(eager[0])
    assert [e["target"] for e in eager if e["rule"] == "fp32-gemm-turing"] == [[7, 5], [7, 5]]


def test_explain_builds_nothing_and_leaves_dynamo_logging_as_it_was(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("explain must not export or build")

    monkeypatch.setattr("rtx_backend.assemble.region.export_region", forbidden)
    monkeypatch.setattr("rtx_backend.assemble.region.build", forbidden)
    log = torch._dynamo.symbolic_convert.graph_break_log
    level, propagate, handlers = log.level, log.propagate, list(log.handlers)
    report = rtx_backend.explain(eval_model(WithEagerOp()), torch.randn(3, 16), options={"min_block_size": 1})
    assert len(report.regions) == 1
    assert rtx_backend.stats().get("engine_builds", 0) == 0
    assert rtx_backend.stats().get("backend_calls", 0) == 0  # the trtrtx backend itself never ran
    assert (log.level, log.propagate, list(log.handlers)) == (level, propagate, handlers)
    if not torch.cuda.is_available():
        assert report.targets == () and "no GPU" in report.engines
        assert "none (no GPU, no declared target" in str(report)


def test_a_graph_that_cannot_be_planned_is_reported_and_still_runs(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("planner exploded")

    monkeypatch.setattr(_explain, "plan_graph", broken)
    report = rtx_backend.explain(eval_model(WithEagerOp()), torch.randn(3, 16))
    assert [g.error for g in report.graphs] == ["RuntimeError: planner exploded"]
    assert report.regions == ()
    assert "could not be lowered and runs in inductor: RuntimeError: planner exploded" in str(report)  # rest="auto"
    report = rtx_backend.explain(eval_model(WithEagerOp()), torch.randn(3, 16), options={"rest": "pytorch"})
    assert "could not be lowered and runs in PyTorch: RuntimeError: planner exploded" in str(report)


def test_graph_breaks_fall_back_to_dynamo_counters(monkeypatch):
    class OneBreak(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + 1
            torch._dynamo.graph_break()
            return x * 2

    monkeypatch.setattr(_explain, "_BREAK", _explain.re.compile(r"(?!)"))  # the log is not understood
    report = rtx_backend.explain(OneBreak(), torch.randn(4))
    assert len(report.graph_breaks) == 1
    assert "graph_break()" in report.graph_breaks[0].reason
    assert report.graph_breaks[0].file is None and report.graph_breaks[0].where == "?"


def test_bad_options_raise_before_anything_runs():
    with pytest.raises(rtx_backend.OptionsError, match="min_block_size"):
        rtx_backend.explain(nn.Linear(2, 2), torch.randn(1, 2), options={"min_blok_size": 1})


def test_no_warnings_from_explain_at_default_level(caplog):
    with caplog.at_level(logging.WARNING):
        rtx_backend.explain(eval_model(WithEagerOp()), torch.randn(3, 16),
                            options={"min_block_size": 1, "target_compute_capabilities": [(8, 6)]})
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


@pytest.mark.gpu
def test_without_declared_targets_the_current_gpu_is_the_target():
    model = eval_model(WithEagerOp(), torch.float16, "cuda")
    report = rtx_backend.explain(model, torch.randn(3, 16, device="cuda", dtype=torch.float16),
                                 options={"min_block_size": 1})
    assert report.targets == (torch.cuda.get_device_capability(),)
    assert not report.targets_declared and report.engines == "a compile would build them for this GPU"
    assert "(this GPU)" in str(report)
    assert report.eager_nodes == () and len(report.regions) == 1


# ---- the summary by rule, the model's own lines, whole names, keyword inputs ---------------------

def test_summary_by_rule_comes_first_with_the_fix():
    model = eval_model(WithEagerOp())  # FP32 GEMMs: the fix for Turing is FP16
    report = rtx_backend.explain(model, torch.randn(3, 16), options={"target_compute_capabilities": TURING})
    rules = {r.rule: r for r in report.rules}
    assert rules["fp32-gemm-turing"].nodes == 2 and rules["fp32-gemm-turing"].targets == ((7, 5),)
    assert "run the model in FP16" in rules["fp32-gemm-turing"].fix
    assert report.rules[0].rule == "fp32-gemm-turing"  # the cause before what follows from it
    assert "fix the rules above first" in rules["min_block_size"].fix
    assert sum(r.nodes for r in report.rules) == len(report.eager_nodes)
    lines = str(report).splitlines()
    summary = lines.index("kept in PyTorch, by rule (the detail is below):")
    assert summary < lines.index("kept in PyTorch:")
    assert re.match(r"  fp32-gemm-turing +2 +SM7\.5 +run the model in FP16", lines[summary + 2])
    assert report.to_dict()["rules"][0]["rule"] == "fp32-gemm-turing"


def test_every_rule_has_a_fix():
    from rtx_backend.plan.policy import RULES

    named = {r.name for r in RULES} | {"min_block_size", "weights-only", "torch_executed_ops", "not-exportable",
                                       "not-aten", "mutation", "unknown-metadata", "data-dependent-shape",
                                       "parser-unsupported"}
    assert named <= set(_explain.FIXES)


def test_explain_does_not_claim_to_build():
    report = rtx_backend.explain(eval_model(WithEagerOp()), torch.randn(3, 16),
                                 options={"target_compute_capabilities": TURING})
    assert report.engines == "a compile would build them ahead of time for SM7.5"
    assert "engines: built" not in str(report)


def test_explain_says_what_fastest_would_do_only_when_it_is_on():
    model, x = eval_model(WithEagerOp()), torch.randn(3, 16)
    off = rtx_backend.explain(model, x, options={"target_compute_capabilities": TURING, "rest": "inductor"})
    assert off.fastest == "" and "fastest" not in str(off)
    on = rtx_backend.explain(model, x, options={"target_compute_capabilities": TURING, "rest": "inductor",
                                                "fastest": True})
    assert "keeps the faster" in on.fastest and "rtx_backend.recording()" in on.fastest
    assert f"fastest: {on.fastest}" in str(on).splitlines()[:3]
    assert on.to_dict()["fastest"] == on.fastest


class _Helper(nn.Module):
    """A model whose nodes come from a helper in another file (tests/models.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = WithEagerOp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * 3


def test_where_is_the_line_in_the_models_own_file():
    model = eval_model(_Helper())
    report = rtx_backend.explain(model, torch.randn(3, 16), options={
        "min_block_size": 1, "target_compute_capabilities": TURING, "torch_executed_ops": ["aten.sigmoid"]})
    sigmoid = next(n for n in report.eager_nodes if n.op == "aten.sigmoid")
    # the innermost frame is models.py's, but the model was defined here: its line is the one to fix
    assert sigmoid.where == f"{__file__}:{line_of(_Helper.forward, 'self.inner(x)')}"
    # a model from models.py: the line there
    direct = rtx_backend.explain(eval_model(WithEagerOp()), torch.randn(3, 16), options={
        "min_block_size": 1, "target_compute_capabilities": TURING, "torch_executed_ops": ["aten.sigmoid"]})
    sigmoid = next(n for n in direct.eager_nodes if n.op == "aten.sigmoid")
    assert sigmoid.where == f"{inspect.getsourcefile(WithEagerOp)}:{line_of(WithEagerOp.forward, 'torch.sigmoid(')}"


def test_op_names_are_never_cut_in_the_middle():
    from rtx_backend.tools.explain_render import MAX_CELL, _ops

    ops = {f"aten._native_batch_norm_legit_no_training_{i}": 1 for i in range(6)}
    text = _ops(ops)
    shown = text.split(", +")[0].split(", ")
    assert all(op in ops or f"aten.{op}" in ops for op in shown)  # each one whole
    assert text.endswith(f"+{len(ops) - len(shown)} more") and len(shown) < len(ops)
    assert len(", ".join(shown)) <= MAX_CELL or len(shown) == 1
    assert _ops({"aten.relu": 2, "aten.add.Tensor": 1}) == "relu x2, add.Tensor"


class _WithMask(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
        y = torch.relu(self.a(x))
        return y * mask if mask is not None else y


def test_keyword_inputs_reach_the_model_in_explain_and_crosscheck():
    model = eval_model(_WithMask())
    x, mask = torch.randn(3, 16), torch.randn(3, 16)
    report = rtx_backend.explain(model, x, mask=mask, options={"min_block_size": 1,
                                                              "target_compute_capabilities": [(8, 6)]})
    assert "aten.mul.Tensor" in report.regions[0].ops  # the mask was passed: the multiply is traced
    check = rtx_backend.crosscheck(model, x, mask=mask, options={"min_block_size": 1, "engine_cache_dir": ""})
    assert check, str(check)


def test_nodes_without_a_source_line_name_their_submodule():
    """The encoder's fused fast path is decomposed into nodes that carry no source line: they name
    the layer they came from instead of '?'."""
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    report = rtx_backend.explain(model, torch.randn(2, 8, 32), options={"target_compute_capabilities": TURING})
    where = {n.where for n in report.eager_nodes if n.rule == "fp32-gemm-turing"}
    assert where == {"layers.0 (TransformerEncoderLayer)", "layers.1 (TransformerEncoderLayer)"}


@pytest.mark.parametrize("options, expected", [
    ({"target_compute_capabilities": [(7, 5)]}, "inductor (rest='auto': addmm runs outside the regions)"),
    ({"target_compute_capabilities": [(7, 5)], "rest": "pytorch"}, "PyTorch (rest='pytorch')"),
    ({"target_compute_capabilities": [(8, 6)]}, "PyTorch (rest='auto': only glue runs outside the regions)"),
])
def test_explain_says_who_runs_the_rest(options, expected):
    from ..models import MLP

    report = rtx_backend.explain(eval_model(MLP()), torch.randn(4, 16), options=options)
    assert [g.rest for g in report.graphs] == [expected]
    assert f"graph 0: what stays outside the regions runs in {expected}" in str(report)
    assert report.to_dict()["graphs"][0]["rest"] == expected
