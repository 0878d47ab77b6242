"""A static region as the ExportedProgram that torch.export would make of it, without tracing it again.

The ONNX exporter translates an ExportedProgram. torch.export makes one by tracing the region
once more (non-strict: make_fx under fake tensors and functionalization), which gives back what
the region already is: a functional ATen graph whose every node carries its fake value, the
frozen weights lifted to constant inputs. That trace is 1.2 s of BERT-base's cold compile and
1.5 s of ViT-B/16's on the H200.

So a region with static shapes whose inputs are all tensors becomes an ExportedProgram here
directly: a copy of its graph whose get_attr constants are placeholders (lifted as torch.export
lifts them: constant inputs first, under their attribute names), with the graph signature that
says so. torch.export still exports every other region (dynamic shapes, SymInt inputs, an output
that is not a computed tensor of its own), and any region this module cannot read
(`direct_program` returns None, the bridge counts it). ExportedProgram's own verifier checks
what is made here. The program is built with torch.export's own classes (ExportedProgram, its
graph signature and module call graph; its tree specs are pytree's, as torch.export's are).
"""

from __future__ import annotations

import operator
import re
from typing import Any

import torch
from torch.export import graph_signature as sig
from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature

from .. import _torch_compat


def _static(val: Any) -> bool:
    return isinstance(val, torch.Tensor) and all(isinstance(s, int) for s in val.shape)


def direct_program(gm: torch.fx.GraphModule, prefix: str) -> torch.export.ExportedProgram | None:
    """`gm` (a region: tensors in, tensors out) as an ExportedProgram whose constant `c` is the
    buffer `prefix + c` (as torch.export names them through the bridge's wrapper); None where it
    is not a static region of the kind this builds (torch.export then exports it)."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    output = nodes[-1]
    if output.op != "output" or not placeholders:
        return None
    results = output.args[0]
    if not isinstance(results, (tuple, list)) or not results:
        return None
    if not all(_static(n.meta.get("val")) for n in placeholders):
        return None
    for node in nodes:  # every value known and static (the bridge's own rewrites keep them)
        val = node.meta.get("val")
        if node.op == "call_function" and val is None:
            return None
        if isinstance(val, torch.SymInt) or (isinstance(val, torch.Tensor) and not _static(val)):
            return None
    if not all(isinstance(r, torch.fx.Node) and r.op == "call_function" for r in results) or len(set(results)) != len(results):
        return None
    fake_mode = getattr(placeholders[0].meta["val"], "fake_mode", None)
    if fake_mode is None:
        return None

    graph = torch.fx.Graph()
    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    buffers: dict[str, torch.Tensor] = {}
    specs: list[sig.InputSpec] = []
    taken: set[str] = set()
    lifted_by_target: dict[str, torch.fx.Node] = {}
    for node in nodes:  # constants first, as torch.export lifts them: once per attribute
        if node.op != "get_attr":
            continue
        if str(node.target) in lifted_by_target:
            copies[node] = lifted_by_target[str(node.target)]
            continue
        value = operator.attrgetter(str(node.target))(gm)  # (a dotted path: "sub.weight")
        if not isinstance(value, torch.Tensor):
            return None
        target = prefix + str(node.target)
        name = _placeholder_name(target, taken)
        lifted = graph.placeholder(name)
        lifted.meta.update(node.meta)
        lifted.meta["val"] = fake_mode.from_tensor(value, static_shapes=True)
        copies[node] = lifted_by_target[str(node.target)] = lifted
        buffers[target] = value
        specs.append(sig.InputSpec(sig.InputKind.BUFFER, sig.TensorArgument(name), target, persistent=True))
    for node in placeholders:
        copied = graph.node_copy(node, lambda n: copies[n])
        copies[node] = copied
        specs.append(sig.InputSpec(sig.InputKind.USER_INPUT, sig.TensorArgument(copied.name), None))
    for node in nodes:
        if node.op == "call_function":
            copied = graph.node_copy(node, lambda n: copies[n])
            copied.meta.setdefault("nn_module_stack", {})  # (the exporter warns for every node without one)
            # The screen maps ONNX nodes back to region nodes: through torch.export's trace, by the
            # line of the region's code in the stack trace; here each node keeps the region node's
            # own name, which the exporter records (build/screen.py, fx_node_name).
            copied.meta.pop("stack_trace", None)
            copies[node] = copied
        elif node.op not in ("placeholder", "get_attr", "output"):
            return None  # call_module or call_method: not an ATen graph
    outputs = [copies[r] for r in results]
    graph.output(tuple(outputs))
    signature = sig.ExportGraphSignature(
        input_specs=specs,
        output_specs=[sig.OutputSpec(sig.OutputKind.USER_OUTPUT, sig.TensorArgument(o.name), None) for o in outputs],
    )
    root = torch.fx.GraphModule(torch.nn.Module(), graph)
    # the calling convention torch.export records: forward(*tensors) returns a tuple of them
    names = [f"tensors_{k}" for k in range(len(placeholders))]
    call = ModuleCallSignature(
        inputs=[], outputs=[], in_spec=_torch_compat.tree_flatten((tuple(names), {}))[1],
        out_spec=_torch_compat.tree_flatten(tuple(outputs))[1], forward_arg_names=names,
    )
    return torch.export.ExportedProgram(
        root=root, graph=root.graph, graph_signature=signature, state_dict=buffers, range_constraints={},
        module_call_graph=[ModuleCallEntry(fqn="", signature=call)],
    )


def _placeholder_name(target: str, taken: set[str]) -> str:
    base = "b_" + re.sub(r"\W", "_", target)
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name
