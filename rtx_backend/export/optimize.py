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
matches nothing either way. The optimized model is the same; where this onnxscript's rewriter
is not laid out as expected, the optimizer runs as it is.
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
    from onnxscript.rewriter import _basics, _matcher

    class AnchoredMatcher(_matcher.SimplePatternMatcher):  # type: ignore[misc]
        def match(self, model: Any, graph_or_function: Any, node: Any, **kwargs: Any) -> Any:
            first = self.pattern.output_nodes[0]
            if not (first.op.matches(node.op_type) and first.domain.matches(node.domain)):
                return _basics.MatchResult().fail("No match found.")
            return super().match(model, graph_or_function, node, **kwargs)

    return AnchoredMatcher
