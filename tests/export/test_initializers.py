"""A region's ONNX initializers (rtx_backend/export/initializers.py): new weight values replace
them by name, in the skeleton and among the external weights, and read back as written."""

from __future__ import annotations

import dataclasses

import torch

from rtx_backend.export.initializers import initializer_specs, initializer_value, spec, with_weights
from rtx_backend.export.model import EXTERNAL_MIN_BYTES, OnnxModel
from tests.helpers import compile_and_run, regions

CPU = {"min_block_size": 1, "target_compute_capabilities": [(8, 6)]}


def _region() -> tuple[object, dict[str, torch.Tensor]]:
    """A region with one weight stored apart from the skeleton and one inside it, and the
    frozen tensors by initializer name."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).eval()
    x = torch.randn(3, 32)
    out = compile_and_run(model, x, **CPU)
    assert torch.allclose(out, model(x), atol=1e-5)
    region = regions()[0]
    frozen = {"gm." + name: t for name, t in region.graph_module.named_buffers()}
    return region.onnx, frozen


def test_new_values_replace_initializers_by_name_in_both_places():
    onnx, frozen = _region()
    assert isinstance(onnx.source, OnnxModel) and onnx.source.skeleton is not None
    specs = initializer_specs(onnx)
    assert set(frozen) <= set(specs)
    assert {n: spec(t) for n, t in frozen.items()} == {n: specs[n] for n in frozen}
    large = [n for n, t in frozen.items() if t.numel() * t.element_size() >= EXTERNAL_MIN_BYTES]
    small = [n for n, t in frozen.items() if t.numel() * t.element_size() < EXTERNAL_MIN_BYTES]
    assert large and small  # the 32x16 weight is stored apart, the biases and 16x2 weight inline
    assert set(large) <= set(onnx.source.weights)

    values = {n: torch.full_like(t, 0.25) + i for i, (n, t) in enumerate(frozen.items())}
    updated = with_weights(onnx, values)
    for name, value in values.items():
        assert torch.equal(initializer_value(updated, name), value), name
        assert torch.equal(initializer_value(onnx, name), frozen[name])  # the region's own model is unchanged
    assert initializer_specs(updated) == specs
    assert initializer_value(updated, "no such initializer") is None


def test_a_serialized_model_takes_new_values_too():
    onnx, frozen = _region()
    plain = dataclasses.replace(onnx, source=onnx.model)  # the model as bytes, as a loaded package holds it
    name = next(iter(frozen))
    value = torch.randn_like(frozen[name])
    updated = with_weights(plain, {name: value})
    assert isinstance(updated.source, bytes)
    assert torch.equal(initializer_value(updated, name), value)
    for other in list(frozen)[1:]:
        assert torch.equal(initializer_value(updated, other), frozen[other])


def test_spec_has_no_onnx_type_for_complex_tensors():
    assert spec(torch.zeros(2, 3, dtype=torch.float16)) == ((2, 3), 10)
    assert spec(torch.zeros(2, dtype=torch.complex64)) is None
