"""Test helpers: compile with the backend and look at what it produced."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
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


def hold(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> Iterator[threading.Event]:
    """For a fixture: every call of `owner.name` waits until the event it yields is set (then
    calls run as usual); at the end the event is set and the update thread's work waited for."""
    import rtx_backend

    gate = threading.Event()
    held = getattr(owner, name)

    def waiting(*args: Any, **kwargs: Any) -> Any:
        assert gate.wait(60), "the test never released the held call"
        return held(*args, **kwargs)

    monkeypatch.setattr(owner, name, waiting)
    yield gate
    gate.set()
    rtx_backend.wait_for_updates(60)
