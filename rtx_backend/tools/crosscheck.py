"""crosscheck: run every lowered region in PyTorch, ONNX Runtime and TensorRT-RTX on the same
inputs and compare, so that users can trust (or locate a fault in) what was lowered.

    report = rtx_backend.crosscheck(model, x, options={"min_block_size": 1})
    print(report)          # a table: region, runtime, output, errors, tolerances, NaN/Inf, zeros
    assert report          # true only when everything agrees

How: the model is compiled as torch.compile would (first-call validation off, so that nothing
hides a fault) and called once; that result is compared with eager PyTorch. A second call
records each region's actual arguments with forward hooks and substitutes the region's PyTorch
outputs, so every region is checked on the inputs PyTorch would give it, whatever an upstream
region did. Each region's ONNX model (ONNX Runtime) and engine (TensorRT-RTX, where this GPU
can run it) then run on those arguments and are compared with the PyTorch outputs through the
executors the backend itself uses.

FP16 and BF16 outputs that miss the default tolerances are judged again against an FP32 run (of
the region's graph, or of a float32 copy of the model), as first-call validation judges them:
two low-precision results can differ from each other by more than either differs from FP32. An
output passes that way only with no tolerance of the user's own for it; the table says
"ok vs FP32" for it.

Long because the report's table is rendered here, beside the checks it shows.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .._backend import trtrtx
from .._defaults import with_defaults
from .._errors import RuntimeUnavailableError
from .._options import Options
from .._record import recording
from .._torch_compat import tree_flatten, tree_map
from ..run.compare import (
    OutputComparison,
    ToleranceSpec,
    compare,
    fp32_may_overturn,
    judge_by_fp32,
    pick_tolerance,
)
from ..run.executors import Executor, OrtExecutor, TrtExecutor
from ..run.validation import run_in_fp32, upcast

log = logging.getLogger("rtx_backend")

PYTORCH = "pytorch"


@dataclasses.dataclass(frozen=True)
class RuntimeCheck:
    """One runtime of one region (or the whole compiled model) against its reference."""

    region: str
    runtime: str  # "onnxruntime", "tensorrt_rtx", or "trtrtx" for the compiled model
    reference: str  # "pytorch": the region's FX graph, or "eager": the model itself
    outputs: tuple[OutputComparison, ...] = ()
    skipped: str = ""  # why it did not run here (not a failure)
    error: str = ""  # it ran and raised (a failure)

    @property
    def passed(self) -> bool:
        return not self.error and all(o.passed for o in self.outputs)


@dataclasses.dataclass(frozen=True)
class CrosscheckReport:
    """Every comparison made; true only when all of them agree. `print(report)` shows a table."""

    checks: tuple[RuntimeCheck, ...]
    regions: tuple[str, ...]

    def __bool__(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def runtimes(self) -> tuple[str, ...]:
        """The region runtimes that ran and were compared with PyTorch."""
        ran = {c.runtime for c in self.checks if c.reference == PYTORCH and not c.skipped}
        return tuple(sorted(ran))

    @property
    def failures(self) -> tuple[RuntimeCheck, ...]:
        return tuple(c for c in self.checks if not c.passed)

    def __str__(self) -> str:
        return render(self)


def crosscheck(
    model: Callable[..., Any],
    *inputs: Any,
    options: Any = None,
    atol: ToleranceSpec = None,
    rtol: ToleranceSpec = None,
    **kwargs: Any,
) -> CrosscheckReport:
    """Compile `model` with trtrtx and compare every region's runtimes with PyTorch on `inputs`.

    `inputs` and `kwargs` are the model's arguments, as the compiled model would be called
    (`crosscheck(model, ids, attention_mask=mask)`); `options`, `atol` and `rtol` are crosscheck's.

    `atol`/`rtol`: a number for every output, or a mapping from output name to number with ""
    as the default; names are "output_0", "<region>/output_0", or "model/output_0" for the
    compiled model's outputs. Unnamed outputs get their dtype's default tolerance (the one
    first-call validation uses). An element fails only when it misses both atol and rtol.
    """
    opts = dataclasses.replace(Options.from_dict(with_defaults(options)), validate=False, engine_build="wait")
    if opts.rest == "auto":  # every region a module call, as the rest in PyTorch makes them (hooks see each)
        opts = dataclasses.replace(opts, rest="pytorch")
    if isinstance(model, torch.nn.Module) and model.training:
        log.warning("trtrtx crosscheck: the model is in training mode; call model.eval() first "
                    "(dropout and batch statistics make runs differ)")
    compiled = torch.compile(model, backend=functools.partial(trtrtx, options=opts))
    with torch.no_grad(), recording() as graphs:
        actual = compiled(*inputs, **kwargs)
    with torch.no_grad():
        expected = model(*inputs, **kwargs)
    labelled = [
        (region.name if len(graphs) == 1 else f"graph{g}/{region.name}", region)
        for g, graph in enumerate(graphs)
        for region in graph.regions
    ]
    captured = _capture(compiled, inputs, kwargs, [r for _, r in labelled])
    checks = [_model_check(actual, expected, atol, rtol, lambda: _model_in_fp32(model, inputs, kwargs))]
    for label, region in labelled:
        if id(region) not in captured:
            checks.append(RuntimeCheck(label, "onnxruntime", PYTORCH, skipped="the region was not called"))
            continue
        args, reference = captured[id(region)]
        for runtime in ("onnxruntime", "tensorrt_rtx"):
            checks.append(_region_check(label, runtime, region, args, reference, opts, atol, rtol))
    return CrosscheckReport(tuple(checks), tuple(label for label, _ in labelled))


def _capture(
    compiled: Callable[..., Any], inputs: Sequence[Any], kwargs: dict[str, Any], regions: list[Any]
) -> dict[int, tuple[tuple[Any, ...], tuple[torch.Tensor, ...]]]:
    """Call `compiled` once; per region, its first arguments and its PyTorch outputs on them."""
    captured: dict[int, tuple[tuple[Any, ...], tuple[torch.Tensor, ...]]] = {}

    def substitute(module: Any, args: tuple[Any, ...], _output: Any) -> tuple[torch.Tensor, ...]:
        reference = tuple(module.graph_module(*args))
        if id(module) not in captured:
            saved = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)
            captured[id(module)] = (saved, reference)
        return reference

    handles = [r.register_forward_hook(substitute) for r in regions]
    try:
        with torch.no_grad():
            compiled(*inputs, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return captured


def _model_in_fp32(model: Callable[..., Any], inputs: Sequence[Any], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The model's outputs from a float32 copy of it (FP16/BF16 weights and inputs made FP32)."""
    fp32 = copy.deepcopy(model).float() if isinstance(model, torch.nn.Module) else model
    args, kw = tree_map(upcast, (tuple(inputs), kwargs))
    with torch.no_grad():
        return [t for t in tree_flatten(fp32(*args, **kw))[0] if isinstance(t, torch.Tensor)]


