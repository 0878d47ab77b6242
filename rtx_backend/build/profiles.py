"""Optimization profiles: (min, opt, max) per dynamic dimension of each engine input.

Ranges come from, in order: the `dynamic_shapes` option (per model input and dim), Dynamo's
own constraints (mark_dynamic min/max, guards), else [1, default_max_dim]; opt is the example
Dynamo compiled with. Static inputs get no profile at all.

A profile is a guess about future calls: an unbounded dimension was capped at default_max_dim,
and a `dynamic_shapes` range is whatever the user declared (Dynamo does not guard it). So a
region checks every call against its engine's profile, and a call outside it gets an engine
built for a widened profile (`EngineProfile.fit`) rather than a failed or wrong execution.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import _stats, _torch_compat
from .._errors import OptionsError, RtxBackendError
from .._options import Options
from .._types import EngineData, Profile, TensorSpec

log = logging.getLogger("rtx_backend")

Range = tuple[int, int, int]


class SymbolRanges(dict[str, Range]):
    """Declared (min, opt, max) per symbol of Dynamo's graph (from the `dynamic_shapes` option),
    and `labels`: what each symbol is in the user's terms ("x dim 0"), for messages."""

    def __init__(self, ranges: Mapping[str, Range] | None = None, labels: Mapping[str, str] | None = None) -> None:
        super().__init__(ranges or {})
        self.labels: dict[str, str] = dict(labels or {})


def symbol_overrides(gm: Any, options: Options) -> SymbolRanges:
    """Map the `dynamic_shapes` option onto the symbols of Dynamo's graph `gm`.

    Keys of the option are model inputs: an int is the position among the graph's tensor inputs
    that are not parameters or buffers (in the order Dynamo passes them: the order in which the
    model first reads them), a str is the argument's name. Dims that Dynamo made static have no
    symbol and are skipped (with a debug message): Dynamo guards them, so no range can apply.
    """
    import torch

    inputs: list[tuple[str | None, Any]] = []  # (argument name, fake tensor) of each model input
    for node in gm.graph.nodes:
        val = node.meta.get("example_value")
        if node.op != "placeholder" or not isinstance(val, torch.Tensor):
            continue
        is_input, name = _model_input(getattr(node.meta.get("grapharg"), "source", None))
        if is_input:
            inputs.append((name, val))
    out = SymbolRanges(labels=_labels(inputs))
    if not options.dynamic_shapes:
        return out
    for key, dims in options.dynamic_shapes.items():
        matches = [v for i, (name, v) in enumerate(inputs) if key in (i, name)]
        if not matches:  # a typo, or a graph after a graph break (it takes no model input)
            log.log(logging.WARNING if inputs else logging.DEBUG,
                    "trtrtx: dynamic_shapes names input %r, which this graph does not take", key)
            continue
        val = matches[0]
        for dim, rng in dims.items():
            if not -val.dim() <= dim < val.dim():
                raise OptionsError(
                    f"dynamic_shapes[{key!r}] names dim {dim}, but input {key!r} has {val.dim()} dim(s) "
                    f"(shape {tuple(val.shape)}); name dims 0 to {val.dim() - 1}"
                )
            size = val.shape[dim]
            if isinstance(size, torch.SymInt) and not size.node.expr.is_number:
                out[str(size.node.expr).replace(" ", "")] = rng
            else:
                log.debug("trtrtx: dynamic_shapes[%r][%r]: that dimension is static here", key, dim)
    return out


def _labels(inputs: Sequence[tuple[str | None, Any]]) -> dict[str, str]:
    """symbol -> "x dim 0" (or "input 1 dim 0" for an input without a name): the first model
    input dimension that carries each symbol."""
    import torch

    out: dict[str, str] = {}
    for index, (name, val) in enumerate(inputs):
        for dim, size in enumerate(val.shape):
            if isinstance(size, torch.SymInt) and not size.node.expr.is_number:
                out.setdefault(str(size.node.expr).replace(" ", ""), f"{name or f'input {index}'} dim {dim}")
    return out


DimLabels = dict[str, dict[int, tuple[str, bool]]]  # engine input -> axis -> (label, range declared)


def dim_labels(inputs: Sequence[TensorSpec], overrides: Mapping[str, Range]) -> DimLabels:
    """For the widening warning: each dynamic axis of each engine input, named as the user knows
    it, and whether the `dynamic_shapes` option declared its range."""
    labels = getattr(overrides, "labels", {})
    out: DimLabels = {}
    for spec in inputs:
        for axis, size in enumerate(spec.shape):
            if isinstance(size, str):
                out.setdefault(spec.name, {})[axis] = (labels.get(size, f"{spec.name} dim {axis}"), size in overrides)
    return out


def _model_input(source: Any) -> tuple[bool, str | None]:
    """Whether a graph input is an argument of the compiled call (not a parameter, buffer or
    global), and its name: `forward(self, x)` gives LocalSource('x'); modules that Dynamo wraps
    (nn.Sequential) give args[0] (no name); keyword arguments and dict inputs give their key.
    """
    sources = _torch_compat.dynamo_sources()
    GetItemSource, LocalSource = sources.GetItemSource, sources.LocalSource

    if isinstance(source, LocalSource):
        return source.is_input, source.local_name
    if isinstance(source, GetItemSource) and isinstance(source.base, LocalSource) and source.base.is_input:
        return True, source.index if isinstance(source.index, str) else None
    return False, None


