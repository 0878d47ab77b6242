"""ONNX op signatures made once per op during our exports (rtx_backend/lower/signatures.py)."""
from __future__ import annotations

import concurrent.futures

import onnx
import onnx_ir as ir
import torch

from rtx_backend.export.bridge import export_region
from rtx_backend.lower import signatures

from ..models import MLP
from .test_registry import _check_against_graph, _region, _seeded


def test_within_memoized_a_standard_schema_gets_one_signature():
    schema = onnx.defs.get_schema("Reshape", 14)
    with signatures.memoized():
        first = ir.schemas.OpSignature.from_op_schema(schema)
        again = ir.schemas.OpSignature.from_op_schema(onnx.defs.get_schema("Reshape", 14))
    assert again is first
    assert (first.domain, first.name, first.since_version) == ("", "Reshape", 14)
    assert [p.name for p in first.params] == ["data", "shape", "allowzero"]


def test_outside_memoized_and_in_other_threads_each_call_makes_its_own():
    schema = onnx.defs.get_schema("Add", 14)
    with signatures.memoized():
        kept = ir.schemas.OpSignature.from_op_schema(schema)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # another thread is not in the memo
            other = pool.submit(ir.schemas.OpSignature.from_op_schema, schema).result()
    outside = ir.schemas.OpSignature.from_op_schema(schema)
    assert other is not kept and outside is not kept
    assert str(other) == str(kept) == str(outside)  # the same signature, made again


def test_a_custom_domain_is_never_shared():
    schema = onnx.defs.OpSchema("Thing", "com.example.custom", 1, inputs=[], outputs=[])
    with signatures.memoized():
        first = ir.schemas.OpSignature.from_op_schema(schema)
        second = ir.schemas.OpSignature.from_op_schema(schema)
    assert first is not second


def test_an_export_makes_each_signature_once_and_gives_the_same_model(monkeypatch):
    monkeypatch.setattr(signatures, "_TABLE", {})
    monkeypatch.setattr(signatures, "SHARED", [0])
    gm = _region(_seeded(MLP), torch.randn(5, 16))
    region = export_region(gm)
    assert signatures.memoized_count() > 0  # the export's signatures went through the memo
    assert signatures.SHARED[0] > 0  # and were made once each (the MLP's Gemms share one)
    _check_against_graph(gm, region)
