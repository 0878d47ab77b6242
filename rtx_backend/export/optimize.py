"""The exporter's ONNX optimizer, with each rewrite rule anchored on its pattern's op.

`ONNXProgram.optimize` runs onnxscript's `optimize_ir`, whose rewrite pass tries every rule (46)
on every node. For a rule whose pattern has several output nodes (SlicesSplit: two Slices of
one tensor become a Split) onnxscript's matcher first indexes the whole graph by op type, for
every node it is tried on, before it checks that node's op: quadratic in the graph's size. On
HF BERT-base (1,574 nodes) that rule took 1.0 s of the rewrite pass's 2.3 s and matched
nothing; on a Llama 1B the pass took 15 s. Every other failing try still builds and fails a
match result (some 20 us each, 80,000 tries for BERT).

Here the optimizer runs with the same rules in the same order, each one's matcher behind a
check of the node's op type and domain against the pattern's (first) output node: the check
that the matcher makes first for every node or combination it tries, so a node that fails it
matches nothing either way.

A node of the right op still made the multi-output matcher index the graph and try it with
every other node of the pattern's next op (every Slice of the graph, for each Slice: on
torchvision's Swin-T, 0.4 s of the CPU's 2.3 s optimizing, for no match). Where the pattern
reads one variable in both nodes (SlicesSplit's `x`), only the nodes that read the tensor the
first node reads, at that input, can match: those are tried alone, and where several match, the
one that comes first in the graph is taken, as onnxscript's search takes it.

The optimized model is the same; where this onnxscript's rewriter is not laid out as expected,
the optimizer runs as it is.
"""

from __future__ import annotations

import copy
import functools
import logging
import threading
from typing import Any

log = logging.getLogger("rtx_backend")

_SWAP = threading.Lock()  # the default rule set is a module attribute of onnxscript's rewriter


def optimize(program: Any) -> None:
    """`program.optimize()` (an ONNXProgram), with the rewrite rules anchored."""
    rules = anchored_rules()
    if rules is None:
        program.optimize()
        return
    from onnxscript import rewriter

    with _SWAP:
        default = rewriter._DEFAULT_REWRITE_RULES
        rewriter._DEFAULT_REWRITE_RULES = rules
        try:
            program.optimize()
        finally:
            rewriter._DEFAULT_REWRITE_RULES = default


@functools.cache
def anchored_rules() -> tuple[Any, ...] | None:
    """onnxscript's default rewrite rules, each one matched by SimplePatternMatcher behind its
    anchor check; None where this onnxscript's rules or matcher are not as expected."""
    try:
        from onnxscript import rewriter
        from onnxscript.rewriter import _matcher

        anchored = []
        changed = False
        for rule in rewriter._DEFAULT_REWRITE_RULES:
            matcher = rule._matcher
            if type(matcher) is not _matcher.SimplePatternMatcher or not matcher.pattern.output_nodes:
                anchored.append(rule)
                continue
            copied = copy.copy(rule)
            copied._matcher = _anchored_matcher()(matcher.pattern)
            anchored.append(copied)
            changed = True
        return tuple(anchored) if changed else None
    except Exception as exc:  # a rewriter laid out otherwise: the optimizer runs as it is
        log.debug("trtrtx: ONNX rewrite rules not anchored (%s: %s)", type(exc).__name__, exc)
        return None


@functools.cache
def _anchored_matcher() -> type:
    """onnxscript's SimplePatternMatcher, refusing a node whose op is not the pattern's first
    output node's before it indexes the graph (see the module docstring)."""
    import itertools

    import onnx_ir as ir
    from onnxscript.rewriter import _basics, _matcher, _pattern_ir

    class AnchoredMatcher(_matcher.SimplePatternMatcher):  # type: ignore[misc]
        def match(self, model: Any, graph_or_function: Any, node: Any, *, verbose: int = 0,
                  remove_nodes: bool = True, tracer: Any = None) -> Any:
            first = self.pattern.output_nodes[0]
            if not (first.op.matches(node.op_type) and first.domain.matches(node.domain)):
                return _basics.MatchResult().fail("No match found.")
            if not self.pattern.has_single_output_node:
                narrowed = self.narrowed(node)
                if narrowed is not None:
                    self._tracer = tracer
                    self._graph = graph_or_function if isinstance(graph_or_function, ir.Graph) \
                        else graph_or_function.graph
                    found = self.first_match(graph_or_function, node, narrowed, verbose, remove_nodes)
                    if found is not None:
                        return found
            return super().match(model, graph_or_function, node, verbose=verbose, remove_nodes=remove_nodes,
                                 tracer=tracer)

        def narrowed(self, node: Any) -> list[list[Any]] | None:
            """For each further output node of the pattern, the nodes of `node`'s graph that can
            match it once `node` matches the first: those reading, at the same input, the tensor
            that `node` reads where the pattern has one variable in both. None where a further
            output node shares no variable with the first or has no fixed op."""
            first = self.pattern.output_nodes[0]
            out = []
            for other in self.pattern.output_nodes[1:]:
                shared = next(((i, j) for i, a in enumerate(first.inputs) for j, b in enumerate(other.inputs)
                               if a is b and isinstance(a, _pattern_ir.Var)), None)
                op = other.op_identifier()
                if shared is None or op is None or shared[0] >= len(node.inputs) or node.inputs[shared[0]] is None:
                    return None
                i, j = shared
                users = {u.node for u in node.inputs[i].uses()
                         if u.idx == j and u.node.graph is node.graph and u.node.op_identifier() == op}
                out.append(list(users))
            return out

        def first_match(self, graph_or_function: Any, node: Any, narrowed: list[list[Any]], verbose: int,
                        remove_nodes: bool) -> Any:
            """The match onnxscript's search finds among the narrowed combinations: the only one
            that matches, or for a pattern of two output nodes the one whose second node comes
            first in the graph (onnxscript tries them in the graph's order). A failed match when
            none does; None (search as onnxscript does) when several do in a larger pattern."""
            matched = []
            for combination in itertools.product([node], *narrowed):
                self._init_match(verbose)
                if self._multi_match(combination, check_removable=remove_nodes):
                    matched.append(combination)
            if not matched:
                return _basics.MatchResult().fail("No match found.")
            if len(matched) > 1:
                if len(narrowed) != 1:
                    return None
                seconds = {c[1]: c for c in matched}
                matched = [seconds[next(n for n in graph_or_function if n in seconds)]]
            self._init_match(verbose)  # (the matcher's state is the match it returns, as onnxscript leaves it)
            return self._multi_match(matched[0], check_removable=remove_nodes)

    return AnchoredMatcher
