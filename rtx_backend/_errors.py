"""One base exception for the package, so callers can catch everything we raise."""

from __future__ import annotations

from collections.abc import Mapping


class RtxBackendError(RuntimeError):
    """Base class of every error raised by rtx_backend."""


class OptionsError(RtxBackendError, ValueError):
    """An `options=` dict holds an unknown key or a bad value."""


class TargetError(RtxBackendError, ValueError):
    """A declared compute capability cannot be built for by the installed TensorRT-RTX."""


class BuildError(RtxBackendError):
    """A region failed to export, parse or build."""


class RuntimeUnavailableError(RtxBackendError):
    """The requested runtime cannot run on this machine."""


class RegionRefused(BuildError):
    """The ONNX screen found nodes of a region that TensorRT-RTX cannot take.

    `reasons` maps FX node name -> _policy.Reason. The backend catches it and partitions again
    with those nodes in PyTorch; anything else treats it as a failed build.
    """

    def __init__(self, reasons: Mapping[str, object]) -> None:
        self.reasons = dict(reasons)
        shown = "; ".join(f"{name}: {why}" for name, why in list(self.reasons.items())[:3])
        more = f" (+{len(self.reasons) - 3} more)" if len(self.reasons) > 3 else ""
        super().__init__(f"TensorRT-RTX cannot take {len(self.reasons)} node(s) of the region: {shown}{more}")


class CudaGraphError(RtxBackendError):
    """An engine cannot be recorded by the CUDA graph that the caller is capturing."""


class PackageError(RtxBackendError):
    """A saved package (`rtx_backend.save`) cannot be loaded or run here: damaged, not ours,
    written for other GPUs or another TensorRT-RTX, or asked for shapes it holds no engine for."""
