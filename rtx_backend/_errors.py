"""One base exception for the package, so callers can catch everything we raise."""

from __future__ import annotations


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
