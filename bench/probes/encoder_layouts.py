"""GPU probe: does the layout of the attention's inputs in the ONNX graph decide the encoder's
engine time (6x768, batch 16, sequence 256, FP16)? TensorRT-RTX 1.4.0 spends 50 of its 884 us
per call on Myelin kernels that move the packed QKV projection into the fused attention's layout
(`encoder_kernels.py`). nn.MultiheadAttention's export does one Gemm for Q, K and V, reshapes it
to [B, S, 3, H, D], transposes that to [3, B, H, S, D] and slices; K is transposed again for the
scores. Variants of the exported region, each built and timed in our executor:

    packed:  as exported
    split:   Reshape to [B, S, 3, H, D], Split on the 3, then each [B, S, H, D] -> [B, H, S, D]
    gemms:   three Gemms (the weight's row blocks), each reshaped and transposed on its own, K
             straight to [B, H, D, S]
    attention_op: the scores, softmax and weighted sum as one ONNX Attention node (opset 23)

    python bench/probes/encoder_layouts.py           # on the GPU
    python bench/probes/encoder_layouts.py MODEL.onnx  # on CPU: ONNX Runtime checks the variants
"""

from __future__ import annotations

import collections
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper


def _users(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    users: dict[str, list[onnx.NodeProto]] = collections.defaultdict(list)
    for node in graph.node:
        for name in node.input:
            users[name].append(node)
    return users


def _const(graph: onnx.GraphProto, name: str) -> np.ndarray | None:
    for init in graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    return None


def _packed_qkv(graph: onnx.GraphProto) -> list[tuple[onnx.NodeProto, ...]]:
    """(gemm, reshape, transpose, [slice, squeeze] x3) for each packed projection."""
    users = _users(graph)
    found = []
    for gemm in graph.node:
        if gemm.op_type != "Gemm" or len(users[gemm.output[0]]) != 1:
            continue
        reshape = users[gemm.output[0]][0]
        shape = _const(graph, reshape.input[1]) if reshape.op_type == "Reshape" else None
        if shape is None or len(shape) != 5 or shape[2] != 3:
            continue
        (transpose,) = users[reshape.output[0]]
        perm = [a.ints for a in transpose.attribute if a.name == "perm"]
        if transpose.op_type != "Transpose" or list(perm[0]) != [2, 0, 3, 1, 4]:
            continue
        slices = sorted(users[transpose.output[0]], key=lambda n: int(_const(graph, n.input[1])[0]))
        squeezes = [users[s.output[0]][0] for s in slices]
        if len(slices) == 3 and all(s.op_type == "Squeeze" for s in squeezes):
            found.append((gemm, reshape, transpose, *slices, *squeezes))
    return found


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.ModelProto.FromString(model.SerializeToString())


def _insert(graph: onnx.GraphProto, at: int, nodes: list[onnx.NodeProto]) -> None:
    """Put `nodes` into the graph's node list at index `at`, in order."""
    for k, node in enumerate(nodes):
        graph.node.insert(at + k, node)


def split_variant(model: onnx.ModelProto) -> onnx.ModelProto:
    model = _copy(model)
    graph = model.graph
    for n, (_gemm, reshape, transpose, *rest) in enumerate(_packed_qkv(graph)):
        squeezes = rest[3:]
        for node in (transpose, *rest):
            graph.node.remove(node)
        parts = [f"qkv{n}_part{i}" for i in range(3)]
        graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), f"qkv{n}_axis"))
        new = [helper.make_node("Split", [reshape.output[0]], parts, axis=2, num_outputs=3)]
        for i, squeeze in enumerate(squeezes):
            new.append(helper.make_node("Squeeze", [parts[i], f"qkv{n}_axis"], [f"{parts[i]}_sq"]))
            new.append(helper.make_node("Transpose", [f"{parts[i]}_sq"], [squeeze.output[0]], perm=[0, 2, 1, 3]))
        _insert(graph, list(graph.node).index(reshape) + 1, new)
    return model


def gemms_variant(model: onnx.ModelProto) -> onnx.ModelProto:
    model = _copy(model)
    graph = model.graph
    for n, (gemm, reshape, transpose, *rest) in enumerate(_packed_qkv(graph)):
        squeezes = rest[3:]
        shape = _const(graph, reshape.input[1])
        weight = _const(graph, gemm.input[1])
        bias = _const(graph, gemm.input[2]) if len(gemm.input) > 2 else None
        transb = any(a.name == "transB" and a.i == 1 for a in gemm.attribute)
        e = shape[3] * shape[4]
        at = list(graph.node).index(gemm)
        for node in (gemm, reshape, transpose, *rest):
            graph.node.remove(node)
        graph.initializer.append(numpy_helper.from_array(np.array([*shape[:2], *shape[3:]], np.int64), f"qkv{n}_shape"))
        users = _users(graph)
        new = []
        for i, squeeze in enumerate(squeezes):
            w = weight[i * e:(i + 1) * e] if transb else weight[:, i * e:(i + 1) * e]
            graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(w), f"qkv{n}_w{i}"))
            inputs = [gemm.input[0], f"qkv{n}_w{i}"]
            if bias is not None:
                graph.initializer.append(numpy_helper.from_array(bias[i * e:(i + 1) * e].copy(), f"qkv{n}_b{i}"))
                inputs.append(f"qkv{n}_b{i}")
            new.append(helper.make_node("Gemm", inputs, [f"qkv{n}_y{i}"], transB=int(transb)))
            new.append(helper.make_node("Reshape", [f"qkv{n}_y{i}", f"qkv{n}_shape"], [f"qkv{n}_r{i}"]))
            # K: Reshape [BH, S, D] -> Transpose -> Reshape [B, H, D, S] becomes one Transpose
            kpath = _k_path(graph, users, squeeze.output[0])
            if kpath is not None:
                for node in kpath:
                    graph.node.remove(node)
                new.append(helper.make_node("Transpose", [f"qkv{n}_r{i}"], [kpath[-1].output[0]], perm=[0, 2, 3, 1]))
            else:
                new.append(helper.make_node("Transpose", [f"qkv{n}_r{i}"], [squeeze.output[0]], perm=[0, 2, 1, 3]))
        _insert(graph, at, new)
    return model


