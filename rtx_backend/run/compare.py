"""Output comparison with Polygraphy's semantics, shared by first-call validation and crosscheck.

An element fails only when it misses both tolerances: |a - r| > atol and |a - r| / |r| > rtol.
Each comparison also says which tolerance would have been enough (the smallest atol at the
given rtol, and the smallest rtol at the given atol), so a failure tells the user how far off
it was, not just that it was. NaN and Inf count as equal only where both sides hold the same
one; an all-zero output where the reference has values beyond atol always fails, because that
is how a broken engine looks (TensorRT-RTX has produced silent all-zero outputs).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping

import torch

# Per-dtype (atol, rtol) for floating outputs. atol is relative to the reference's RMS (see
# `default_tolerance`): engines reorder sums and use TF32 for FP32 GEMMs, so the absolute error
# of an element grows with the size of the values it was computed from, not with its own size.
_FLOAT_TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-6, 1e-6),
    torch.float32: (1e-2, 1e-2),
    # atol is this factor times the reference's RMS. FP16 and BF16 reductions over thousands of
    # terms differ by a few percent of RMS between kernels (measured on the H200: a 4x4096 FP16
    # MLP, TensorRT-RTX against cuBLAS, 2.9%); garbage, zeros and layout errors are ~100% of it.
    torch.float16: (5e-2, 2e-2),
    torch.bfloat16: (1e-1, 8e-2),
}
_ATOL_FLOOR: dict[torch.dtype, float] = {  # for references that are (nearly) all zero
    torch.float64: 1e-12,
    torch.float32: 1e-7,
    torch.float16: 1e-5,
    torch.bfloat16: 1e-4,
}


@dataclasses.dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


@dataclasses.dataclass(frozen=True)
class OutputComparison:
    """How one output compares with its reference."""

    name: str
    shape: tuple[int, ...]  # the output's (actual) shape
    dtype: torch.dtype
    tolerance: Tolerance
    max_abs: float  # max |a - r|: alone as atol (rtol=0) it would pass
    max_rel: float  # max |a - r| / |r|: alone as rtol (atol=0) it would pass
    min_atol: float  # the smallest atol that passes at the given rtol
    min_rtol: float  # the smallest rtol that passes at the given atol
    mismatches: int  # elements that miss both tolerances
    nan: int  # NaN count in the output
    inf: int  # Inf count in the output
    all_zero: bool  # the output is all zeros (and not empty)
    reference_all_zero: bool
    problem: str  # "" when it passes, else why not (shape, dtype, zeros, mismatches)
    fp32: Fp32Judgment | None = None  # set where a low-precision output passed against an FP32 run

    @property
    def passed(self) -> bool:
        return not self.problem

    def summary(self) -> str:
        """One line with the numbers, for logs."""
        return (
            f"{self.name} {tuple(self.shape)} {_dtype_name(self.dtype)}: {self.problem or 'ok'}; "
            f"max abs err {self.max_abs:.3g}, max rel err {self.max_rel:.3g}, "
            f"would pass with atol={self.min_atol:.3g} or rtol={self.min_rtol:.3g} "
            f"(used atol={self.tolerance.atol:.3g}, rtol={self.tolerance.rtol:.3g}); "
            f"NaN {self.nan}, Inf {self.inf}, all zero {self.all_zero}"
        )


def default_tolerance(dtype: torch.dtype, reference: torch.Tensor | None = None) -> Tolerance:
    """The dtype's tolerance; atol is scaled by the reference's RMS magnitude when one is given.

    Integer and bool outputs must match exactly.
    """
    if dtype not in _FLOAT_TOLERANCE:
        return Tolerance(0.0, 0.0) if not dtype.is_floating_point else Tolerance(1e-1, 1e-1)
    base_atol, rtol = _FLOAT_TOLERANCE[dtype]
    scale = 1.0
    if reference is not None and reference.numel():
        parts = []
        for c in _chunks(reference):
            c = c.double()
            finite = torch.isfinite(c)
            parts.append(torch.stack([torch.where(finite, c * c, 0).sum(), finite.sum().double()]))
        squares, count = torch.stack(parts).sum(0).tolist()
        scale = math.sqrt(squares / count) if count else 1.0
    return Tolerance(max(_ATOL_FLOOR.get(dtype, 1e-3), base_atol * scale), rtol)


ToleranceSpec = float | Mapping[str, float] | None


def pick_tolerance(
    names: tuple[str, ...], dtype: torch.dtype, reference: torch.Tensor, atol: ToleranceSpec, rtol: ToleranceSpec
) -> Tolerance:
    """Per-output tolerance: the first of `names` found in a mapping, then its "" key, then the default.

    `atol`/`rtol` are a number (for every output), a mapping of output name to number (with ""
    as the default for outputs not named), or None (the dtype's default). `names` run from
    most to least specific, e.g. ("trtrtx_region_0/output_0", "output_0").
    """
    default = default_tolerance(dtype, reference)
    return Tolerance(_lookup(atol, names, default.atol), _lookup(rtol, names, default.rtol))


def _lookup(spec: ToleranceSpec, names: tuple[str, ...], default: float) -> float:
    if spec is None:
        return default
    if not isinstance(spec, Mapping):
        return float(spec)
    for key in (*names, ""):
        if key in spec:
            return float(spec[key])
    return default


def compare(
    actual: torch.Tensor, reference: torch.Tensor, tolerance: Tolerance | None = None, name: str = "output"
) -> OutputComparison:
    """Compare `actual` with `reference`, in float64 on the reference's device.

    Works through the outputs in chunks, so a check of a large output on a small GPU needs about
    100 MB more memory, not several copies of the output; one host read at the end.
    """
    tol = tolerance or default_tolerance(reference.dtype, reference)
    shape = tuple(actual.shape)
    nan, inf, nonzero = _census(actual)
    ref_zero = reference.numel() > 0 and not _census(reference)[2]
    all_zero = actual.numel() > 0 and not nonzero

    def result(problem: str, *errs: float, mismatches: int = 0) -> OutputComparison:
        max_abs, max_rel, min_atol, min_rtol = errs or (math.inf,) * 4
        return OutputComparison(name, shape, actual.dtype, tol, max_abs, max_rel, min_atol, min_rtol,
                                mismatches, nan, inf, all_zero, ref_zero, problem)

    if shape != tuple(reference.shape):
        return result(f"shape {shape} differs from the reference's {tuple(reference.shape)}")
    if actual.dtype != reference.dtype:
        return result(
            f"dtype {_dtype_name(actual.dtype)} differs from the reference's {_dtype_name(reference.dtype)}"
        )
    if actual.numel() == 0:
        return result("", 0.0, 0.0, 0.0, 0.0)
    parts = []
    for a, r in zip(_chunks(actual), _chunks(reference)):
        a, r = a.to(r.device, torch.float64), r.double()
        absdiff, reldiff = _differences(a, r)
        misses_abs, misses_rel = absdiff > tol.atol, reldiff > tol.rtol
        parts.append(torch.stack([
            absdiff.max(),
            reldiff.max(),
            torch.where(misses_rel, absdiff, 0).max(),  # the atol that would pass at this rtol
            torch.where(misses_abs, reldiff, 0).max(),  # the rtol that would pass at this atol
            (misses_abs & misses_rel).sum().double(),
            (r.abs() > tol.atol).any().double(),
        ]))
    total = torch.stack(parts)
    max_abs, max_rel, min_atol, min_rtol = total[:, :4].max(0).values.tolist()
    count = int(total[:, 4].sum())
    ref_beyond_atol = bool(total[:, 5].any())
    problem = ""
    if all_zero and ref_beyond_atol:
        problem = "all zeros where the reference is not"
    elif count:
        problem = f"{count} of {actual.numel()} elements differ beyond atol and rtol"
    return result(problem, max_abs, max_rel, min_atol, min_rtol, mismatches=count)


_CHUNK = 1 << 22  # elements per step (32 MB in float64)


def _chunks(t: torch.Tensor) -> Iterator[torch.Tensor]:
    flat = t.detach().reshape(-1)
    for start in range(0, flat.numel(), _CHUNK):
        yield flat[start : start + _CHUNK]


def _census(t: torch.Tensor) -> tuple[int, int, bool]:
    """(NaN count, Inf count, any non-zero element) of `t`."""
    if t.numel() == 0:
        return 0, 0, False
    parts = []
    for c in _chunks(t):
        floating = c.is_floating_point()
        parts.append(torch.stack([
            torch.isnan(c).sum() if floating else torch.zeros((), dtype=torch.int64, device=c.device),
            torch.isinf(c).sum() if floating else torch.zeros((), dtype=torch.int64, device=c.device),
            (c != 0).any().long(),
        ]))
    nan, inf, nonzero = torch.stack(parts).sum(0).tolist()
    return int(nan), int(inf), bool(nonzero)


def _differences(a: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """|a - r| and |a - r| / |r|, with equal NaN/Inf counted as equal and any other NaN as Inf."""
    same = (torch.isnan(a) & torch.isnan(r)) | (torch.isinf(a) & (a == r))
    absdiff = (a - r).abs()
    absdiff = torch.where(same, torch.zeros_like(absdiff), absdiff)
    absdiff = torch.nan_to_num(absdiff, nan=math.inf, posinf=math.inf)
    reldiff = torch.where(absdiff == 0, torch.zeros_like(absdiff), absdiff / r.abs())
    reldiff = torch.nan_to_num(reldiff, nan=math.inf, posinf=math.inf)
    return absdiff, reldiff


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# Low-precision outputs that miss their tolerance are judged against an FP32 run instead: two FP16
# results (an engine's, PyTorch's) can differ from each other more than either differs from FP32
# (deep conv/BN/SiLU nets: EfficientNet's logits). The engine passes when it is no further from
# FP32 than FP32_FACTOR times PyTorch's own FP16 result, plus FP32_FLOOR times the FP32 output's
# RMS, in both RMS and max error. A broken engine (zeros, garbage, a layout error) is ~100% of
# the RMS away; FP16 rounding is ~1%.
FP32_FACTOR = 3.0
FP32_FLOOR = 0.01
LOW_PRECISION = (torch.float16, torch.bfloat16)


def fp32_may_overturn(c: OutputComparison) -> bool:
    """Whether an FP32 run may overturn this failed comparison: a low-precision output with
    elements beyond the tolerances (not all zero, which is wrong whatever FP32 says)."""
    return not c.passed and c.dtype in LOW_PRECISION and bool(c.mismatches) and not c.all_zero


@dataclasses.dataclass(frozen=True)
class Fp32Judgment:
    """How an output and PyTorch's result in the same precision compare with an FP32 run."""

    name: str
    rms: float  # RMS of (output - fp32)
    max_abs: float
    torch_rms: float  # the same for PyTorch's result
    torch_max_abs: float
    scale: float  # RMS of the FP32 output
    problem: str

    @property
    def passed(self) -> bool:
        return not self.problem

    def summary(self) -> str:
        return (
            f"{self.name} against an FP32 run: {self.problem or 'ok'}; RMS err {self.rms:.3g} (PyTorch's "
            f"{self.torch_rms:.3g}), max abs err {self.max_abs:.3g} (PyTorch's {self.torch_max_abs:.3g}), "
            f"FP32 RMS {self.scale:.3g}; allowed {FP32_FACTOR:g}x PyTorch's + {FP32_FLOOR:g}x FP32 RMS"
        )


def judge_by_fp32(actual: torch.Tensor, reference: torch.Tensor, fp32: torch.Tensor, name: str = "output") -> Fp32Judgment:
    """Whether `actual` is as close to `fp32` as `reference` (PyTorch, in `actual`'s dtype) is.

    NaN or Inf in `actual` where `reference` has not the same one fails; elements that are not
    finite in the FP32 run or in `reference` are left out of the distances.
    """
    a = actual.detach().to(fp32.device, torch.float64).reshape(-1)
    r = reference.detach().to(fp32.device, torch.float64).reshape(-1)
    f = fp32.detach().double().reshape(-1)
    bad = ~torch.isfinite(a) & ~((torch.isnan(a) & torch.isnan(r)) | (a == r))
    keep = torch.isfinite(a) & torch.isfinite(r) & torch.isfinite(f)

    def distances(x: torch.Tensor) -> tuple[float, float]:
        d = torch.where(keep, x - f, 0)
        count = max(int(keep.sum()), 1)
        return math.sqrt(float(d.square().sum()) / count), float(d.abs().max()) if d.numel() else 0.0

    rms, max_abs = distances(a)
    torch_rms, torch_max = distances(r)
    count = max(int(keep.sum()), 1)
    scale = math.sqrt(float(torch.where(keep, f, 0).square().sum()) / count)
    floor = FP32_FLOOR * scale
    problem = ""
    if int(bad.sum()):
        problem = f"{int(bad.sum())} NaN or Inf elements where PyTorch has finite values"
    elif a.numel() and not bool((a != 0).any()) and scale > 0:
        problem = "all zeros where the FP32 run is not"
    elif rms > FP32_FACTOR * torch_rms + floor or max_abs > FP32_FACTOR * torch_max + floor:
        problem = "further from FP32 than PyTorch's result allows"
    return Fp32Judgment(name, rms, max_abs, torch_rms, torch_max, scale, problem)
