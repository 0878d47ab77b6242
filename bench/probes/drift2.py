"""GPU probe, second step: which change makes ResNet-50 FP32 batch-1 results repeat? Scratch memory
sizes and allocation strategies of the executor, patched in; then the full text of the dynamic
encoder's torch.export error."""

from __future__ import annotations

import sys

from rtx_backend import _trt
from rtx_backend.export import bridge as _onnx_bridge
from rtx_backend.run import executors as _executors

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from drift import calls, encoder, resnet50_fp32


def main() -> None:
    model, x, ref = resnet50_fp32()
    base = {"engine_cache_dir": "", "runtime_cache_path": "", "validate": False}
    init = _executors.TrtExecutor.__init__

    for factor in (1, 4):
        def patched(self, *a, factor=factor, **k):
            init(self, *a, **k)
            print("device_memory_size_v2", self._memory_size, "x", factor, flush=True)
            self._memory_size *= factor
        _executors.TrtExecutor.__init__ = patched
        calls(model, x, ref, **base)
    _executors.TrtExecutor.__init__ = init

    make = _executors.TrtExecutor._make_binding

    def static(self, native, spec):
        trt = _trt.trt()
        b = make(self, native, spec)
        config = self.engine.create_runtime_config()
        config.dynamic_shapes_kernel_specialization_strategy = getattr(
            trt.DynamicShapesKernelSpecializationStrategy, spec.upper())
        b.context = self.engine.create_execution_context(config)  # default allocation: STATIC
        return b

    _executors.TrtExecutor._make_binding = static
    _executors.TrtExecutor._bind_memory = lambda self, b, capturing: None
    calls(model, x, ref, **base)
    _executors.TrtExecutor._make_binding = make

    _onnx_bridge._first_line = lambda exc: f"{type(exc).__name__}: {exc}"
    encoder(base)

if __name__ == "__main__":
    main()
