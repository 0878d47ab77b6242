"""Optimization profiles: ranges from Dynamo and options, containment, widening, rebuilds."""

from __future__ import annotations

import threading

import pytest
import torch

import rtx_backend
from rtx_backend import Options, OptionsError
from rtx_backend._errors import BuildError
from rtx_backend._types import TensorSpec
from rtx_backend.build.profiles import (
    EngineProfile,
    contains,
    dim_range,
    make_profile,
    symbol_overrides,
    widen,
)

F32 = torch.float32


def spec(name, shape, hint, bounds):
    return TensorSpec(name, shape, F32, hint, bounds)


def test_static_inputs_get_no_profile():
    inputs = [spec("input_0", (4, 16), (4, 16), ((4, 4), (16, 16)))]
    assert make_profile(inputs, {}, Options()) == {}


def test_dynamo_bounds_default_max_and_example_as_opt():
    x = spec("input_0", ("s0", "s1", 32), (4, 16, 32), ((2, None), (8, 128), (32, 32)))
    w = spec("input_1", (32, 32), (32, 32), ((32, 32), (32, 32)))  # static: not in the profile
    profile = make_profile([x, w], {}, Options.from_dict({"default_max_dim": 512}))
    # lower bound 2 is Dynamo's 0/1 specialization, not a real limit: the engine takes 1 too
    assert profile == {"input_0": ((1, 8, 32), (4, 16, 32), (512, 128, 32))}


def test_profile_always_contains_the_example():
    x = spec("input_0", ("s0",), (9000,), ((2, None),))
    assert dim_range(x, 0, {}, 4096) == (1, 9000, 9000)
    assert dim_range(x, 0, {"s0": (16, 32, 64)}, 4096) == (16, 32, 9000)


def test_override_wins_over_dynamo_bounds():
    x = spec("input_0", ("s0", "s1"), (4, 16), ((2, 8), (2, None)))
    profile = make_profile([x], {"s0": (1, 2, 64)}, Options())
    assert profile == {"input_0": ((1, 1), (2, 16), (64, 4096))}


def test_contains_checks_every_dim():
    profile = {"a": ((1, 8), (2, 16), (16, 128))}
    assert contains(profile, {"a": (16, 8)})
    assert not contains(profile, {"a": (17, 8)})
    assert not contains(profile, {"a": (1, 7)})
    assert contains(profile, {"other": (10**6,)})  # static inputs are not in the profile


def test_widen_grows_crossed_bounds_geometrically_and_keeps_opt():
    profile = {"a": ((4, 8), (8, 16), (16, 128))}
    assert widen(profile, {"a": (20, 8)}) == {"a": ((4, 8), (8, 16), (32, 128))}
    assert widen(profile, {"a": (100, 8)}) == {"a": ((4, 8), (8, 16), (100, 128))}
    assert widen(profile, {"a": (3, 1)}) == {"a": ((2, 1), (8, 16), (16, 128))}
    wider = widen(profile, {"a": (20, 200)})
    assert contains(wider, {"a": (20, 200)}) and contains(wider, {"a": (4, 8)})


def test_engine_profile_builds_once_per_widening_and_counts_it():
    built, installed = [], []

    def build(profile):
        built.append(profile)
        return f"engine{len(built)}".encode()

    engine = EngineProfile({"a": ((1,), (2,), (8,))}, build)
    assert engine.fit({"a": (8,)}, installed.append) is False
    assert engine.fit({"a": (9,)}, installed.append) is True
    assert installed == [b"engine1"]
    assert engine.profile == {"a": ((1,), (2,), (16,))}
    assert engine.fit({"a": (12,)}, installed.append) is False
    assert len(built) == 1
    assert rtx_backend.stats()["profile_widenings"] == 1  # builds are counted by `build` (the backend's)


def test_profile_changes_only_once_the_new_engine_is_installed():
    engine = EngineProfile({"a": ((1,), (2,), (8,))}, lambda p: b"wide")
    seen = []
    engine.fit({"a": (9,)}, lambda e: seen.append(engine.profile["a"][2]))
    assert seen == [(8,)] and engine.profile["a"][2] == (16,)


