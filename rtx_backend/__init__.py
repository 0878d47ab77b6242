"""trtrtx: a torch.compile backend for NVIDIA TensorRT-RTX.

    compiled = torch.compile(model, backend="trtrtx",
                             options={"target_compute_capabilities": [(7, 5)]})

The backend is registered through the `torch_dynamo_backends` entry point; importing this
package is not needed to use it.
"""

from __future__ import annotations

from ._backend import trtrtx
from ._errors import (
    BuildError,
    OptionsError,
    RtxBackendError,
    RuntimeUnavailableError,
    TargetError,
)
from ._options import Options
from ._stats import reset_stats, stats

__version__ = "0.1.0"

__all__ = [
    "BuildError",
    "Options",
    "OptionsError",
    "RtxBackendError",
    "RuntimeUnavailableError",
    "TargetError",
    "reset_stats",
    "stats",
    "trtrtx",
]
