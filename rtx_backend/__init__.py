"""trtrtx: a torch.compile backend for NVIDIA TensorRT-RTX, the inference runtime for RTX GPUs.

    compiled = torch.compile(model, backend="trtrtx",
                             options={"target_compute_capabilities": [(7, 5), (8, 6)]})
    with torch.inference_mode():
        y = compiled(x)          # the first call builds the engines

The backend is registered through the `torch_dynamo_backends` entry point; importing this
package is not needed to compile. Import it for the tools:

    explain(model, *inputs, options=...)    what would be lowered, and why the rest is not; no build
    recording()                             with-block: where each compiled region ran, and why
    crosscheck(model, *inputs, options=...) every region in PyTorch, ONNX Runtime and TensorRT-RTX
    Options                                 every option, its default and meaning (help(Options))
    set_default_options(options)            options for compiles given mode= only (Hugging Face's
    default_options(options)                CompileConfig): for the process, or a with-block
    stats(), reset_stats()                  event counters: compiles, engine builds, cache hits
    preload()                               pay one-time costs up front (a server's start-up)
    save_runtime_cache()                    write TensorRT-RTX's JIT kernel cache now
    wait_for_updates()                      wait until engines have the weights changed since compile,
                                            and engines built in the background are in place
    save(model, inputs, path, options=...)  a .pt2 of the compiled model (engines inside)
    load(path)                              that .pt2, checked, ready to run (no trace, no build)

`torch.compile(..., mode="reduce-overhead")` turns on TensorRT-RTX's own CUDA graphs. From a
shell: `python -m rtx_backend info` (what is installed, whether engines run on this GPU) and
`python -m rtx_backend clear-cache`. Errors derive from RtxBackendError. The README and docs/
(design.md, caches.md, performance.md) of the source distribution say more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _stats
from ._defaults import default_options, set_default_options
from ._errors import (
    BuildError,
    CudaGraphError,
    OptionsError,
    PackageError,
    RtxBackendError,
    RuntimeUnavailableError,
    TargetError,
)
from ._options import Options
from ._stats import reset_stats
from .assemble import package_op as _package_op  # noqa: F401  (registers the trtrtx::engine op)
from .assemble.package import load
from .assemble.updates import wait_for_updates
from .cache import store as _store
from .lower import decompositions as _decompositions
from .tools.recording import EagerRecord, FastestRecord, GraphRecord, Recording, RegionRecord, recording

if TYPE_CHECKING:
    from ._backend import trtrtx
    from .run.runtime_cache import save_runtime_cache
    from .tools.crosscheck import CrosscheckReport, crosscheck
    from .tools.explain import ExplainReport, explain
    from .tools.preload import preload
    from .tools.save import save

# What only compiling needs (Dynamo, aot_autograd, the ONNX exporter) is imported on first use of
# these names, so that a process that loads a saved package (`load`) does not pay for it.
_LAZY = {
    "trtrtx": "_backend",
    "CrosscheckReport": "tools.crosscheck",
    "crosscheck": "tools.crosscheck",
    "ExplainReport": "tools.explain",
    "explain": "tools.explain",
    "preload": "tools.preload",
    "save_runtime_cache": "run.runtime_cache",
    "save": "tools.save",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rtx_backend' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__version__ = "0.1.0"


def stats() -> dict[str, int]:
    """A snapshot of the event counters (compiles, engine builds, cache hits and stores). Cache
    files are written behind the compile, so it first waits for the writes submitted so far: the
    store counts are then complete."""
    _store.flush()
    return _stats.stats()


_decompositions.register_missing_meta_kernels()  # before Dynamo traces a model for us

__all__ = [
    "BuildError",
    "CudaGraphError",
    "CrosscheckReport",
    "EagerRecord",
    "FastestRecord",
    "GraphRecord",
    "ExplainReport",
    "Options",
    "OptionsError",
    "PackageError",
    "Recording",
    "RegionRecord",
    "RtxBackendError",
    "RuntimeUnavailableError",
    "TargetError",
    "crosscheck",
    "default_options",
    "explain",
    "load",
    "preload",
    "recording",
    "reset_stats",
    "save",
    "save_runtime_cache",
    "set_default_options",
    "stats",
    "trtrtx",
    "wait_for_updates",
]