def _k_path(graph: onnx.GraphProto, users: dict, name: str) -> list[onnx.NodeProto] | None:
    if len(users[name]) != 1 or users[name][0].op_type != "Reshape":
        return None
    first = users[name][0]
    nxt = users[first.output[0]]
    if len(nxt) != 1 or nxt[0].op_type != "Transpose":
        return None
    second = users[nxt[0].output[0]]
    if len(second) != 1 or second[0].op_type != "Reshape":
        return None
    shape = _const(graph, second[0].input[1])
    perm = [list(a.ints) for a in nxt[0].attribute if a.name == "perm"]
    if shape is None or len(shape) != 4 or perm != [[0, 2, 1]]:
        return None
    return [first, nxt[0], second[0]]


def attention_variant(model: onnx.ModelProto) -> onnx.ModelProto:
    """Mul(q, s), Mul(K^T, s), MatMul, Softmax, MatMul -> one ONNX Attention (opset 23) on q, K
    and v, scale s*s: TensorRT-RTX's parser makes it an IAttention layer."""
    model = _copy(model)
    graph = model.graph
    producers = {o: n for n in graph.node for o in n.output}
    users = _users(graph)
    for n, second in enumerate([n for n in graph.node if n.op_type == "MatMul"]):
        softmax = producers.get(second.input[0])
        first = producers.get(softmax.input[0]) if softmax is not None and softmax.op_type == "Softmax" else None
        if first is None or first.op_type != "MatMul":
            continue
        mq, mk = producers.get(first.input[0]), producers.get(first.input[1])
        if mq is None or mk is None or mq.op_type != "Mul" or mk.op_type != "Mul":
            continue
        scale = float(_const(graph, mq.input[1]).reshape(-1)[0]) * float(_const(graph, mk.input[1]).reshape(-1)[0])
        reshape_back = producers.get(mk.input[0])  # Reshape(Transpose(Reshape(k)))
        transpose = producers.get(reshape_back.input[0]) if reshape_back is not None else None
        reshape_in = producers.get(transpose.input[0]) if transpose is not None else None
        if reshape_in is None or reshape_in.op_type != "Reshape":
            continue
        k = reshape_in.input[0]
        dead = [mq, mk, first, softmax, second]
        if all(len(users[x.output[0]]) == 1 for x in (reshape_in, transpose, reshape_back)):
            dead += [reshape_in, transpose, reshape_back]
        at = list(graph.node).index(second)
        attention = helper.make_node("Attention", [mq.input[0], k, second.input[1]], [second.output[0]],
                                     name=f"attention_{n}", scale=scale)
        graph.node.insert(at, attention)
        for node in dead:
            graph.node.remove(node)
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = max(opset.version, 23)
    return model


VARIANTS: dict[str, Callable[[onnx.ModelProto], onnx.ModelProto]] = {
    "packed": lambda m: m, "split": split_variant, "gemms": gemms_variant, "attention_op": attention_variant}


def check_on_cpu(path: str) -> None:
    import onnxruntime as ort

    model = onnx.load(path)
    print("packed projections found:", len(_packed_qkv(model.graph)))
    feeds = None
    ref = None
    for name, make in VARIANTS.items():
        variant = make(model)
        onnx.checker.check_model(variant)
        session = ort.InferenceSession(variant.SerializeToString(), providers=["CPUExecutionProvider"])
        if feeds is None:
            rng = np.random.default_rng(0)
            feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
                     for i in variant.graph.input}
        out = session.run(None, feeds)[0]
        ref = out if ref is None else ref
        ops = collections.Counter(n.op_type for n in variant.graph.node)
        print(f"{name}: max diff to packed {np.abs(out - ref).max():.3g}, ops {dict(ops)}")


def main() -> None:
    if len(sys.argv) > 1:
        check_on_cpu(sys.argv[1])
        return
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from encoder_knobs import attention_layers, build, encoder_region, engine_ms

    from rtx_backend._options import Options
    from rtx_backend.run.executors import TrtExecutor

    x, ref, region = encoder_region()
    exported = onnx.load_from_string(region.onnx.model)
    print("packed projections found:", len(_packed_qkv(exported.graph)), flush=True)
    options = Options.from_dict({"engine_cache_dir": ""})
    times: dict[str, list[float]] = collections.defaultdict(list)
    executors = {}
    for name, make in VARIANTS.items():
        try:
            executors[name] = TrtExecutor(build(make(exported).SerializeToString(), {}), region.onnx, options, name)
            with torch.inference_mode():
                err = (executors[name]([x])[0].float() - ref.float()).abs().max().item()
            print(f"{name}: max diff to trtrtx's engine {err:.3g}, attention {attention_layers(executors[name])[:2]}",
                  flush=True)
        except Exception as exc:
            print(f"{name}: failed: {type(exc).__name__}: {exc}", flush=True)
    with torch.inference_mode():
        for _ in range(3):  # interleaved rounds
            for name, executor in executors.items():
                times[name].append(engine_ms(executor, x, rounds=3))
    for name, samples in times.items():
        print(f"{name}: {statistics.median(samples):.3f} ms (rounds {[round(t, 3) for t in samples]})")


if __name__ == "__main__":
    main()
