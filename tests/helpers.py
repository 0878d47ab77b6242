"""Test helpers: compile with the backend and look at what it produced."""

from __future__ import annotations

from typing import Any

import torch

from rtx_backend._record import CompiledGraph, recording
from rtx_backend.cache import store
from rtx_backend.run.region import RegionModule

_LAST: list[CompiledGraph] = []


def compile_and_run(model: torch.nn.Module, *inputs: torch.Tensor, **options: Any) -> torch.Tensor:
    """Compile and call once under no_grad, recording the compiled graphs (see `regions`)."""
    compiled = torch.compile(model, backend="trtrtx", options=options)
    with torch.no_grad(), recording() as graphs:
        out = compiled(*inputs)
    _LAST[:] = graphs
    store.flush()  # engine-cache files are written behind the compile: tests look at them
    return out


def regions() -> list[RegionModule]:
    """The region modules of the last `compile_and_run`, in order."""
    return [r for g in _LAST for r in g.regions]


def backend_error(exc: BaseException) -> BaseException:
    """The backend's own exception inside Dynamo's BackendCompilerFailed wrapper (or `exc` itself)."""
    inner = getattr(exc, "inner_exception", None)
    return inner if isinstance(inner, BaseException) else exc
