"""Runtime module: what replaces a region in the returned GraphModule.

It holds the region's ONNX model, its engine (when one was built) and its FX graph, and runs
whichever executor was chosen at compile time, returning what the region returned (a tuple).
"""

from __future__ import annotations

import logging
import operator
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import _torch_compat
from .._errors import CudaGraphError, RtxBackendError
from .._types import EngineData, OnnxRegion
from ..build.profiles import EngineProfile
from ..cache.engines import Key, fetch_attr
from ..run.choices import Decision
from ..run.executors import Executor, TorchExecutor
from ..run.validation import capturing, first_call

log = logging.getLogger("rtx_backend")

_SHAPE = operator.attrgetter("shape")
_GLOBAL_HOOKS = _torch_compat.global_forward_hooks  # (the dicts themselves: torch fills them in place)
_GLOBAL_PRE_HOOKS = _torch_compat.global_forward_pre_hooks


def picker(indices: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """A C function that takes the arguments at `indices` out of a sequence, as a tuple: a slice
    when they are consecutive (itemgetter of one index would return the item itself)."""
    if not indices or list(indices) == list(range(indices[0], indices[-1] + 1)):
        return operator.itemgetter(slice(indices[0], indices[-1] + 1) if indices else slice(0, 0))
    return operator.itemgetter(*indices)


class RegionModule(torch.nn.Module):
    """One region, run by TensorRT-RTX, ONNX Runtime, or (fallback) PyTorch."""

    def __init__(
        self,
        name: str,
        graph: torch.fx.GraphModule,
        onnx_region: OnnxRegion | None,
        engine: EngineData | None,
        executor: Executor,
        *,
        validate: bool = True,
        profile: EngineProfile | None = None,
        on_validated: Callable[[], None] | None = None,
        engine_key: Key | None = None,
        device: torch.device | None = None,
        strict: bool = False,
    ) -> None:
        super().__init__()
        self.name = name
        self.graph_module = graph
        self.onnx = onnx_region
        self.engine = engine
        self.executor = executor
        self.validate = validate  # first-call check of each executor against PyTorch (validation.py)
        self.validated_executor: object = None
        # called when `executor` (the engine-cache entry's engine, not a widened one) passes its check
        self.on_validated = (executor, on_validated) if on_validated is not None else None
        self.validation_lock = threading.Lock()  # concurrent first calls wait for the verdict
        self.checked: object = None  # the executor whose check has finished (validated_executor is
        # set when the check starts)
        self.profile = profile  # the engine's optimization profile, widened on demand
        self.widen_failed = False
        self.capture_fallback_said = False
        self.fitted_shapes: tuple[torch.Size, ...] | None = None  # the last input shapes the executor takes
        self.engine_key = engine_key  # the engine-cache entry of `engine` (a graph-cache entry names it)
        self.device = device or region_device(graph)  # given where the graph has lost its metadata
        self.strict = strict  # a failure at call time raises instead of falling back to PyTorch
        self.pick_tensors = picker(onnx_region.tensor_args if onnx_region is not None else ())
        self.why = ""  # why the region does not run on TensorRT-RTX (rtx_backend.recording shows it)
        self.engine_source = ""  # "built", "engine cache" or "" (no engine): set by the backend
        self.fastest: Decision | None = None  # option fastest's decision for it (run/choices.py)
        # weights that changed (assemble/updates.py): the engine's executor while the update thread
        # brings it the new weights (PyTorch runs the region meanwhile), and the count of changes
        self.updating: Executor | None = None
        self.generation = 0
        self.building = False  # its engine is being built in the background (assemble/background.py)

    @property
    def kind(self) -> str:
        return self.executor.kind

    @property
    def in_pytorch(self) -> bool:
        """Whether PyTorch runs the region for good (not only until its engine, being built in the
        background, is ready)."""
        return self.executor.kind == "pytorch" and not self.building

    def take(self, fresh: RegionModule, run: bool = True) -> None:
        """Take what `fresh` (this region compiled again) was given: its model, engine, profile and
        first-call check, and its executor last, so that a call on another thread finds the rest
        in place; not the executor unless `run`."""
        for name in ("onnx", "engine", "profile", "engine_key", "on_validated", "validate", "pick_tensors"):
            setattr(self, name, getattr(fresh, name))
        self.fitted_shapes = None
        self.validated_executor = None
        self.checked = None
        if run:
            self.executor = fresh.executor

    @property
    def chosen(self) -> str:
        """"inductor" where option fastest found inductor's code for it the faster, else ""."""
        return "inductor" if self.fastest is not None and self.fastest.kept == "inductor" else ""

    def forward(self, *args: Any) -> tuple[torch.Tensor, ...]:
        executor = self.executor
        if executor.reference:  # PyTorch runs the region: nothing to pick, fit or check
            return tuple(executor.run(args))
        tensors = self.pick_tensors(args)
        shapes = tuple(map(_SHAPE, tensors))  # (C calls: no Python frame per tensor)
        if shapes != self.fitted_shapes:  # checked once per shape change, not on every call
            if self.profile is not None and not self.fit_profile(tensors):
                return tuple(self.graph_module(*args))  # no engine for these shapes: PyTorch runs them
            if self.executor.fixed_shapes and any(t.numel() == 0 for t in tensors):
                return tuple(self.graph_module(*args))  # TensorRT-RTX does not run empty tensors
            self.fitted_shapes = shapes
        runner = self.executor  # fit_profile may have swapped in an engine for a wider profile
        validating = self.validate and self.checked is not runner
        reference = self.reference_while_pending(runner, args) if validating else None
        try:
            outputs = tuple(runner.run(args, tensors, shapes))
        except CudaGraphError as exc:  # inside a CUDA graph capture the engine cannot take part in
            if not self.capture_fallback_said:
                self.capture_fallback_said = True
                log.warning("trtrtx: %s. The region runs in PyTorch inside such captures.", exc)
            return tuple(self.graph_module(*args))
        except Exception as exc:  # contexts not made (TrtExecutor._setup), enqueue failed, ORT raised
            return self.run_in_pytorch(runner, exc, args)
        if validating:
            with self.validation_lock:  # a thread must not return unchecked outputs while one checks
                replaced = self.executor is not runner  # by a check in another thread, or new weights
                if not replaced:
                    if self.validated_executor is not runner:
                        outputs = first_call(self, runner, args, outputs, reference)
                    if self.validated_executor is runner:  # not during a CUDA graph capture
                        self.checked = runner
            if replaced:  # (outside the lock: the new runner's own check takes it)
                return tuple(self.forward(*args))
        return outputs

    def weight_versions(self) -> tuple[tuple[int, int], ...]:
        """Each constant the region's graph reads (its frozen weights share their version counters
        with the model's), by identity and version. An executor's `made_for` holds them as they were
        when it was made: a first-call check that fails after they moved raced a weight change
        (validation.py)."""
        found = []
        for node in self.graph_module.graph.find_nodes(op="get_attr"):
            value = fetch_attr(self.graph_module, str(node.target))
            if isinstance(value, torch.Tensor):
                found.append((id(value), -1 if value.is_inference() else value._version))
        return tuple(found)

    def __call__(self, *args: Any) -> tuple[torch.Tensor, ...]:
        """The partitioned graph calls its regions on every call: straight to forward unless a
        forward hook is set (the cross-check sets them), without nn.Module's dispatch of the
        other kinds of hooks, which cost about a microsecond a call."""
        if self._forward_hooks or self._forward_pre_hooks or _GLOBAL_HOOKS or _GLOBAL_PRE_HOOKS:
            return super().__call__(*args)  # type: ignore[no-any-return]
        return self.forward(*args)

    def reference_while_pending(self, runner: Executor, args: Sequence[Any]) -> tuple[torch.Tensor, ...] | None:
        """PyTorch's results for the first-call check, computed while the engine's contexts are
        still being made on the setup thread (a cold engine's take a second or more: TensorRT-RTX
        compiles its kernels), so that the two overlap; and always for an executor that writes its
        inputs in place (PyTorch must see their values from before the call). None when the
        contexts are ready, during a CUDA graph capture, or if PyTorch fails here (first_call then
        runs it and says why)."""
        if self.validated_executor is runner:
            return None
        # an engine that writes its inputs in place (a KV cache) must be checked against PyTorch's
        # results on the inputs as they were: computed first, whether or not the contexts are ready
        if not (runner.pending() or getattr(runner, "aliased", None)):
            return None
        if capturing(args):
            return None
        try:
            return tuple(self.graph_module(*args))
        except Exception:
            return None

    def run_in_pytorch(self, runner: Executor, exc: Exception, args: Sequence[Any]) -> tuple[torch.Tensor, ...]:
        """The region's results from PyTorch, which runs it from now on, when its executor fails
        at call time (contexts that cannot be made, a failed enqueue, an ONNX Runtime error): one
        warning, then PyTorch; unless the options ask for TensorRT-RTX or nothing
        (runtime="tensorrt_rtx", strict), which raise."""
        if not isinstance(exc, RtxBackendError):
            wrapped = RtxBackendError(f"region {self.name}: {runner.kind} failed: {type(exc).__name__}: {exc}")
            wrapped.__cause__ = exc
            exc = wrapped
        if self.strict:
            raise exc
        if self.executor is runner:  # (not taken again by a thread that failed at the same time)
            log.warning("trtrtx: %s; region %s runs in PyTorch from now on", exc, self.name)
            self.executor = TorchExecutor(self.graph_module)
            self.why = str(exc)
        return tuple(self.graph_module(*args))

    def fit_profile(self, tensors: Sequence[torch.Tensor]) -> bool:
        """Whether the executor can run these shapes, after building an engine for a widened
        profile when they fall outside the engine's (the new engine replaces the old one).

        False only when TensorRT-RTX runs the region and no wider engine could be built; ONNX
        Runtime runs any shape of its dynamic model, so it goes on regardless.
        """
        assert self.profile is not None and self.onnx is not None
        shapes = {s.name: tuple(t.shape) for s, t in zip(self.onnx.inputs, tensors)}
        try:
            self.profile.fit(shapes, self._install_engine)
        except RtxBackendError as exc:
            if not self.widen_failed:
                self.widen_failed = True
                log.warning(
                    "trtrtx: region %s: no engine for input shapes %s (%s); such calls run in %s",
                    self.name, shapes, exc, "PyTorch" if self.executor.fixed_shapes else self.kind,
                )
            return not self.executor.fixed_shapes
        return True

    def _install_engine(self, engine: EngineData) -> None:
        """Swap in an engine built for a wider profile (a new TensorRT-RTX context for it)."""
        widened = self.executor.with_engine(engine)
        widened.made_for = self.executor.made_for  # (the same weights)
        self.executor = widened
        self.engine = engine

    def extra_repr(self) -> str:
        return f"{self.name}: {self.kind}"


def region_device(region_gm: torch.fx.GraphModule) -> torch.device:
    """Where the region's tensors live (its inputs', else its outputs')."""
    for node in region_gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            return val.device
    return torch.device("cpu")


def direct_forward(gm: torch.fx.GraphModule) -> Callable[..., Any]:
    """What the backend returns for a partitioned graph: its forward; or, when all the graph does
    is pass some of its inputs to one region module and return that region's results in order
    (a model lowered whole), the region module behind an argument picker: no generated code, no
    submodule lookup and no result tuple to rebuild on every call."""
    graph = gm.graph
    placeholders = list(graph.find_nodes(op="placeholder"))
    calls = list(graph.find_nodes(op="call_module"))
    if len(calls) != 1 or calls[0].kwargs or not all(a in placeholders for a in calls[0].args):
        return gm.forward
    call = calls[0]
    region = gm.get_submodule(str(call.target))
    results = region.graph_module.graph.output_node().args[0] if isinstance(region, RegionModule) else None
    returned = graph.output_node().args[0]
    if not (
        isinstance(results, (tuple, list)) and isinstance(returned, (tuple, list)) and len(returned) == len(results)
        and all(r.op == "call_function" and r.target is operator.getitem and r.args == (call, i)  # type: ignore[union-attr]
                for i, r in enumerate(returned))
        and len(graph.nodes) == len(placeholders) + len(returned) + 2  # nothing else: the call and the output
    ):
        return gm.forward
    pick = picker([placeholders.index(a) for a in call.args])  # type: ignore[arg-type]
    forward = region.forward

    def direct(*args: Any) -> tuple[torch.Tensor, ...]:
        # What GraphModule's call, then RegionModule.__call__, would do, in one frame: run with
        # autocast off (as aot_autograd runs a graph) and hooks, if any, called.
        if (_torch_compat.is_any_autocast_enabled() or region._forward_hooks or region._forward_pre_hooks
                or _GLOBAL_HOOKS or _GLOBAL_PRE_HOOKS):
            with _torch_compat.DisableAutocast():
                return region(*pick(args))  # type: ignore[no-any-return]
        return forward(*pick(args))

    direct.autocast_off = True  # type: ignore[attr-defined]  # (without_autocast leaves it as it is)
    return direct