def dim_range(
    spec: TensorSpec, axis: int, overrides: Mapping[str, Range], default_max: int
) -> Range:
    """(min, opt, max) of one dynamic dimension; always contains the example size."""
    name = spec.shape[axis]
    hint = spec.hint[axis]
    if isinstance(name, str) and name in overrides:
        lo, opt, hi = overrides[name]
        return (min(lo, hint), min(max(opt, lo), hi), max(hi, hint))
    lower, upper = spec.bounds[axis] if spec.bounds else (1, None)
    lo = 1 if lower <= 2 else lower  # Dynamo's 0/1 specialization makes 2 the usual lower bound
    hi = upper if upper is not None and upper < 2**31 - 1 else max(default_max, hint)
    return (min(lo, hint), hint, max(hi, hint))


def make_profile(
    inputs: Sequence[TensorSpec], overrides: Mapping[str, Range], options: Options
) -> Profile:
    """The optimization profile of a region's engine: its dynamic inputs' ranges ({} when it
    has none; TensorRT-RTX needs no profile for static inputs)."""
    profile: Profile = {}
    for spec in inputs:
        if not spec.dynamic:
            continue
        lo, opt, hi = [], [], []
        for axis, size in enumerate(spec.shape):
            if isinstance(size, int):
                lo.append(size)
                opt.append(size)
                hi.append(size)
                continue
            r = dim_range(spec, axis, overrides, options.default_max_dim)
            lo.append(r[0])
            opt.append(r[1])
            hi.append(r[2])
        profile[spec.name] = (tuple(lo), tuple(opt), tuple(hi))
    return profile


def contains(profile: Profile, shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """Whether every input shape lies inside the profile."""
    for name, shape in shapes.items():
        if name not in profile:
            continue
        lo, _opt, hi = profile[name]
        if len(shape) != len(lo) or any(not a <= s <= b for a, s, b in zip(lo, shape, hi)):
            return False
    return True


def widen(profile: Profile, shapes: Mapping[str, tuple[int, ...]]) -> Profile:
    """A profile containing both `profile` and `shapes` (opt unchanged).

    A bound that a shape crosses moves at least by a factor of 2 (max doubles, min halves), so a
    sequence length that grows call after call costs a logarithmic number of rebuilds, not one
    per call.
    """
    out: Profile = {}
    for name, (lo, opt, hi) in profile.items():
        shape = shapes.get(name, lo)
        out[name] = (
            tuple(a if s >= a else min(s, max(a // 2, 1)) for a, s in zip(lo, shape)),
            opt,
            tuple(b if s <= b else max(s, 2 * b) for b, s in zip(hi, shape)),
        )
    return out


class EngineProfile:
    """The profile of a region's engine, and the way to build the engine for a wider one.

    `build` turns a profile into serialized engine bytes (raising BuildError); the backend gives
    one bound to the region's ONNX model and targets, which takes the engine from the engine
    cache when a process widened the same region's profile the same way before. A widened build
    that fails is not retried: later calls outside the profile get the same error at once, and
    the region runs them in PyTorch.
    """

    def __init__(self, profile: Profile, build: Callable[[Profile], EngineData], labels: DimLabels | None = None) -> None:
        self.profile = profile
        self.build = build
        self.labels = labels or {}  # for messages: which model input dimension each axis is
        self.failure: RtxBackendError | None = None
        self.lock = threading.Lock()

    def fit(self, shapes: Mapping[str, tuple[int, ...]], install: Callable[[EngineData], None]) -> bool:
        """Make the engine cover `shapes`: when they fall outside the profile, build the engine
        for a widened profile and `install` it. Returns whether a new engine was installed;
        raises RtxBackendError when none could be built or installed.

        The profile changes only after `install` returns, under a lock, so a concurrent call
        never sees the wider profile with the old engine still in place.
        """
        if contains(self.profile, shapes):
            return False
        with self.lock:
            if contains(self.profile, shapes):  # another thread widened it meanwhile
                return False
            if self.failure is not None:
                raise self.failure
            wider = widen(self.profile, shapes)
            log.warning("trtrtx: %s. An engine for a wider profile (%s) is built to replace it",
                        self.outside(shapes), self.describe(wider))
            try:
                engine = self.build(wider)
                _stats.count("profile_widenings")
                install(engine)
            except RtxBackendError as exc:
                self.failure = exc
                raise
            self.profile = wider
            return True


    def outside(self, shapes: Mapping[str, tuple[int, ...]]) -> str:
        """What falls outside the profile, in the user's terms, with the cause and the fix."""
        declared: list[str] = []
        undeclared: list[str] = []
        for name, (lo, _opt, hi) in self.profile.items():
            shape = shapes.get(name, lo)
            for axis, (a, size, b) in enumerate(zip(lo, shape, hi)):
                if a <= size <= b:
                    continue
                label, is_declared = self.labels.get(name, {}).get(axis, (f"{name} dim {axis}", False))
                (declared if is_declared else undeclared).append(f"{label} is {size}, outside {a}..{b}")
        parts = []
        if declared:
            parts.append(f"{'; '.join(declared)}, the range given in the dynamic_shapes option (Dynamo does "
                         "not check it): widen that range to cover such calls")
        if undeclared:
            parts.append(f"{'; '.join(undeclared)}, the range from Dynamo's bounds or default_max_dim: declare "
                         "the range with the dynamic_shapes option (e.g. {'x': {0: (1, 8, 256)}}) or "
                         "torch._dynamo.mark_dynamic(x, dim, min=, max=)")
        return "; ".join(parts) or f"input shapes {dict(shapes)} fall outside the engine's profile"


    def describe(self, profile: Profile) -> str:
        """'x dim 0: 1..128' for each dynamic axis (the engine input's name where no label is known)."""
        parts = []
        for name, (lo, _opt, hi) in profile.items():
            labels = self.labels.get(name)
            if not labels:
                parts.append(f"{name}: min {lo} max {hi}")
                continue
            parts += [f"{label}: {lo[axis]}..{hi[axis]}" for axis, (label, _) in sorted(labels.items())]
        return ", ".join(parts)

