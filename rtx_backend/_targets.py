"""Compute capabilities: which GPUs an engine is built for, and which GPU we are on.

Targets drive both the builder config and the capability policy. With no declared target the
current device is the target; without a GPU there is then no target at all.
"""

from __future__ import annotations

import functools

import torch

from . import _trt
from ._options import Options
from ._types import Target


@functools.cache
def current_capability() -> Target | None:
    """The current CUDA device's compute capability, or None without a usable GPU."""
    try:
        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability()
    except Exception:
        return None
    return (major, minor)


def policy_targets(options: Options) -> tuple[Target, ...]:
    """The capabilities the policy must respect: the declared ones, else the current device."""
    if options.target_compute_capabilities is not None:
        return options.target_compute_capabilities
    current = current_capability()
    return (current,) if current is not None else ()


def can_build(options: Options) -> bool:
    """Whether engines can be built here: declared targets (AOT, no GPU needed) or a GPU."""
    if not _trt.available():
        return False
    return options.target_compute_capabilities is not None or current_capability() is not None


def describe(targets: tuple[Target, ...]) -> str:
    return ", ".join(f"SM{a}.{b}" for a, b in targets) or "none (no GPU, no declared target)"


def no_cuda_reason() -> str | None:
    """Why this process has no CUDA to run engines on, with what to do; None when it has.

    A CPU-only build of torch cannot be fixed by moving tensors: it needs another torch."""
    if torch.version.cuda is None and not torch.cuda.is_available():
        return (f"torch {torch.__version__} is a CPU-only build, so no engine can run in this process; "
                "install a CUDA build of torch (https://pytorch.org/get-started/locally/) on a machine "
                "with an RTX GPU to run engines")
    if not torch.cuda.is_available():
        return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA GPU; check the "
                "driver and CUDA_VISIBLE_DEVICES (`python -m rtx_backend info`)")
    return None


def gpu_identity_parts() -> tuple[str, tuple[int, int]]:
    """The current CUDA device's name and compute capability."""
    import torch

    index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return torch.cuda.get_device_name(index), (major, minor)


def gpu_identity() -> str:
    name, (major, minor) = gpu_identity_parts()
    return f"{name} sm{major}{minor}"
