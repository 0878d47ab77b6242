"""explain: what trtrtx would do with a model, and why, without building an engine.

    report = rtx_backend.explain(model, x, options={"target_compute_capabilities": [(7, 5)]})
    print(report)            # graphs, graph breaks, regions, every node kept in PyTorch and why
    report.to_dict()         # the same, JSON-serialisable

It runs the backend's own first stages (Dynamo, lowering to ATen, the capability policy and the
partitioner, through `_backend.plan_graph`) behind a backend that records the plan and returns
the partitioned ATen graph to run in PyTorch: no ONNX export, no engine, and what it reports
is what `torch.compile(backend="trtrtx")` would lower. The model runs once, under no_grad.
Only what needs the exported ONNX model is left out: nodes that the ONNX screen refuses at
compile time (rule "parser-unsupported") show in the compile's logs, not here.

Like `torch._dynamo.explain`, it resets Dynamo before and after (so that Dynamo traces the
model afresh): models compiled earlier in the process recompile on their next call.

Long because it runs Dynamo itself to collect graph breaks and maps every node kept in
PyTorch to its rule, fix and user frame; the table rendering is in explain_render.py.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from .. import _targets, _torch_compat
from .._defaults import with_defaults
from .._options import Options
from .._types import Reason, Target
from ..assemble.rest import rest_choice
from ..lower.lowering import lower
from ..plan.fixes import FIXES, FOLLOW_ON, TARGET_RULES
from ..plan.partition import compute_nodes, plan_graph

log = logging.getLogger("rtx_backend")


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Shape (ints, or symbol names for dynamic dims) and dtype of a region input or output."""

    shape: tuple[int | str, ...]
    dtype: str

    def __str__(self) -> str:
        if self.dtype.startswith("SymInt"):
            return self.dtype
        return f"{_SHORT_DTYPES.get(self.dtype, self.dtype)}[{','.join(map(str, self.shape))}]"


@dataclasses.dataclass(frozen=True)
class GraphBreak:
    """Where Dynamo split the model, and why (`reason`: its first line; `detail`: all of it)."""

    reason: str
    detail: str
    file: str | None = None
    line: int | None = None

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.file else "?"


@dataclasses.dataclass(frozen=True)
class RegionInfo:
    """One region: the part of a graph that would become one TensorRT-RTX engine."""

    graph: int
    name: str
    nodes: int  # compute nodes (what min_block_size counts; views and getitems are free)
    ops: dict[str, int]  # op -> how many times it occurs in the region
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]


@dataclasses.dataclass(frozen=True)
class EagerNode:
    """A node that stays in PyTorch: the policy rule that refused it, and the target it failed."""

    graph: int
    node: str
    op: str
    rule: str
    message: str
    target: Target | None
    where: str | None  # file:line of the user code that produced the node, when known


@dataclasses.dataclass(frozen=True)
class RuleSummary:
    """One rule that kept nodes in PyTorch: how many, on which targets, and what to do."""

    rule: str
    nodes: int
    targets: tuple[Target, ...]  # the targets the nodes failed (empty: every target)
    fix: str


@dataclasses.dataclass(frozen=True)
class GraphInfo:
    """One graph that Dynamo captured, as lowered and partitioned."""

    index: int
    aten_nodes: int
    regions: tuple[RegionInfo, ...]
    eager: tuple[EagerNode, ...]
    error: str = ""  # lowering or planning failed: the whole graph would run in PyTorch (or inductor)
    rest: str = ""  # who would run what stays outside the regions, and why (option rest)