def _model_check(
    actual: Any, expected: Any, atol: ToleranceSpec, rtol: ToleranceSpec,
    fp32: Callable[[], Sequence[torch.Tensor]],
) -> RuntimeCheck:
    got = [t for t in tree_flatten(actual)[0] if isinstance(t, torch.Tensor)]
    want = [t for t in tree_flatten(expected)[0] if isinstance(t, torch.Tensor)]
    if len(got) != len(want):
        return RuntimeCheck("model", "trtrtx", "eager", error=f"{len(got)} outputs where eager gives {len(want)}")
    return RuntimeCheck("model", "trtrtx", "eager", _compare_all(got, want, "model", atol, rtol, fp32))


def _region_check(
    label: str,
    runtime: str,
    region: Any,
    args: tuple[Any, ...],
    reference: tuple[torch.Tensor, ...],
    options: Options,
    atol: ToleranceSpec,
    rtol: ToleranceSpec,
) -> RuntimeCheck:
    if region.onnx is None:
        return RuntimeCheck(label, runtime, PYTORCH, skipped="no ONNX model: the region runs in PyTorch")
    try:
        executor = _executor(runtime, region, options)
    except _Skip as why:
        return RuntimeCheck(label, runtime, PYTORCH, skipped=str(why))
    except Exception as exc:
        return RuntimeCheck(label, runtime, PYTORCH, error=f"could not load: {type(exc).__name__}: {exc}")
    try:
        outputs = executor.run(args, region.pick_tensors(args))
    except Exception as exc:
        return RuntimeCheck(label, runtime, PYTORCH, error=f"failed to run: {type(exc).__name__}: {exc}")
    if len(outputs) != len(reference):
        return RuntimeCheck(label, runtime, PYTORCH, error=f"{len(outputs)} outputs where PyTorch gives {len(reference)}")
    fp32 = functools.partial(run_in_fp32, region.graph_module, args)
    return RuntimeCheck(label, runtime, PYTORCH, _compare_all(outputs, reference, label, atol, rtol, fp32))


class _Skip(Exception):
    """This runtime cannot run the region on this machine (not a disagreement)."""


