"""A saved region's runtime module: its meta read and checked, its options, and the same
RegionModule and executors as a compiled model's, with TensorRT-RTX where it can run the engine
and ONNX Runtime where it cannot (by the rule of run/choose.py)."""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .._errors import PackageError, RuntimeUnavailableError
from .._log import say_once
from .package_archive import FORMAT


@functools.lru_cache(maxsize=256)
def parse_meta(meta: str) -> dict[str, Any]:
    """A region's meta, checked for the fields the runtime reads; raises PackageError."""
    try:
        info = json.loads(meta)
        if info.get("format") != FORMAT:
            raise PackageError(f"a trtrtx::engine call of format {info.get('format')!r}; this rtx_backend reads "
                               f"format {FORMAT}: load it with the rtx_backend that saved it, or save it again")
        for key in ("name", "region", "profile", "plan", "onnx", "options"):
            info[key]
        return info  # type: ignore[no-any-return]
    except PackageError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PackageError(f"a trtrtx::engine call has unreadable metadata ({type(exc).__name__}: {exc})") from exc


def region_specs(info: Mapping[str, Any], onnx: bytes = b"") -> Any:
    """The region's OnnxRegion (its input and output specs; `onnx`: its model's bytes)."""
    from ..cache.engines import _region_from_json

    try:
        return _region_from_json(info["region"], onnx)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PackageError(f"region {info.get('name')}: unreadable specs ({type(exc).__name__}: {exc})") from exc


class _NoPyTorch(torch.nn.Module):
    """Where a compiled model's region would run its FX graph in PyTorch (shapes no engine covers,
    empty tensors, a failed engine): a package holds no FX graph, so its ONNX model runs in ONNX
    Runtime instead; without one, a clear error."""

    def __init__(self, name: str, onnx_region: Any, why: Callable[[Sequence[Any]], str]) -> None:
        super().__init__()
        self.name = name
        self.onnx_region = onnx_region
        self.why = why
        self.ort: Any = None
        self.lock = threading.Lock()
        # RegionModule and the executors read the graph's nodes only through region_device,
        # which the package never calls (it passes the device)

    def forward(self, *args: Any) -> list[torch.Tensor]:
        if not self.onnx_region.model:
            raise PackageError(self.why(args))
        with self.lock:
            if self.ort is None:
                from ..run.executors import OrtExecutor

                self.ort = OrtExecutor(self.onnx_region)
        return self.ort(list(args))  # type: ignore[no-any-return]


def runtime_options(info: Mapping[str, Any], overrides: Mapping[str, Any]) -> Any:
    """The Options a region of the package runs with: those recorded at save time that concern
    running (runtime, CUDA graphs, kernel specialization, strict), the caller's `overrides`, and
    this machine's runtime cache; never the engine or graph cache."""
    from .._errors import TargetError
    from .._options import Options

    recorded = dict(info.get("options") or {})
    wanted = {k: recorded[k] for k in RUNTIME_OPTIONS if k in recorded}
    wanted.update({k: v for k, v in overrides.items() if k in RUNTIME_OPTIONS or k == "runtime_cache_path"})
    unknown = sorted(set(overrides) - set(RUNTIME_OPTIONS) - {"runtime_cache_path"})
    if unknown:
        raise PackageError(f"options {unknown} do not apply to a saved package; it takes {sorted(RUNTIME_OPTIONS)} "
                           "and runtime_cache_path")
    targets = info.get("targets")
    base = {"engine_cache_dir": None, "validate": False, "weights": "frozen", "progress": False, **wanted}
    try:
        return Options.from_dict({**base, "target_compute_capabilities": [tuple(t) for t in targets] if targets else None})
    except TargetError:  # this TensorRT-RTX does not name a recorded target: it only matters for rebuilds
        return Options.from_dict(base)


RUNTIME_OPTIONS = ("runtime", "cuda_graph_strategy", "dynamic_shapes_kernel_specialization_strategy", "strict",
                   "default_max_dim")


def why_not_here(info: Mapping[str, Any], device: torch.device) -> str | None:
    """Why the package's engines cannot run here (None: they can): no engine saved, else the rule
    of a compiled model (run/choose.py) for the recorded targets and TensorRT-RTX version."""
    from ..run.choose import PACKAGE, why_not_tensorrt

    if not info.get("plan", {}).get("size"):
        return "the package holds no engine for this region (saved with runtime='onnxruntime', or without targets)"
    targets = [tuple(t) for t in info.get("targets") or []]
    return why_not_tensorrt(device, targets, built_by=str(info.get("tensorrt_rtx")), advice=PACKAGE)  # type: ignore[arg-type]