def test_concurrent_calls_outside_the_profile_build_once():
    gate = threading.Event()
    built, installed = [], []

    def build(profile):
        gate.wait(5)
        built.append(profile)
        return b"wide"

    engine = EngineProfile({"a": ((1,), (2,), (8,))}, build)
    results = []
    threads = [threading.Thread(target=lambda: results.append(engine.fit({"a": (10,)}, installed.append)))
               for _ in range(4)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join()
    assert len(built) == 1 and installed == [b"wide"] and sorted(results) == [False, False, False, True]


@pytest.mark.parametrize("where", ["build", "install"])
def test_failure_raises_and_is_remembered(where):
    calls = []

    def fail(*args):
        calls.append(args)
        raise BuildError("builder said no")

    build = fail if where == "build" else (lambda p: b"engine")
    install = fail if where == "install" else (lambda e: None)
    engine = EngineProfile({"a": ((1,), (2,), (8,))}, build)
    for _ in range(3):
        with pytest.raises(BuildError, match="builder said no"):
            engine.fit({"a": (9,)}, install)
    assert len(calls) == 1
    assert engine.profile == {"a": ((1,), (2,), (8,))}
    assert engine.fit({"a": (3,)}, install) is False  # shapes inside still run on the old engine


# ---- the dynamic_shapes option -------------------------------------------------------------------

def _overrides_seen_by_backend(fn, inputs, options):
    """symbol_overrides on Dynamo's graph, inside a backend (Dynamo clears the graph's metadata
    after compiling), and the symbols of each input's dims."""
    seen = []

    def capture(gm, example_inputs):
        names = {n.name: [str(d) for d in n.meta["example_value"].shape]
                 for n in gm.graph.nodes if n.op == "placeholder" and n.name.startswith("l_")}
        seen.append((symbol_overrides(gm, Options.from_dict(options)), names))
        return gm.forward

    torch.compile(fn, backend=capture, dynamic=True)(*inputs)
    return seen[0]


def test_option_maps_on_symbols_by_argument_name_and_index():
    linear = torch.nn.Linear(16, 16)

    def fn(x, mask):
        return linear(x), mask * 2

    options = {"dynamic_shapes": {"x": {1: (4, 8, 256)}, 1: {0: (1, 2, 8)}}}
    overrides, symbols = _overrides_seen_by_backend(fn, (torch.randn(2, 8, 16), torch.randn(3, 5)), options)
    # index 1 is `mask`, the second model input: the parameters of `linear` do not count
    assert overrides == {symbols["l_x_"][1]: (4, 8, 256), symbols["l_mask_"][0]: (1, 2, 8)}


def test_option_indexes_inputs_of_a_wrapped_module():
    """Dynamo calls nn.Sequential through a wrapper: its input is args[0], which has no name."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU())
    overrides, symbols = _overrides_seen_by_backend(model, (torch.randn(3, 16),),
                                                    {"dynamic_shapes": {0: {0: (1, 4, 32)}}})
    assert overrides == {symbols["l_args_0_"][0]: (1, 4, 32)}


def test_option_naming_a_missing_input_warns(caplog):
    overrides, _ = _overrides_seen_by_backend(lambda x: x * 2, (torch.randn(3, 4),),
                                              {"dynamic_shapes": {"y": {0: (1, 2, 8)}}})
    assert overrides == {}
    assert "'y'" in caplog.text


@pytest.mark.parametrize("bad", [{-1: {0: (1, 2, 3)}}, {"not a name": {0: (1, 2, 3)}}, {0: {0: (4, 2, 8)}},
                                 {True: {0: (1, 2, 3)}}, {0: {0: (1, 2)}}, [1, 2]])
def test_bad_dynamic_shapes_are_rejected(bad):
    with pytest.raises(OptionsError, match="dynamic_shapes"):
        Options.from_dict({"dynamic_shapes": bad})


def test_unknown_kernel_specialization_strategy_is_rejected():
    with pytest.raises(OptionsError, match=r"lazy.*eager.*none"):
        Options.from_dict({"dynamic_shapes_kernel_specialization_strategy": "fast"})
    assert Options.from_dict({"dynamic_shapes_kernel_specialization_strategy": "EAGER"}) \
        .dynamic_shapes_kernel_specialization_strategy == "eager"


# ---- the widening warning speaks of the model's inputs and the real cause ------------------------

def test_symbols_are_labelled_with_the_models_argument_names():
    def fn(x, mask):
        return x * 2, mask + 1

    overrides, symbols = _overrides_seen_by_backend(fn, (torch.randn(2, 8), torch.randn(3, 5)), {})
    assert overrides == {}  # no option: no ranges, but the labels are there for messages
    assert overrides.labels[symbols["l_x_"][0]] == "x dim 0"
    assert overrides.labels[symbols["l_mask_"][1]] == "mask dim 1"


@pytest.mark.parametrize("declared", [True, False])
def test_widening_warning_names_the_input_and_the_cause(caplog, declared):
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()

    class Named(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)

    options = {"min_block_size": 1, "target_compute_capabilities": [(8, 6)], "engine_cache_dir": "",
               "runtime_cache_path": ""}
    options.update({"dynamic_shapes": {"x": {0: (1, 8, 64)}}} if declared else {"default_max_dim": 64})
    compiled = torch.compile(Named().eval(), backend="trtrtx", dynamic=True, options=options)
    with torch.no_grad():
        compiled(torch.randn(8, 16))
        compiled(torch.randn(100, 16))
    (message,) = [r.getMessage() for r in caplog.records if "wider profile" in r.getMessage()]
    assert "x dim 0 is 100, outside 1..64" in message and "input_0" not in message
    assert "x dim 0: 1..128" in message  # the new range, in the same terms
    if declared:
        assert "the range given in the dynamic_shapes option" in message and "widen that range" in message
    else:
        assert "default_max_dim" in message and "declare the range with the dynamic_shapes option" in message
