"""What to do about each rule that keeps nodes in PyTorch: explain's summary, the README's table
and the compile-time warning when declared targets rule out a whole graph."""

from __future__ import annotations

# What to do about each rule that keeps nodes in PyTorch (explain's summary; the README's table).
FIXES: dict[str, str] = {
    "fp32-gemm-turing": "run the model in FP16 (model.half(), FP16 inputs): Turing runs FP16 GEMMs; "
                        "or leave (7, 5) out of target_compute_capabilities",
    "fp32-conv-transpose3d-turing": "run the model in FP16; or leave (7, 5) out of target_compute_capabilities",
    "conv3d-turing": "nothing on Turing (3D convolutions run in PyTorch there); leave (7, 5) out of "
                     "target_compute_capabilities to lower them",
    "bf16-turing": "run the model in FP16 instead of bfloat16; or leave (7, 5) out of target_compute_capabilities",
    "fp8": "declare only SM 8.9 and newer targets, or run the model in FP16",
    "fp4": "declare only SM 12.0 and newer targets, or run the model in FP16",
    "fp64": "run the model in float32 or float16; or set truncate_double=True (float64 computed in float32 "
            "inside the engines)",
    "fp64-scalar": "set torch._dynamo.config.specialize_float = True (Python floats become constants), "
                   "or leave it: exact float64 arithmetic on scalars costs little in PyTorch",
    "strided-dilated-conv-transpose": "nothing: TensorRT-RTX builds no transposed convolution that is both "
                                      "strided and dilated, so that node runs in PyTorch",
    "complex": "nothing: TensorRT-RTX has no complex dtypes, so these run in PyTorch",
    "min_block_size": "lower min_block_size (each engine call has a fixed cost)",
    "torch_executed_ops": "remove the op from torch_executed_ops",
    "weights-only": "nothing: computed from weights for an op kept in PyTorch, it goes with that op",
    "not-exportable": "nothing: the ONNX exporter has no translation for the op",
    "not-aten": "nothing: host arithmetic, usually sizes of dynamic shapes",
    "not-an-op": "nothing",
    "mutation": "use the out-of-place op",
    "unknown-metadata": "nothing: refused rather than guessed",
    "data-dependent-shape": "nothing: a shape that depends on the values (nonzero, unique) runs in PyTorch",
    "parser-unsupported": "nothing: TensorRT-RTX's ONNX parser has no such node",
}


# Rules of the capability policy for a target: the nodes they keep out split the regions, and
# the min_block_size rows that follow mostly go away with them.
FOLLOW_ON = ("min_block_size", "weights-only")  # rules whose nodes follow from other nodes' rules


TARGET_RULES = ("fp32-gemm-turing", "fp32-conv-transpose3d-turing", "conv3d-turing", "bf16-turing", "fp8", "fp4")