def _executor(runtime: str, region: Any, options: Options) -> Executor:
    """The region's own executor for `runtime` when it has one, else a new one."""
    if runtime == "onnxruntime":
        if isinstance(region.executor, OrtExecutor):
            return region.executor
        try:
            return OrtExecutor(region.onnx)
        except Exception as exc:
            if type(exc).__name__ == "NotImplemented":  # a kernel ONNX Runtime's CPU provider lacks
                raise _Skip(f"ONNX Runtime has no kernel for it: {str(exc).splitlines()[0][:200]}") from exc
            raise
    if isinstance(region.executor, TrtExecutor):
        return region.executor
    if region.engine is None:
        raise _Skip("no engine was built (runtime='onnxruntime', or no GPU and no declared target)")
    try:
        return TrtExecutor(region.engine, region.onnx, options, region.name)
    except RuntimeUnavailableError as exc:
        raise _Skip(str(exc)) from exc


def _compare_all(
    outputs: Sequence[torch.Tensor],
    reference: Sequence[torch.Tensor],
    label: str,
    atol: ToleranceSpec,
    rtol: ToleranceSpec,
    fp32: Callable[[], Sequence[torch.Tensor]] | None = None,
) -> tuple[OutputComparison, ...]:
    """Each output against its reference; a low-precision output that misses the default
    tolerances (none of the user's) passes if it is as close to `fp32()`'s as the reference is."""
    out = []
    fp32_outputs: Sequence[torch.Tensor] | None = None
    for i, (got, want) in enumerate(zip(outputs, reference)):
        name = f"output_{i}"
        names = (f"{label}/{name}",) if label == "model" else (f"{label}/{name}", name)
        result = compare(got, want, pick_tolerance(names, want.dtype, want, atol, rtol), name)
        if (fp32 is not None and fp32_may_overturn(result) and atol is None and rtol is None
                and got.shape == want.shape):
            try:
                fp32_outputs = fp32() if fp32_outputs is None else fp32_outputs
                judgment = judge_by_fp32(got, want, fp32_outputs[i], name)
            except Exception as exc:  # no FP32 run: the plain verdict stands
                log.debug("trtrtx crosscheck: %s: no FP32 run to judge %s by: %s", label, name, exc)
                fp32, judgment = None, None
            if judgment is not None and judgment.passed:
                result = dataclasses.replace(result, problem="", fp32=judgment)
        out.append(result)
    return tuple(out)


_COLUMNS = ("region", "runtime", "vs", "output", "shape", "dtype", "max abs", "max rel",
            "min atol", "min rtol", "atol", "rtol", "NaN", "Inf", "zeros", "result")


def render(report: CrosscheckReport) -> str:
    """The report as a fixed-width table, then one line per failure with its reason."""
    verdict = "PASS" if report else "FAIL"
    ran = ", ".join(report.runtimes) or "none"
    head = (f"trtrtx crosscheck: {verdict}; {len(report.regions)} region(s); "
            f"compared with PyTorch: {ran}; compiled model compared with eager")
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    for c in report.checks:
        lead = (c.region, c.runtime, c.reference)
        if c.skipped or c.error:
            rows.append((*lead, ("skipped: " + c.skipped) if c.skipped else ("FAIL: " + c.error)))
            continue
        for o in c.outputs:
            rows.append((*lead, o.name, "x".join(map(str, o.shape)) or "scalar", str(o.dtype).removeprefix("torch."),
                         _num(o.max_abs), _num(o.max_rel), _num(o.min_atol), _num(o.min_rtol),
                         _num(o.tolerance.atol), _num(o.tolerance.rtol), str(o.nan), str(o.inf),
                         "yes" if o.all_zero else "no", _verdict(o)))
            if not o.passed:
                notes.append(f"{c.region} {c.runtime} vs {c.reference}: {o.summary()}")
    widths = [max([len(h)] + [len(r[i]) for r in rows if i < 3 or len(r) == len(_COLUMNS)])
              for i, h in enumerate(_COLUMNS)]
    lines = [head, _line(_COLUMNS, widths)]
    for r in rows:
        lines.append(_line(r, widths) if len(r) == len(_COLUMNS) else _line(r[:3], widths[:3]) + "  " + r[3])
    if notes:
        lines.append("failures:")
        lines.extend(f"  {n}" for n in notes)
    return "\n".join(lines)


def _verdict(o: OutputComparison) -> str:
    if not o.passed:
        return "FAIL"
    return "ok vs FP32" if o.fp32 is not None else "ok"


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()


def _num(value: float) -> str:
    return "0" if value == 0 else f"{value:.2e}"
