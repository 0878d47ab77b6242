"""Optimization profiles: (min, opt, max) per dynamic dimension of each engine input.

Ranges come from, in order: the `dynamic_shapes` option (per graph input and dim), Dynamo's
own constraints (mark_dynamic min/max), else [1, default_max_dim] with the example as opt.
Static inputs get no profile at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ._engine import Profile
from ._onnx_bridge import TensorSpec
from ._options import Options

Range = tuple[int, int, int]


def symbol_overrides(
    graph_inputs: Sequence[object], options: Options
) -> dict[str, Range]:
    """Map the `dynamic_shapes` option (graph input index -> dim -> range) onto symbol names."""
    import torch

    out: dict[str, Range] = {}
    for index, dims in (options.dynamic_shapes or {}).items():
        if index >= len(graph_inputs):
            continue
        val = graph_inputs[index]
        if not isinstance(val, torch.Tensor):
            continue
        for dim, rng in dims.items():
            if -val.dim() <= dim < val.dim():
                size = val.shape[dim]
                if isinstance(size, torch.SymInt) and not size.node.expr.is_number:
                    out[str(size.node.expr).replace(" ", "")] = rng
    return out


def dim_range(
    spec: TensorSpec, axis: int, overrides: Mapping[str, Range], default_max: int
) -> Range:
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
    if not any(s.dynamic for s in inputs):
        return {}
    profile: Profile = {}
    for spec in inputs:
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
    """The smallest profile containing both `profile` and `shapes` (opt unchanged)."""
    out: Profile = {}
    for name, (lo, opt, hi) in profile.items():
        shape = shapes.get(name, lo)
        out[name] = (
            tuple(min(a, s) for a, s in zip(lo, shape)),
            opt,
            tuple(max(b, s) for b, s in zip(hi, shape)),
        )
    return out