@dataclasses.dataclass(frozen=True)
class ExplainReport:
    """What trtrtx would do with a model. `print(report)` shows a table; `to_dict()` is JSON."""

    graphs: tuple[GraphInfo, ...]
    graph_breaks: tuple[GraphBreak, ...]
    targets: tuple[Target, ...]  # what the policy judged against
    targets_declared: bool  # from target_compute_capabilities (else: this GPU, or none)
    engines: str  # whether and for what engines would be built
    fastest: str = ""  # option fastest: what a compile would decide per region, and where it shows ("": off)

    @property
    def regions(self) -> tuple[RegionInfo, ...]:
        return tuple(r for g in self.graphs for r in g.regions)

    @property
    def eager_nodes(self) -> tuple[EagerNode, ...]:
        return tuple(n for g in self.graphs for n in g.eager)

    @property
    def rules(self) -> tuple[RuleSummary, ...]:
        """The rules that kept nodes in PyTorch, most nodes first, each with its fix."""
        counts = collections.Counter(n.rule for n in self.eager_nodes)
        targets: dict[str, list[Target]] = collections.defaultdict(list)
        for n in self.eager_nodes:
            if n.target is not None and n.target not in targets[n.rule]:
                targets[n.rule].append(n.target)
        causes = any(r in counts for r in TARGET_RULES)
        order = sorted(counts, key=lambda r: (r in FOLLOW_ON, r not in TARGET_RULES, -counts[r], r))
        out = []
        for rule in order:
            fix = FIXES.get(rule, "nothing")
            if rule == "min_block_size" and causes:
                fix = f"fix the rules above first (these nodes follow from the ones they keep in PyTorch); then {fix}"
            out.append(RuleSummary(rule, counts[rule], tuple(sorted(targets[rule])), fix))
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["rules"] = [dataclasses.asdict(r) for r in self.rules]
        out["summary"] = {"graphs": len(self.graphs), "graph_breaks": len(self.graph_breaks),
                          "regions": len(self.regions), "eager_nodes": len(self.eager_nodes)}
        return _jsonable(out)  # type: ignore[no-any-return]

    def __str__(self) -> str:
        from ..tools.explain_render import render

        return render(self)


