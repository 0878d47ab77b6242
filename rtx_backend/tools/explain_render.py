"""The text form of an explain report: a header and three compact tables.

    trtrtx explain: 2 graph(s), 1 graph break(s), 2 region(s), 1 node(s) kept in PyTorch
    targets: SM7.5 (declared); engines: a compile would build them ahead of time for SM7.5
    kept in PyTorch, by rule (the detail is below):
      rule              nodes  target  what to do
      fp32-gemm-turing  1      SM7.5   run the model in FP16 (model.half(), FP16 inputs): ...
    graph breaks (Dynamo split the model here; each graph is compiled on its own):
      #  where        reason
      1  model.py:12  Call to `torch._dynamo.graph_break()`: User-inserted graph break. ...
    regions (one TensorRT-RTX engine each):
      graph  region           nodes  inputs     outputs    ops
      0      trtrtx_region_0  3      f16[8,16]  f16[8,16]  addmm, relu, add.Tensor
    kept in PyTorch:
      graph  node   op          rule              target  where        reason
      1      addmm  aten.addmm  fp32-gemm-turing  SM7.5   model.py:14  TensorRT-RTX cannot run ...
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

MAX_CELL = 72


def render(report: Any) -> str:
    regions, eager = report.regions, report.eager_nodes
    lines = [
        f"trtrtx explain: {len(report.graphs)} graph(s), {len(report.graph_breaks)} graph break(s), "
        f"{len(regions)} region(s), {len(eager)} node(s) kept in PyTorch",
        f"targets: {_targets(report)}; engines: {report.engines}",
    ]
    if report.fastest:
        lines.append(f"fastest: {report.fastest}")
    if report.rules:
        lines.append("kept in PyTorch, by rule (the detail is below):")
        rows_: list[tuple[str, ...]] = [(r.rule, str(r.nodes), ", ".join(f"SM{a}.{b}" for a, b in r.targets) or "-",
                                         r.fix) for r in report.rules]
        lines += _table(("rule", "nodes", "target", "what to do"), rows_, last_unbounded=True)
    if report.graph_breaks:
        lines.append("graph breaks (Dynamo split the model here; each graph is compiled on its own):")
        rows: list[tuple[str, ...]] = [(str(i), _short_path(b.where), b.reason) for i, b in enumerate(report.graph_breaks, 1)]
        lines += _table(("#", "where", "reason"), rows, last_unbounded=True)
    for g in report.graphs:
        if g.error:
            runs_in = "inductor" if g.rest.startswith("inductor") else "PyTorch"
            lines.append(f"graph {g.index} could not be lowered and runs in {runs_in}: {g.error}")
        elif g.rest:
            lines.append(f"graph {g.index}: what stays outside the regions runs in {g.rest}")
    if regions:
        lines.append("regions (one TensorRT-RTX engine each):")
        rows = [(str(r.graph), r.name, str(r.nodes), _join(map(str, r.inputs)), _join(map(str, r.outputs)),
                 _ops(r.ops)) for r in regions]
        lines += _table(("graph", "region", "nodes", "inputs", "outputs", "ops"), rows)
    else:
        lines.append("regions: none; nothing runs on TensorRT-RTX")
    if eager:
        lines.append("kept in PyTorch:")
        rows = [(str(n.graph), n.node, n.op, n.rule, _target(n.target), _short_path(n.where), n.message)
                for n in eager]
        lines += _table(("graph", "node", "op", "rule", "target", "where", "reason"), rows, last_unbounded=True)
    return "\n".join(lines)


def _targets(report: Any) -> str:
    names = ", ".join(f"SM{a}.{b}" for a, b in report.targets)
    if report.targets_declared:
        return f"{names} (declared)"
    if report.targets:
        return f"{names} (this GPU)"
    return "none (no GPU, no declared target: only rules that hold for every GPU apply)"


def _target(target: Any) -> str:
    return f"SM{target[0]}.{target[1]}" if target else "-"


def _ops(ops: dict[str, int]) -> str:
    return _join(f"{op.removeprefix('aten.')}" + (f" x{n}" if n > 1 else "") for op, n in ops.items())


def _join(items: Any) -> str:
    """Whole items, comma-separated, up to about MAX_CELL characters; then how many more."""
    items = list(items)
    shown: list[str] = []
    for i, item in enumerate(items):
        if shown and len(", ".join([*shown, item])) > MAX_CELL:
            return ", ".join(shown) + f", +{len(items) - i} more"
        shown.append(item)
    return ", ".join(shown)


def _short_path(where: str | None) -> str:
    if not where or where == "?":
        return "?"
    return os.path.basename(where)


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], *, last_unbounded: bool = False) -> list[str]:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(head)]
    if last_unbounded:
        widths[-1] = 0
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [tuple(head), *rows]]
