"""Compute capabilities: which GPUs an engine is built for, and which GPU we are on.

Targets drive both the builder config and the capability policy. With no declared target the
current device is the target; without a GPU there is then no target at all.
"""

from __future__ import annotations

import functools

import torch

from . import _trt
from ._errors import TargetError
from ._options import Options, Target

# What TensorRT-RTX 1.7 names, used only to validate options when TensorRT-RTX is not importable.
KNOWN_CAPABILITIES: tuple[Target, ...] = ((7, 5), (8, 0), (8, 6), (8, 9), (12, 0), (12, 1))


def buildable_capabilities() -> tuple[Target, ...]:
    if _trt.available():
        return tuple(_trt.named_capabilities())
    return KNOWN_CAPABILITIES


def check_buildable(targets: tuple[Target, ...]) -> None:
    supported = buildable_capabilities()
    bad = [t for t in targets if t not in supported]
    if bad:
        names = ", ".join(f"({a}, {b})" for a, b in supported)
        who = (f"the installed TensorRT-RTX {_trt.version()}" if _trt.available()
               else "TensorRT-RTX (not importable here; checked against the 1.7 list)")
        raise TargetError(
            f"target_compute_capabilities {bad} cannot be built by {who}; it builds for: {names}"
        )


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
