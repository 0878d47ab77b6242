"""A word when Dynamo compiles the same code again for inputs of another dtype.

Dynamo guards on dtypes, so a model called in FP16 and then in FP32 (or moved with `.half()`
after its first call) is traced, lowered and built again: engines of its own for each dtype,
seconds to minutes each, and nothing said by Dynamo unless its recompile logging is on. The
backend sees every compile of a frame (Dynamo's compile id: frame, and how many times it was
compiled), so it can say it once per change, with the fix.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import torch

from . import _torch_compat

log = logging.getLogger("rtx_backend")


class FrameDtypes:
    """The floating dtypes of each Dynamo frame's inputs at its last compile, under a lock."""

    def __init__(self) -> None:
        self._dtypes: dict[int, frozenset[str]] = {}
        self._lock = threading.Lock()

    def swap(self, frame: int, dtypes: frozenset[str]) -> frozenset[str] | None:
        """Store `dtypes` for `frame`; return what was stored before (None: nothing)."""
        with self._lock:
            before = self._dtypes.get(frame)
            self._dtypes[frame] = dtypes
            return before


SEEN = FrameDtypes()


def floating_dtypes(example_inputs: Sequence[Any]) -> frozenset[str]:
    return frozenset(str(t.dtype).removeprefix("torch.") for t in example_inputs
                     if isinstance(t, torch.Tensor) and t.is_floating_point())


def warn_if_dtype_recompile(example_inputs: Sequence[Any]) -> bool:
    """Log a WARNING when this compile is Dynamo's recompile of a frame whose inputs (or weights)
    changed floating dtype since its last compile; return whether it did."""
    compile_id = _torch_compat.current_compile_id()
    frame = getattr(compile_id, "frame_id", None)
    if frame is None:
        return False
    dtypes = floating_dtypes(example_inputs)
    before = SEEN.swap(frame, dtypes)
    if not getattr(compile_id, "frame_compile_id", 0) or before is None or not dtypes or before == dtypes:
        return False
    log.warning("trtrtx: Dynamo compiles this code again because its inputs or weights changed dtype (now %s, "
                "before %s): each dtype gets its own graph and engines, built again. Keep the model and its "
                "inputs in one dtype (for example model.half() and x.half() before the first call) to compile once.",
                ", ".join(sorted(dtypes)), ", ".join(sorted(before)))
    return True
