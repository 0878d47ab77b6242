"""ONNX op signatures, made once per op instead of once per node the exporter emits.

While it translates a graph, the ONNX exporter records every ONNX node it emits (a torchlib
function emits several per ATen op: Constant, Reshape, Cast, ...) by first building the op's
signature from its ONNX schema (onnx_ir's OpSignature.from_op_schema, which parses every type
constraint's type strings). BERT-base's export builds some 2,300 of them for a few dozen distinct
ops: 0.8 of its 1.2 s of translation on a small CPU, sampled.

A signature depends only on its schema, and a standard ONNX schema is named by its domain, name
and opset version. Within `memoized`, this thread's calls for a standard schema return the one
signature made for it; other threads, other callers and custom domains get a new one, as before.
Sharing is safe for the exporter: it copies an attribute's default before giving it to a node.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import onnx_ir

_STANDARD = frozenset({"", "ai.onnx", "ai.onnx.ml"})


class _Memo(threading.local):
    on = False


_MEMO = _Memo()
_LOCK = threading.Lock()  # guards installing the wrapper (once per process) and the table
_TABLE: dict[tuple[str, str, int], Any] = {}
SHARED = [0]  # calls answered from the table (tests read it)


def _memoizing(make: Callable[[Any], Any]) -> Callable[..., Any]:
    def from_op_schema(cls: Any, op_schema: Any) -> Any:
        domain = getattr(op_schema, "domain", None)
        if not _MEMO.on or domain not in _STANDARD:
            return make(op_schema)
        key = (domain, op_schema.name, op_schema.since_version)
        signature = _TABLE.get(key)
        if signature is not None:
            SHARED[0] += 1
        else:
            signature = make(op_schema)
            with _LOCK:
                signature = _TABLE.setdefault(key, signature)
        return signature

    from_op_schema._trtrtx = True  # type: ignore[attr-defined]
    return from_op_schema


def _install() -> None:
    signature_cls = onnx_ir.schemas.OpSignature
    with _LOCK:
        current = signature_cls.__dict__["from_op_schema"]
        if not getattr(current.__func__, "_trtrtx", False):
            wrapped = classmethod(_memoizing(current.__get__(None, signature_cls)))
            setattr(signature_cls, "from_op_schema", wrapped)  # noqa: B010 (a method swapped on purpose)


@contextlib.contextmanager
def memoized() -> Iterator[None]:
    """Within: this thread's signatures of standard ONNX schemas are made once per process."""
    _install()
    previous, _MEMO.on = _MEMO.on, True
    try:
        yield
    finally:
        _MEMO.on = previous


def memoized_count() -> int:
    """How many signatures are kept (tests read it)."""
    return len(_TABLE)
