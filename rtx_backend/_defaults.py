"""Options for compiles that cannot be given `options=`.

torch.compile takes `mode=` or `options=`, not both, and some callers choose `mode=` for the
user: Hugging Face's `generate` compiles its decode step with a `CompileConfig` whose mode is
"reduce-overhead". Targets and the other options reach those compiles as defaults, set for the
process or for a block, and read once, where the backend starts (not a registry consulted
further down: from there on the Options are passed explicitly, as for any compile).

    rtx_backend.set_default_options({"target_compute_capabilities": [(8, 6), (8, 9)]})
    with rtx_backend.default_options({"min_block_size": 1}):   # this block's compiles
        model.generate(...)

Given options override the defaults key by key; an `Options` object given to torch.compile is
used as it is.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from ._errors import OptionsError
from ._options import Options

_SCOPED: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("rtx_backend_defaults", default=None)


class ProcessDefaults:
    """The process-wide defaults (a dict checked when set), under a lock."""

    def __init__(self) -> None:
        self._options: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def set(self, options: dict[str, Any] | None) -> None:
        with self._lock:
            self._options = options

    def get(self) -> dict[str, Any] | None:
        with self._lock:
            return self._options


PROCESS = ProcessDefaults()


def _checked(options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A copy of `options`, checked now: a bad key or value raises OptionsError here, where the
    user wrote it, not at a compile inside someone else's code."""
    if options is None:
        return None
    if not isinstance(options, Mapping):
        raise OptionsError(f"default options must be a dict, got {type(options).__name__}")
    # (an iterator, say of targets, is read once here: the defaults serve many compiles)
    copy = {k: list(v) if hasattr(v, "__next__") else v for k, v in options.items()}
    Options.from_dict(dict(copy))
    return copy


def set_default_options(options: Mapping[str, Any] | None) -> None:
    """Options for every trtrtx compile of this process that is not given all of them (see the
    module's docstring); None removes them. Raises OptionsError for a bad key or value."""
    PROCESS.set(_checked(options))


@contextlib.contextmanager
def default_options(options: Mapping[str, Any]) -> Iterator[None]:
    """Options for the trtrtx compiles inside the block (Dynamo's recompiles too), over the
    process-wide defaults. Raises OptionsError for a bad key or value on entry."""
    base = _SCOPED.get() or PROCESS.get() or {}
    token = _SCOPED.set({**base, **(_checked(options) or {})})
    try:
        yield
    finally:
        _SCOPED.reset(token)


def with_defaults(options: Mapping[str, Any] | Options | None) -> Mapping[str, Any] | Options | None:
    """The options of a compile: the defaults in force, overridden key by key by `options`."""
    defaults = _SCOPED.get()
    if defaults is None:
        defaults = PROCESS.get()
    if not defaults or isinstance(options, Options):
        return options
    if options is None:
        return defaults
    if not isinstance(options, Mapping):
        return options  # (Options.from_dict says what is wrong with it)
    return {**defaults, **options}