def region_module(plan: bytes, onnx: bytes, info: Mapping[str, Any], device: torch.device,
                  overrides: Mapping[str, Any]) -> Any:
    """The runtime module of one saved region: its bytes checked against the meta's SHA-256, then
    TensorRT-RTX where it can run the engine, else ONNX Runtime (one warning), as the backend
    chooses; a package without ONNX models raises PackageError where TensorRT-RTX cannot run."""
    from ..build.profiles import EngineProfile, dim_labels
    from ..run.executors import OrtExecutor, TrtExecutor
    from ..run.region import RegionModule

    name = str(info["name"])
    for what, data in (("engine", plan), ("ONNX model", onnx)):
        recorded = info["plan" if what == "engine" else "onnx"] or {"size": 0, "sha256": hashlib.sha256().hexdigest()}
        if len(data) != recorded["size"] or hashlib.sha256(data).hexdigest() != recorded["sha256"]:
            raise PackageError(f"region {name}: its {what} is not the one the package was saved with (altered or "
                               "truncated); save the package again")
    onnx_region = region_specs(info, onnx)
    options = runtime_options(info, overrides)
    profile = {n: (tuple(lo), tuple(opt), tuple(hi)) for n, (lo, opt, hi) in info["profile"].items()}
    why = why_not_here(info, device) if options.runtime != "onnxruntime" else "runtime='onnxruntime' was asked for"
    executor: TrtExecutor | OrtExecutor
    if why is None:
        try:
            executor = TrtExecutor(plan, onnx_region, options, name)
        except RuntimeUnavailableError as exc:
            why = str(exc)
    if why is not None:
        if options.runtime == "tensorrt_rtx":
            raise RuntimeUnavailableError(f"runtime='tensorrt_rtx' but region {name} of the package cannot run here: {why}")
        if not onnx:
            raise PackageError(f"region {name} cannot run here: {why}; and the package was saved without its ONNX "
                               "models (onnx=False), which ONNX Runtime would run. Save it with onnx=True to run it "
                               "on machines where TensorRT-RTX cannot")
        say_once(f"trtrtx: TensorRT-RTX cannot run the package's engines here ({why}); its regions run in ONNX "
                  "Runtime instead")
        try:
            executor = OrtExecutor(onnx_region)
        except Exception as exc:
            raise PackageError(f"region {name}: ONNX Runtime could not load its ONNX model: {exc}") from exc
        executor.why = why  # type: ignore[attr-defined]
    widener: Any = None
    fixed = False
    if isinstance(executor, TrtExecutor) and profile:
        labels = dim_labels(onnx_region.inputs, {})
        if onnx:
            from .region import widened_engine  # a rebuild: the compiler's code, imported when needed

            widener = EngineProfile(profile, functools.partial(widened_engine, onnx_region, options, None), labels)
        else:
            widener = _FixedProfile(profile, _no_rebuild, labels)
            fixed = True

    def outside(args: Sequence[Any]) -> str:
        shapes = {s.name: tuple(t.shape) for s, t in zip(onnx_region.inputs, args)}
        where = widener.outside(shapes) if widener is not None else f"input shapes {shapes}"
        return (f"region {name} of the package has no engine for {where}; the package was saved without its ONNX "
                "models (onnx=False), so no engine for a wider profile can be built here. Save it with a "
                "dynamic_shapes range that covers these shapes, or with onnx=True")

    module = RegionModule(name, _NoPyTorch(name, onnx_region, outside), onnx_region, plan or None, executor,  # type: ignore[arg-type]
                          validate=False, profile=widener, device=device,
                          strict=options.strict or options.runtime == "tensorrt_rtx")
    module.widen_failed = fixed  # no "runs in PyTorch" warning: _NoPyTorch raises the real error
    module.why = getattr(executor, "why", "")
    module.engine_source = "package" if plan else ""
    return module


def _no_rebuild(profile: Any) -> Any:
    raise PackageError("the package holds no ONNX model to build a wider engine from")


class _FixedProfile:
    """The profile of an engine that cannot be rebuilt (no ONNX model in the package): shapes
    outside it are refused (the region's stand-in then raises the error that says why)."""

    def __init__(self, profile: Any, build: Callable[[Any], Any], labels: Any) -> None:
        from ..build.profiles import EngineProfile

        self._describe = EngineProfile(profile, build, labels)
        self.profile = profile

    def fit(self, shapes: Mapping[str, tuple[int, ...]], install: Callable[[Any], None]) -> bool:
        from ..build.profiles import contains

        if contains(self.profile, shapes):
            return False
        raise PackageError(self._describe.outside(shapes))

    def outside(self, shapes: Mapping[str, tuple[int, ...]]) -> str:
        return self._describe.outside(shapes)
