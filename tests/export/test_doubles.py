"""A region's float64 computed in float32 for the engine (rtx_backend/export/doubles.py)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from rtx_backend._errors import BuildError
from rtx_backend.export.doubles import truncate_doubles

aten = torch.ops.aten


def _traced(f, *args) -> torch.fx.GraphModule:
    gm = make_fx(f)(*args)
    FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*args)
    return gm


def test_dtype_arguments_constants_and_values_become_float32():
    table = torch.linspace(0, 1, 4, dtype=torch.float64)

    def f(x):
        inv = 1.0 / (100 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8))
        return ((x.to(torch.float64) * inv + table).cos()).to(torch.float32)

    x = torch.randn(3, 4)
    gm = _traced(f, x)
    assert truncate_doubles(gm) > 0
    dtypes = {n.meta["val"].dtype for n in gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)}
    assert dtypes == {torch.float32}
    args = [a for n in gm.graph.nodes for a in (*n.args, *n.kwargs.values())]
    assert torch.float64 not in args
    constants = [getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"]
    assert constants and all(c.dtype == torch.float32 for c in constants)
    torch.testing.assert_close(gm(x), f(x))


def test_a_region_without_float64_is_left_as_it_is():
    gm = _traced(lambda x: (x * 2).sum(), torch.randn(3))
    code = gm.code
    assert truncate_doubles(gm) == 0 and gm.code == code


@pytest.mark.parametrize("edge", ["input", "output"])
def test_float64_at_the_region_edge_is_refused(edge):
    if edge == "input":
        gm = _traced(lambda x: x.float() * 2, torch.randn(3, dtype=torch.float64))
    else:
        gm = _traced(lambda x: x.double() * 2, torch.randn(3))
    with pytest.raises(BuildError, match="float64"):
        truncate_doubles(gm)