def explain(
    model: Callable[..., Any], *example_inputs: Any, options: Any = None, dynamic: bool | None = None,
    **example_kwargs: Any,
) -> ExplainReport:
    """Run Dynamo, lowering, the policy and the partitioner on `model(*example_inputs,
    **example_kwargs)`; no export, no build.

    The model's arguments go as they would to the compiled model, keywords included
    (`explain(model, ids, attention_mask=mask)`). `options` are the backend's (only those that
    change the plan matter: targets, min_block_size, torch_executed_ops); `dynamic` is
    torch.compile's. `print(report)` starts with one line per rule that kept nodes in PyTorch,
    with what to do about it.
    """
    opts = Options.from_dict(with_defaults(options))
    graphs: list[GraphInfo] = []

    def backend(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
        index = len(graphs)

        def plan_only(aten_gm: torch.fx.GraphModule, args: Sequence[Any]) -> Callable[..., Any]:
            aten_nodes = sum(1 for n in aten_gm.graph.nodes if n.op == "call_function")
            try:
                plan = plan_graph(aten_gm, opts)
            except _torch_compat.dynamo_exc().TorchDynamoException:
                raise
            except Exception as exc:
                graphs.append(GraphInfo(index, aten_nodes, (), (), error=_error(exc), rest=str(rest_choice(opts, unlowered=True))))
                return aten_gm.forward
            info = describe_plan(index, aten_nodes, plan, model_file)
            graphs.append(dataclasses.replace(info, rest=str(rest_choice(opts, plan.graph_module))))
            return plan.graph_module.forward

        try:
            return lower(gm, inputs, plan_only)
        except _torch_compat.dynamo_exc().TorchDynamoException:
            del graphs[index:]  # Dynamo's own control flow (a restart): this graph comes again
            raise
        except Exception as exc:
            if len(graphs) == index:
                graphs.append(GraphInfo(index, 0, (), (), error=_error(exc), rest=str(rest_choice(opts, unlowered=True))))
            return gm.forward

    model_file = _source_file(model)
    torch._dynamo.reset()
    try:
        with _graph_breaks() as breaks, torch.no_grad():
            torch.compile(model, backend=backend, dynamic=dynamic)(*example_inputs, **example_kwargs)
    finally:
        torch._dynamo.reset()
    return ExplainReport(
        tuple(graphs), tuple(breaks), _targets.policy_targets(opts),
        opts.target_compute_capabilities is not None, _engines(opts), _fastest(opts),
    )


def describe_plan(index: int, aten_nodes: int, plan: Any, model_file: str | None = None) -> GraphInfo:
    """The regions and eager nodes of one PartitionPlan."""
    gm = plan.graph_module
    regions = []
    for name in plan.regions:
        sub = getattr(gm, name)
        nodes = [n for n in sub.graph.nodes if n.op == "call_function"]
        output = next(n for n in sub.graph.nodes if n.op == "output")
        outs = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
        regions.append(RegionInfo(
            index, name, compute_nodes(nodes),
            dict(collections.Counter(_op_name(n.target) for n in nodes).most_common()),
            tuple(_describe(n.meta.get("val")) for n in sub.graph.nodes if n.op == "placeholder"),
            tuple(_describe(getattr(o, "meta", {}).get("val")) for o in outs),
        ))
    by_name = {n.name: n for n in gm.graph.nodes}
    eager = []
    for node_name, _op in plan.eager_ops:
        node = by_name[node_name]
        reason = plan.reasons.get(node_name) or Reason("unknown", "not placed in a region")
        eager.append(EagerNode(index, node_name, _op_name(node.target), reason.rule, reason.message,
                               reason.target, _where(node, model_file)))
    return GraphInfo(index, aten_nodes, tuple(regions), tuple(eager))


# ---- graph breaks -------------------------------------------------------------------------------

_BREAK = re.compile(r"in user code at (?P<file>.+?):(?P<line>\d+)\nGraph Break Reason: (?P<reason>.*?)"
                    r"(?:\n+User code traceback:.*)?\Z", re.S)


@contextlib.contextmanager
def _graph_breaks() -> Iterator[list[GraphBreak]]:
    """Collect Dynamo's graph breaks with their source lines.

    Dynamo logs every break (file, line, reason) to its `graph_breaks` artifact logger; that
    logger is switched on, and kept from printing, for the duration. Breaks it did not report
    (another torch version) are taken from Dynamo's counters, without a source line.
    """
    symbolic_convert, counters = _torch_compat.dynamo_explain_parts()

    found: list[GraphBreak] = []
    before = collections.Counter(counters["graph_break"])
    logger = getattr(symbolic_convert, "graph_break_log", None)
    handler = _Collector(found)
    saved = (logger.level, logger.propagate) if logger is not None else None
    if logger is not None:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
    try:
        yield found
    finally:
        if logger is not None and saved is not None:
            logger.removeHandler(handler)
            logger.setLevel(saved[0])
            logger.propagate = saved[1]
        new = collections.Counter(counters["graph_break"]) - before
        seen = {b.detail for b in found}
        for text in new:
            if not any(text.strip() in d for d in seen):
                found.append(GraphBreak(_summary(text), text.strip()))


class _Collector(logging.Handler):
    def __init__(self, found: list[GraphBreak]) -> None:
        super().__init__(logging.DEBUG)
        self.found = found

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            match = _BREAK.search(record.getMessage())
            if match is None:
                return
            detail = match["reason"].strip()
            item = GraphBreak(_summary(detail), detail, match["file"], int(match["line"]))
            if item not in self.found:
                self.found.append(item)


def _summary(text: str) -> str:
    """The reason's first informative line, with Dynamo's explanation when it gives one."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("Encountered graph break")] or lines or ["?"]
    head = lines[0]
    explanation = next((ln.removeprefix("Explanation:").strip() for ln in lines if ln.startswith("Explanation:")), "")
    return f"{head}: {explanation}" if explanation and explanation not in head else head


# ---- small helpers ------------------------------------------------------------------------------

_SHORT_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
                 "int64": "i64", "int32": "i32", "int8": "i8", "uint8": "u8", "bool": "bool"}
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def _describe(val: Any) -> TensorInfo:
    if isinstance(val, torch.Tensor):
        shape = tuple(int(s) if not isinstance(s, torch.SymInt) or s.node.expr.is_number
                      else str(s.node.expr).replace(" ", "") for s in val.shape)
        return TensorInfo(shape, str(val.dtype).removeprefix("torch."))
    if isinstance(val, torch.SymInt):
        return TensorInfo((), f"SymInt({val.node.expr})")
    return TensorInfo((), type(val).__name__ if val is not None else "unknown")


def _op_name(target: Any) -> str:
    """'aten.addmm' for aten.addmm.default, 'aten.add.Tensor', 'operator.mul' (a size computation)."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target).removesuffix(".default")
    module = str(getattr(target, "__module__", None) or "").lstrip("_")
    name = getattr(target, "__name__", str(target))
    return f"{module}.{name}" if module and module != "builtins" else name


def _where(node: torch.fx.Node, model_file: str | None = None) -> str | None:
    """file:line of the model's code that produced the node: the innermost frame in the file
    that defines the model, else the innermost frame outside torch itself, else the innermost."""
    frames = [(m["file"], m["line"]) for m in _FRAME.finditer(node.meta.get("stack_trace") or "")]
    if not frames:
        return _module_path(node)
    mine = [f for f in frames if model_file and _same_file(f[0], model_file)]
    outside_torch = [f for f in frames if not os.path.abspath(f[0]).startswith(_TORCH_DIR + os.sep)]
    file, line = (mine or outside_torch or frames)[-1]
    return f"{file}:{line}"


_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_ROOT_MODULE = re.compile(r"^L\['[^']*'\]\.?")


def _module_path(node: torch.fx.Node) -> str | None:
    """'layers.0 (TransformerEncoderLayer)': the submodule a node came from, for nodes without a
    source line (those a fused kernel such as the encoder's fast path was decomposed into)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return None
    path, cls = list(stack.values())[-1]
    path = _ROOT_MODULE.sub("", str(path)).replace("['", ".").replace("']", "") or "model"
    return f"{path} ({getattr(cls, '__name__', cls)})"


def _same_file(a: str, b: str) -> bool:
    return os.path.normcase(os.path.abspath(a)) == os.path.normcase(os.path.abspath(b))


def _source_file(model: Any) -> str | None:
    """The file that defines the model's forward (or the function), to find its lines in traces."""
    import inspect

    target = type(model) if isinstance(model, torch.nn.Module) else model
    target = getattr(target, "forward", target) if isinstance(model, torch.nn.Module) else target
    try:
        return inspect.getsourcefile(inspect.unwrap(target))
    except (TypeError, OSError):
        return None


def _engines(opts: Options) -> str:
    if opts.runtime == "onnxruntime":
        return "none: with runtime='onnxruntime' a compile runs the regions' ONNX models"
    if not _targets.can_build(opts):
        from .. import _trt

        if not _trt.available():
            return "none: TensorRT-RTX is not installed; a compile would run the regions in ONNX Runtime"
        return "none: no GPU and no declared target; a compile would run the regions in ONNX Runtime"
    if opts.target_compute_capabilities is not None:
        return f"a compile would build them ahead of time for {_targets.describe(opts.target_compute_capabilities)}"
    return "a compile would build them for this GPU"


def _fastest(opts: Options) -> str:
    """What option fastest would do: nothing is timed here (no engine is built), so the decision
    itself is only known after a compile's first calls."""
    if not opts.fastest:
        return ""
    return ("a compile times each region against inductor's code for it on its first calls (or reads the "
            "timing stored beside its engine) and keeps the faster (a region that is the whole graph: against "
            "inductor's code for Dynamo's whole graph); rtx_backend.recording() shows which, and the times")


def _error(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
