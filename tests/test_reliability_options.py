"""Reliability of the options: every value checked when `Options` is built, unknown keys and
unbuildable targets rejected with the valid choices, and random option dicts either accepted
(and then they compile) or rejected with RtxBackendError: nothing else escapes."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from rtx_backend import _trt

pytest.importorskip("hypothesis", reason="the property tests need hypothesis (pip install -e '.[test]')")
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import rtx_backend
from rtx_backend import Options, OptionsError, RtxBackendError, TargetError
from rtx_backend._options import MAX_DIM

SUPPORTED = _trt.buildable_capabilities()


# ---- bad values: each one rejected with a message naming the option and what is valid ------------

BAD_VALUES = [
    ("target_compute_capabilities", "sm86", "(major, minor) or a list of them"),
    ("target_compute_capabilities", 86, "(major, minor) or a list of them"),
    ("target_compute_capabilities", [], "empty"),
    ("target_compute_capabilities", [(8,)], "not a compute capability"),
    ("target_compute_capabilities", [(8, 6, 0)], "not a compute capability"),
    ("target_compute_capabilities", [(8, -6)], "not a compute capability"),
    ("target_compute_capabilities", [(8.0, 6)], "not a compute capability"),
    ("target_compute_capabilities", [(True, 6)], "not a compute capability"),
    ("target_compute_capabilities", ["8.6.1"], "not a compute capability"),
    ("target_compute_capabilities", ["\u00b2.1"], "not a compute capability"),  # '²'.isdigit() is True
    ("target_compute_capabilities", ["sm86"], "not a compute capability"),
    ("min_block_size", 0, "integer >= 1"),
    ("min_block_size", -3, "integer >= 1"),
    ("min_block_size", 2.0, "integer >= 1"),
    ("min_block_size", True, "integer >= 1"),
    ("min_block_size", "5", "integer >= 1"),
    ("min_block_size", None, "integer >= 1"),
    ("torch_executed_ops", "aten.relu", "list of op names"),
    ("torch_executed_ops", ["relu"], "not an ATen op"),
    ("torch_executed_ops", [3], "not an ATen op"),
    ("torch_executed_ops", ["aten.rleu"], "did you mean aten::relu"),
    ("torch_executed_ops", ["aten.add.NoSuchOverload"], "no op"),
    ("runtime", "trt", "'auto', 'tensorrt_rtx', 'onnxruntime'"),
    ("runtime", None, "'auto', 'tensorrt_rtx', 'onnxruntime'"),
    ("runtime", 1, "'auto', 'tensorrt_rtx', 'onnxruntime'"),
    ("dynamic_shapes_kernel_specialization_strategy", "fast", "'lazy', 'eager', 'none'"),
    ("cuda_graph_strategy", True, "'disabled', 'whole_graph_capture'"),
    ("dynamic_shapes", [(1, 8, 64)], "(min, opt, max)"),
    ("dynamic_shapes", {0: (1, 8, 64)}, "(min, opt, max)"),
    ("dynamic_shapes", {-1: {0: (1, 8, 64)}}, "(min, opt, max)"),
    ("dynamic_shapes", {0: {0: (8, 1, 64)}}, "min <= opt <= max"),
    ("dynamic_shapes", {0: {0: (1, 8)}}, "min <= opt <= max"),
    ("dynamic_shapes", {0: {0: (-1, 8, 64)}}, "min <= opt <= max"),
    ("dynamic_shapes", {0: {0: (1, 8, 2**31)}}, str(MAX_DIM)),
    ("dynamic_shapes", {0: {0: (1, 8.5, 64)}}, "min <= opt <= max"),
    ("dynamic_shapes", {0: {0: (0, 0, 0)}}, "max >= 1"),
    ("default_max_dim", 0, "integer in [1, 2147483647]"),
    ("default_max_dim", 2**31, "integer in [1, 2147483647]"),
    ("runtime_cache_path", 3, "path string"),
    ("runtime_cache_path", b"/tmp/x", "path string"),
    ("engine_cache_dir", "cache\0dir", "no NUL"),
    ("engine_cache_size_mb", -1, "integer >= 0"),
    ("validate", "yes", "True or False"),
    ("validate", 1, "True or False"),
    ("strict", None, "True or False"),
    ("progress", "no", "True or False"),
    ("optimize_onnx", 0, "True or False"),
    ("dump_onnx_dir", 1.5, "path string"),
    ("weights", "refitted", "checked"),
    ("weights", True, "frozen"),
    ("weight_update", "later", "background"),
    ("weight_update", 1, "wait"),
    ("engine_build", "later", "['wait', 'background']"),
    ("engine_build", True, "background"),
    ("rest", "tvm", "['auto', 'pytorch', 'inductor']"),
    ("rest", None, "inductor"),
    ("compile_threads", 0, "integer >= 1"),
    ("compile_threads", True, "integer >= 1"),
    ("compile_threads", "all", "integer >= 1"),
    ("fastest", "yes", "True or False"),
    ("fastest", True, "needs rest='inductor'"),
    ("truncate_double", "yes", "True or False"),
    ("truncate_double", 1, "True or False"),
]


@pytest.mark.parametrize(("key", "value", "expected"), BAD_VALUES,
                         ids=[f"{k}={v!r}" for k, v, _ in BAD_VALUES])
def test_bad_value_is_rejected_naming_the_option(key, value, expected):
    with pytest.raises(OptionsError) as info:
        Options.from_dict({key: value})
    assert key in str(info.value)
    assert expected in str(info.value)


def test_every_option_has_a_validator_and_a_bad_value_test():
    fields = {f.name for f in dataclasses.fields(Options)}
    assert fields == {k for k, _, _ in BAD_VALUES}


@pytest.mark.parametrize("target", [(9, 0), (7, 0), (13, 5), (10, 0), (6, 1)])
def test_unbuildable_target_is_rejected_up_front_with_the_supported_list(target):
    with pytest.raises(TargetError) as info:
        Options.from_dict({"target_compute_capabilities": [(8, 6), target]})
    text = str(info.value)
    assert str(target) in text
    assert all(f"({a}, {b})" in text for a, b in SUPPORTED)  # every buildable target is listed
    assert isinstance(info.value, RtxBackendError)


def test_unknown_keys_are_rejected_with_the_valid_ones():
    with pytest.raises(OptionsError) as info:
        Options.from_dict({"min_blok_size": 2, 7: 1, "runtime": "auto"})
    text = str(info.value)
    assert "'min_blok_size'" in text and "7" in text
    for f in dataclasses.fields(Options):
        assert f.name in text


def test_a_misspelt_key_gets_the_nearest_option():
    with pytest.raises(OptionsError) as info:
        Options.from_dict({"min_blok_size": 2, "targets_compute_capability": [(8, 6)], "zzz": 1})
    text = str(info.value)
    assert "'min_blok_size' (did you mean 'min_block_size'?)" in text
    assert "'targets_compute_capability' (did you mean 'target_compute_capabilities'?)" in text
    assert "'zzz';" in text and "'zzz' (did you mean" not in text  # nothing close: no guess


@pytest.mark.parametrize("value", [(8, 6), [8, 6], "8.6", (np.int64(8), np.int64(6))])
def test_one_target_pair_is_accepted_as_the_list_of_that_target(value):
    assert Options.from_dict({"target_compute_capabilities": value}).target_compute_capabilities == ((8, 6),)


def test_a_bad_pair_inside_a_list_is_named_with_what_was_given():
    with pytest.raises(OptionsError) as info:
        Options.from_dict({"target_compute_capabilities": [(8, 6), 7]})
    assert "7 in [(8, 6), 7] is not a compute capability" in str(info.value)
    assert "[(7, 5), (8, 6)]" in str(info.value)  # the message shows the list form


@pytest.mark.parametrize("options", [[("runtime", "auto")], "runtime=auto", 3])
def test_options_that_are_not_a_dict_are_rejected(options):
    with pytest.raises(OptionsError, match="must be a dict"):
        Options.from_dict(options)


def test_accepted_values_are_normalized():
    opts = Options.from_dict({
        "target_compute_capabilities": ["8.6", (7, 5), [8, 6], (np.int64(8), np.int32(9))],
        "min_block_size": np.int64(3),
        "torch_executed_ops": ["aten.relu", torch.ops.aten.add.Tensor, "aten::addmm.default"],
        "runtime": "ONNXRuntime",
        "engine_cache_dir": Path("/tmp/x"),
    })
    assert opts.target_compute_capabilities == ((8, 6), (7, 5), (8, 9))  # parsed, deduplicated, in order
    assert opts.min_block_size == 3 and type(opts.min_block_size) is int
    assert opts.torch_executed_ops == {"aten::relu", "aten::add.Tensor", "aten::addmm"}
    assert opts.runtime == "onnxruntime"
    assert opts.engine_cache_dir == "/tmp/x"


def test_direct_construction_and_replace_are_validated_too():
    with pytest.raises(OptionsError, match="min_block_size"):
        Options(min_block_size=0)
    with pytest.raises(TargetError):
        dataclasses.replace(Options(), target_compute_capabilities=((9, 0),))
    assert Options(runtime="AUTO").runtime == "auto"  # normalized, not only checked


def test_bad_target_through_torch_compile_is_caught_as_target_error():
    model = torch.nn.Linear(4, 4).eval()
    compiled = torch.compile(model, backend="trtrtx", options={"target_compute_capabilities": [(13, 5)]})
    with pytest.raises(TargetError) as info, torch.no_grad():  # as documented: not Dynamo's wrapper
        compiled(torch.randn(2, 4))
    assert "(13, 5)" in str(info.value) and "TORCHDYNAMO_VERBOSE" not in str(info.value)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"options": {"min_blok_size": 2}}, "did you mean 'min_block_size'"),
    ({"options": {"runtime": "vulkan"}}, "runtime"),
    ({"mode": "max-autotune"}, "autotuning"),
])
def test_bad_options_through_torch_compile_are_caught_with_except_options_error(kwargs, match):
    """The README's promise: `except rtx_backend.OptionsError` around the compiled model's first call."""
    compiled = torch.compile(torch.nn.Linear(4, 4).eval(), backend="trtrtx", **kwargs)
    try:
        with torch.no_grad():
            compiled(torch.randn(2, 4))
    except OptionsError as exc:
        assert re.search(match, str(exc)), str(exc)
        assert type(exc).__name__ == "OptionsError" and isinstance(exc, RtxBackendError)
        assert str(exc).count("\n") == 0  # our one-line message, without Dynamo's hints appended
    else:
        pytest.fail("no OptionsError")


def test_options_are_checked_when_written_with_options_from_dict():
    """The way to check options before anything is compiled: the same OptionsError, at once."""
    with pytest.raises(OptionsError, match="min_block_size"):
        Options.from_dict({"min_block_size": 0})
    checked = Options.from_dict({"min_block_size": 1, "engine_cache_dir": ""})
    compiled = torch.compile(torch.nn.Linear(4, 4).eval(), backend="trtrtx", options=checked)
    with torch.no_grad():
        y = compiled(torch.randn(2, 4))
    assert y.shape == (2, 4)


# ---- property-based: random option dicts ---------------------------------------------------------

def _paths(root: str) -> st.SearchStrategy:
    return st.sampled_from([None, "", os.path.join(root, "a"), os.path.join(root, "b", "c")])


def _option_dicts(root: str) -> st.SearchStrategy:
    """Valid dicts (so that many compile), valid dicts with one bad value or an unknown key, and
    dicts where every value may be bad."""
    ints = st.integers(-3, 12)
    junk = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=4), ints,
                     st.lists(ints, max_size=2))
    ops = ["aten.relu", "aten.addmm", "aten::add.Tensor", torch.ops.aten.mul.Tensor]
    valid_range = st.lists(st.integers(0, 64), min_size=3, max_size=3).map(lambda r: tuple(sorted(r)))
    valid = {
        "target_compute_capabilities": st.one_of(st.none(), st.lists(st.sampled_from(SUPPORTED), min_size=1,
                                                                     max_size=3)),
        "min_block_size": st.integers(1, 4),
        "torch_executed_ops": st.lists(st.sampled_from(ops), max_size=2),
        "runtime": st.sampled_from(["auto", "onnxruntime", "tensorrt_rtx", "Auto"]),
        "dynamic_shapes_kernel_specialization_strategy": st.sampled_from(["lazy", "eager", "none", "LAZY"]),
        "cuda_graph_strategy": st.sampled_from(["disabled", "whole_graph_capture"]),
        "dynamic_shapes": st.one_of(st.none(), st.dictionaries(
            st.one_of(st.integers(0, 2), st.sampled_from(["x", "other"])),
            st.dictionaries(st.integers(-2, 2), valid_range, max_size=2), max_size=2)),
        "default_max_dim": st.integers(1, 4096),
        "runtime_cache_path": _paths(root),
        "engine_cache_dir": _paths(root),
        "engine_cache_size_mb": st.integers(0, 64),
        "validate": st.booleans(),
        "dump_onnx_dir": st.sampled_from([None, os.path.join(root, "dump")]),
        "strict": st.booleans(),
        "progress": st.booleans(),
        "optimize_onnx": st.booleans(),
        "compile_threads": st.one_of(st.none(), st.integers(1, 4)),
        "engine_build": st.sampled_from(["wait", "background"]),
    }
    target = st.one_of(st.tuples(st.integers(0, 14), st.integers(0, 9)),
                       st.sampled_from(["8.6", "7.5", "8.6.1", "x", (8,), (8, 6, 1), (8.0, 6)]))
    rng = st.tuples(st.integers(-1, 9), st.integers(0, 9), st.integers(0, 2**32))
    bad = {key: junk for key in valid}
    bad.update({
        "target_compute_capabilities": st.one_of(st.lists(target, max_size=3), junk),
        "torch_executed_ops": st.one_of(st.lists(st.sampled_from(["aten.rleu", "relu", 3, "aten.add.Nope"]),
                                                 min_size=1, max_size=2), junk),
        "runtime": st.one_of(st.sampled_from(["trt", "cuda", ""]), junk),
        "dynamic_shapes": st.one_of(st.dictionaries(st.one_of(st.integers(-1, 2), st.sampled_from(["1x", "", 2.0])),
                                                    st.dictionaries(
            st.integers(-2, 2), rng, min_size=1, max_size=2), min_size=1, max_size=2), junk),
        "default_max_dim": st.one_of(st.integers(-1, 0), st.integers(2**31, 2**33), junk),
        "engine_cache_dir": st.one_of(st.just("bad\0dir"), junk),
    })
    all_valid = st.fixed_dictionaries({}, optional=valid)
    one_bad = st.sampled_from(sorted(bad)).flatmap(lambda k: bad[k].map(lambda v: {k: v}))
    unknown = st.dictionaries(st.text(min_size=1, max_size=6), junk, min_size=1, max_size=1)
    mixed = st.fixed_dictionaries({}, optional={k: st.one_of(valid[k], bad[k]) for k in valid})
    merge = lambda a, b: {**a, **b}  # noqa: E731
    return st.one_of(all_valid, st.builds(merge, all_valid, one_bad), st.builds(merge, all_valid, unknown),
                     mixed)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_random_option_dicts_are_accepted_or_rejected_with_our_error(data, tmp_path_factory):
    options = data.draw(_option_dicts(str(tmp_path_factory.getbasetemp() / "opts")))
    try:
        opts = Options.from_dict(options)
    except RtxBackendError:
        return
    # Accepted: what the pipeline relies on holds.
    assert set(options) <= {f.name for f in dataclasses.fields(Options)}
    assert opts.min_block_size >= 1 and 1 <= opts.default_max_dim <= MAX_DIM
    assert opts.compile_threads is None or opts.compile_threads >= 1
    if opts.target_compute_capabilities is not None:
        assert opts.target_compute_capabilities and set(opts.target_compute_capabilities) <= set(SUPPORTED)
    for dims in (opts.dynamic_shapes or {}).values():
        for lo, opt, hi in dims.values():
            assert 0 <= lo <= opt <= hi <= MAX_DIM


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)) * 2 + 1


_MODEL = _Tiny().eval()
_X = torch.randn(3, 8)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_random_option_dicts_compile_or_raise_our_error(data, tmp_path_factory):
    """Each dict through torch.compile: a correct result, or our error (not Dynamo's wrapper)."""
    root = tmp_path_factory.getbasetemp() / "compile-opts"
    options = data.draw(_option_dicts(str(root)))
    torch._dynamo.reset()
    compiled = torch.compile(_MODEL, backend="trtrtx", options=options)
    try:
        with torch.no_grad():
            y = compiled(_X)
    except RtxBackendError as error:  # ours, as it is: Dynamo does not wrap it
        try:
            opts = Options.from_dict(options)
        except RtxBackendError:
            event("rejected")
            return  # rejected: the same error came through torch.compile
        if isinstance(error, OptionsError) and re.search(r"^dynamic_shapes\[.*\] names dim -?\d+, but input", str(error)):
            event("accepted, refused against the graph")  # a dim beyond the input's rank: only the graph shows it
            return
        # Otherwise, accepted options fail only where this machine cannot do what they ask for.
        assert isinstance(error, rtx_backend.RuntimeUnavailableError), error
        assert opts.runtime == "tensorrt_rtx" and not torch.cuda.is_available()
        event("accepted, no runtime here")
        return
    Options.from_dict(options)  # compiled, so the options were valid
    event("accepted and compiled")
    with torch.no_grad():
        torch.testing.assert_close(y, _MODEL(_X), atol=1e-4, rtol=1e-4)


def test_errors_derive_from_the_package_base():
    for name in ("OptionsError", "TargetError", "BuildError", "RuntimeUnavailableError", "CudaGraphError"):
        assert issubclass(getattr(rtx_backend, name), RtxBackendError)


# ---- iterables, integer-likes, dynamic_shapes against the graph, meta inputs --------------------


class _Index:
    """An integer-like that is not an int (operator.index works on it)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def test_an_iterator_of_targets_serves_every_compile_of_the_same_options():
    options = {"target_compute_capabilities": iter([(8, 6)]), "min_block_size": 1}
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).eval()
    compiled = torch.compile(model, backend="trtrtx", options=options, dynamic=False)
    with torch.no_grad():
        for batch in (2, 3):  # a new static shape: Dynamo calls the backend again, with the same dict
            x = torch.randn(batch, 16)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert rtx_backend.stats()["backend_calls"] == 2
    assert Options.from_dict(options).target_compute_capabilities == ((8, 6),)
    gen = {"torch_executed_ops": (name for name in ["aten.relu"])}
    assert Options.from_dict(gen) is Options.from_dict(gen)
    gen["min_block_size"] = 3  # a changed dict is validated again
    assert Options.from_dict(gen).min_block_size == 3


def test_integer_likes_are_accepted_wherever_an_int_is_and_stored_as_ints():
    import json

    opts = Options.from_dict({
        "target_compute_capabilities": [(np.int64(8), _Index(6))],
        "min_block_size": np.int32(2),
        "default_max_dim": _Index(128),
        "engine_cache_size_mb": np.uint16(10),
        "dynamic_shapes": {np.int64(0): {np.int64(0): (np.int64(1), np.int32(4), _Index(64))}},
    })
    assert opts.target_compute_capabilities == ((8, 6),) and opts.min_block_size == 2
    assert opts.dynamic_shapes == {0: {0: (1, 4, 64)}}
    values = [opts.min_block_size, opts.default_max_dim, opts.engine_cache_size_mb,
              *opts.target_compute_capabilities[0], *opts.dynamic_shapes[0][0], *opts.dynamic_shapes, *opts.dynamic_shapes[0]]
    assert all(type(v) is int for v in values)
    json.dumps({str(k): v for k, v in opts.dynamic_shapes.items()})


def test_numpy_dynamic_shapes_compile_to_an_engine_not_pytorch():
    from .helpers import compile_and_run, regions

    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).eval()
    x = torch.randn(4, 16)
    torch._dynamo.mark_dynamic(x, 0)
    y = compile_and_run(model, x, min_block_size=1, target_compute_capabilities=[(8, 6)],
                        dynamic_shapes={np.int64(0): {np.int64(0): (np.int64(1), np.int64(4), np.int64(32))}})
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    assert [r.kind for r in regions()] == ["onnxruntime"] and rtx_backend.stats()["engine_builds"] == 1


def test_dynamic_shapes_naming_a_dim_beyond_the_inputs_rank_is_an_options_error():
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).eval()
    x = torch.randn(4, 16)
    torch._dynamo.mark_dynamic(x, 0)
    compiled = torch.compile(model, backend="trtrtx", options={
        "min_block_size": 1, "target_compute_capabilities": [(8, 6)], "dynamic_shapes": {0: {2: (1, 4, 32)}}})
    with pytest.raises(OptionsError) as info, torch.no_grad():  # raised when the graph is seen, still ours
        compiled(x)
    assert "names dim 2, but input 0 has 2 dim(s)" in str(info.value)


def test_the_same_options_dict_follows_a_changed_cache_environment(monkeypatch, tmp_path):
    """Options built from one dict are reused while it holds the same values (so an iterator in it
    is read once), but not across a change of the environment that the defaults read."""
    from rtx_backend import Options

    given = {"min_block_size": 1}
    monkeypatch.setenv("RTX_BACKEND_CACHE_DIR", str(tmp_path / "a"))
    first = Options.from_dict(given)
    assert Options.from_dict(given) is first
    monkeypatch.setenv("RTX_BACKEND_CACHE_DIR", str(tmp_path / "b"))
    assert Options.from_dict(given).engine_cache_dir == str(tmp_path / "b" / "engines")
