"""Host copies of a model's tensors, made once per compile.

A compile reads every weight's bytes on the host several times: to hash it (the graph and
engine-cache keys), to hand it to TensorRT-RTX's ONNX parser by pointer or to ONNX Runtime, and to
store it in the engine cache. For a model on the GPU each read was a device-to-host copy of its
own: for a 1B-parameter model in FP16, 2.5 GB crossed the bus twice before the build started, and
once more for the engine cache. Within `sharing()` (the backend's compile, and the engine-cache store it leaves to
the writer thread), `host_copy` makes one copy per tensor and hands the same one to every reader.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

R = TypeVar("R")
Place = tuple[Any, ...]
Copies = dict[Place, tuple[torch.Tensor, torch.Tensor]]  # place -> (the tensor, its host copy)

_COPIES: contextvars.ContextVar[Copies | None] = contextvars.ContextVar("rtx_backend_host_copies", default=None)


@contextlib.contextmanager
def sharing() -> Iterator[None]:
    """A scope in which each tensor is copied to the host once. The copies, and the tensors they
    were made from (so that no freed memory is mistaken for one of them), live until it ends."""
    token = _COPIES.set({})
    try:
        yield
    finally:
        _COPIES.reset(token)


def release() -> None:
    """Let the scope's copies go (a compile that found its graph cached reads no more weights)."""
    copies = _COPIES.get()
    if copies is not None:
        copies.clear()


def current() -> Copies | None:
    """The scope's copies, for threads that work for it (a thread does not inherit the scope)."""
    return _COPIES.get()


def within(copies: Copies | None, fn: Callable[..., R]) -> Callable[..., R]:
    """`fn`, run in the scope whose `copies` these are (for work a compile hands to another thread,
    such as the engine cache's store: it then writes the copies the compile made)."""
    def run(*args: Any) -> R:
        token = _COPIES.set(copies)
        try:
            return fn(*args)
        finally:
            _COPIES.reset(token)

    return run


def place(t: torch.Tensor) -> Place | None:
    """Where a tensor's elements are: equal for two tensors that view the same elements."""
    try:
        return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype, t.device)
    except Exception:  # no storage (meta, fake, sparse)
        return None


def host_copy(t: torch.Tensor, copies: Copies | None = None) -> torch.Tensor:
    """`t`'s elements in host memory, C-contiguous: `t` itself when it already is, else a copy,
    made once per tensor within `sharing()` (or the `copies` of a scope, from a worker thread).
    Nothing writes to a model's weights while it compiles, so a copy stays true for the scope."""
    t = t.detach()
    if t.device.type == "cpu" and t.is_contiguous():
        return t
    copies = _COPIES.get() if copies is None else copies
    where = place(t)
    if copies is None or where is None:  # outside a scope, or no storage to know the tensor by
        return _to_host(t)
    known = copies.get(where)
    if known is None:
        known = copies[where] = (t, _to_host(t))
    return known[1]


def _to_host(t: torch.Tensor) -> torch.Tensor:
    return t.to("cpu").contiguous()
