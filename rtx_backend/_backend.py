"""The trtrtx backend: the function torch.compile calls, and the chain it runs.

    Dynamo FX graph -> graph cache, or: lower to ATen (lower/) -> policy and partition (plan/)
    -> per region: ONNX (export/) -> screened, built engine (build/, cache/) -> runtime module (run/)
    -> GraphModule with regions swapped for runtime modules (assemble/), behind the weight guard
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import _host, _stats, _torch_compat
from ._defaults import with_defaults
from ._errors import OptionsError, RtxBackendError, RuntimeUnavailableError
from ._log import one_line, say_once
from ._options import options_for_mode
from ._recompiles import warn_if_dtype_recompile
from ._record import record_not_lowered
from .assemble import rest as _rest
from .assemble.reuse import compile_or_reuse
from .assemble.weights import guard_weights
from .build.profiles import symbol_overrides
from .cache import engines as _engine_cache
from .lower.lowering import needs_autograd

log = logging.getLogger("rtx_backend")


def trtrtx(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, options: Any = None, mode: str | None = None
) -> Callable[..., Any]:
    """The `torch.compile` backend registered as "trtrtx".

    `options` is torch.compile's `options=` dict (see `rtx_backend.Options`); `mode` is its
    `mode=`: "default", or "reduce-overhead" (TensorRT-RTX's native CUDA graphs,
    cuda_graph_strategy="whole_graph_capture"); other modes raise OptionsError.
    """
    try:
        opts = options_for_mode(mode, with_defaults(options))
    except RtxBackendError as exc:  # OptionsError, TargetError: catchable as documented, not Dynamo's wrapper
        raise _torch_compat.past_dynamo(exc) from exc.__cause__
    _stats.count("backend_calls")
    warn_if_dtype_recompile(example_inputs)
    if needs_autograd(example_inputs):
        why = ("this graph records autograd history (grad mode is on and an input or parameter requires grad), "
               "and trtrtx compiles inference graphs only")
        by_inductor = _rest.rest_choice(opts).inductor
        # once a process: each graph of a model (graph breaks, recompiles) would say it again;
        # recording() lists every such graph
        say_once(f"trtrtx: {why}, so it runs in {'inductor' if by_inductor else 'PyTorch'}. Call the model under "
                 "torch.no_grad() or torch.inference_mode() to run it on TensorRT-RTX.", key="grad-mode")
        record_not_lowered(why)
        return _rest.whole_graph(gm, example_inputs, opts, gm.forward) if by_inductor else gm.forward
    if any(isinstance(t, torch.Tensor) and t.is_meta for t in example_inputs):
        # no data to run on: PyTorch gives meta outputs of the right shapes and dtypes, as eager does
        log.info("trtrtx: this graph takes meta tensors; it runs in PyTorch (meta outputs, as in eager mode)")
        record_not_lowered("it takes meta tensors (PyTorch gives meta outputs, as in eager mode)")
        return gm.forward
    try:
        # weights are hashed once (for the graph key and the engine keys), copied to the host once
        with _engine_cache.digest_scope(), _host.sharing():
            roots: list[torch.fx.GraphModule] = []
            direct: list[torch.fx.GraphModule] = []
            fn = compile_or_reuse(gm, example_inputs, opts, roots, direct.append)
        # (inside the net below: a graph whose weights cannot be checked runs in PyTorch)
        return guard_weights(fn, roots, example_inputs, gm.forward, opts, lambda: symbol_overrides(gm, opts),
                             direct[0] if len(direct) == 1 else None)
    except _torch_compat.dynamo_exc().TorchDynamoException as exc:
        if isinstance(exc, _torch_compat.dynamo_exc().RestartAnalysis):
            # e.g. dynamic=True makes float attributes (LayerNorm eps) symbolic, then Dynamo
            # specializes them and traces again: the same compile, not a recompile
            _stats.count("backend_restarts")
        raise  # Dynamo's own control flow (restarts, graph breaks): not ours to judge
    except Exception as exc:
        if opts.strict or isinstance(exc, OptionsError) or (
                isinstance(exc, RuntimeUnavailableError) and opts.runtime == "tensorrt_rtx"):
            # an option that does not fit this graph is the user's to fix, not a fallback; raised
            # past Dynamo so that `except rtx_backend.OptionsError` (or RtxBackendError) catches it
            if isinstance(exc, RtxBackendError):
                raise _torch_compat.past_dynamo(exc) from exc.__cause__
            raise
        # Regions fall back one by one (compile_region); this is the net under the rest of the
        # pipeline (lowering, policy, partition): a working model must not become a crash.
        by_inductor = _rest.rest_choice(opts, unlowered=True).inductor
        log.warning("trtrtx: this graph runs in %s: compiling it failed (%s)",
                    "inductor" if by_inductor else "PyTorch", one_line(exc))
        record_not_lowered(f"compiling it failed ({one_line(exc)})")
        log.debug("trtrtx: graph compilation failed", exc_info=exc)
        return _rest.whole_graph(gm, example_inputs, opts, gm.forward) if by_inductor else gm.forward
