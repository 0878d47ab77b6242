"""Output comparison semantics (Polygraphy's): both tolerances must be missed, minimum tolerances,
NaN/Inf, all-zero outputs, per-output tolerances."""

from __future__ import annotations

import math

import pytest
import torch

from rtx_backend.run.compare import Tolerance, compare, default_tolerance, pick_tolerance


def test_identical_outputs_pass_with_zero_error():
    x = torch.randn(3, 4)
    c = compare(x.clone(), x, Tolerance(0.0, 0.0))
    assert c.passed and c.max_abs == 0 and c.max_rel == 0 and c.mismatches == 0
    assert c.shape == (3, 4) and c.dtype == torch.float32 and not c.all_zero


def test_an_element_fails_only_when_it_misses_both_tolerances():
    ref = torch.tensor([1000.0, 0.001], dtype=torch.float64)
    got = torch.tensor([1000.5, 0.0011], dtype=torch.float64)
    # element 0 misses atol (0.5 > 0.01) but meets rtol (5e-4 <= 1e-3); element 1 meets atol
    assert compare(got, ref, Tolerance(0.01, 1e-3)).passed
    tight = compare(got, ref, Tolerance(1e-5, 1e-4))
    assert not tight.passed and tight.mismatches == 2
    assert "2 of 2 elements" in tight.problem


def test_max_errors_are_what_polygraphy_reports():
    ref = torch.tensor([2.0, -4.0, 0.5])
    got = torch.tensor([2.5, -4.0, 0.25])
    c = compare(got, ref, Tolerance(0.0, 0.0))
    assert c.max_abs == pytest.approx(0.5)
    assert c.max_rel == pytest.approx(0.5)  # 0.25 / 0.5 and 0.5 / 2.0
    # each alone passes: atol=max_abs with rtol=0, or rtol=max_rel with atol=0
    assert compare(got, ref, Tolerance(c.max_abs, 0.0)).passed
    assert compare(got, ref, Tolerance(0.0, c.max_rel)).passed


@pytest.mark.parametrize("seed", range(5))
def test_min_tolerances_are_the_smallest_that_pass(seed):
    gen = torch.Generator().manual_seed(seed)
    ref = torch.randn(200, generator=gen, dtype=torch.float64)
    got = ref + 1e-3 * torch.randn(200, generator=gen, dtype=torch.float64)
    tol = Tolerance(5e-4, 1e-3)
    c = compare(got, ref, tol)
    assert not c.passed  # some elements miss both
    assert compare(got, ref, Tolerance(c.min_atol, tol.rtol)).passed
    assert not compare(got, ref, Tolerance(c.min_atol * 0.999, tol.rtol)).passed
    assert compare(got, ref, Tolerance(tol.atol, c.min_rtol)).passed
    assert not compare(got, ref, Tolerance(tol.atol, c.min_rtol * 0.999)).passed
    assert c.min_atol <= c.max_abs and c.min_rtol <= c.max_rel


def test_nan_and_inf_are_equal_only_where_both_sides_hold_them():
    ref = torch.tensor([1.0, math.nan, math.inf, -math.inf])
    assert compare(ref.clone(), ref, Tolerance(0.0, 0.0)).passed
    got = torch.tensor([math.nan, math.nan, math.inf, math.inf])
    c = compare(got, ref, Tolerance(1.0, 1.0))
    assert not c.passed and c.mismatches == 2  # NaN for 1.0, +Inf for -Inf
    assert c.nan == 2 and c.inf == 2 and c.max_abs == math.inf


def test_all_zero_output_fails_even_within_a_loose_rtol():
    ref = torch.tensor([1.0, -2.0, 3.0])
    c = compare(torch.zeros(3), ref, Tolerance(1e-6, 10.0))  # every element is within rtol=10
    assert c.mismatches == 0
    assert not c.passed and c.all_zero and "all zeros" in c.problem


def test_all_zero_output_passes_where_the_reference_is_zero_or_within_atol():
    zeros = torch.zeros(4)
    c = compare(zeros.clone(), zeros, Tolerance(0.0, 0.0))
    assert c.passed and c.all_zero and c.reference_all_zero
    tiny = torch.full((4,), 1e-30)
    assert compare(zeros, tiny, Tolerance(1e-6, 0.0)).passed  # e.g. denormals flushed to zero


def test_shape_and_dtype_mismatches_fail_with_the_reason():
    ref = torch.ones(2, 3)
    shape = compare(torch.ones(3, 2), ref)
    assert not shape.passed and "shape (3, 2)" in shape.problem and "(2, 3)" in shape.problem
    dtype = compare(torch.ones(2, 3, dtype=torch.float16), ref)
    assert not dtype.passed and "float16" in dtype.problem


def test_integers_and_bools_must_match_exactly_by_default():
    ref = torch.tensor([1, 2, 3])
    assert compare(ref.clone(), ref).passed
    assert not compare(torch.tensor([1, 2, 4]), ref).passed
    flags = torch.tensor([True, False])
    assert not compare(torch.tensor([True, True]), flags).passed


def test_empty_outputs_pass():
    c = compare(torch.empty(0, 3), torch.empty(0, 3))
    assert c.passed and not c.all_zero


def test_default_tolerance_follows_dtype_and_reference_scale():
    assert default_tolerance(torch.float16).rtol > default_tolerance(torch.float32).rtol
    assert default_tolerance(torch.bfloat16).rtol > default_tolerance(torch.float16).rtol
    small = default_tolerance(torch.float32, torch.full((10,), 1.0))
    large = default_tolerance(torch.float32, torch.full((10,), 1000.0))
    assert large.atol == pytest.approx(1000 * small.atol)
    assert default_tolerance(torch.float32, torch.zeros(10)).atol > 0  # a floor for zero references
    assert default_tolerance(torch.int64) == Tolerance(0.0, 0.0)


def test_per_output_tolerances_with_a_default():
    ref = torch.ones(3)
    names = ("trtrtx_region_0/output_1", "output_1")
    assert pick_tolerance(names, torch.float32, ref, 0.5, 0.25) == Tolerance(0.5, 0.25)
    atol = {"output_1": 0.1, "": 0.2}
    assert pick_tolerance(names, torch.float32, ref, atol, None).atol == 0.1
    assert pick_tolerance(("x/output_0", "output_0"), torch.float32, ref, atol, None).atol == 0.2
    qualified = {"trtrtx_region_0/output_1": 0.3, "output_1": 0.1}
    assert pick_tolerance(names, torch.float32, ref, qualified, None).atol == 0.3  # most specific wins
    default = default_tolerance(torch.float32, ref)
    assert pick_tolerance(("output_7",), torch.float32, ref, {"output_1": 0.1}, None) == default


def test_summary_carries_the_numbers():
    c = compare(torch.tensor([1.0, 2.5]), torch.tensor([1.0, 2.0]), Tolerance(0.1, 0.1), name="output_3")
    text = c.summary()
    assert "output_3" in text and "max abs err 0.5" in text and "atol=0.5" in text and "rtol=0.25" in text
