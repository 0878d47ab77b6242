"""A saved package: a `.pt2` whose graph calls `trtrtx::engine` for each region, and what runs it.

`rtx_backend.save` (tools/save.py) writes it with `torch.export.save`; this module holds what loading
and running it needs, and nothing of the compiler (no Dynamo, no aot_autograd, no exporter):

- the op `trtrtx::engine(Tensor plan, Tensor onnx, str meta, Tensor[] inputs) -> Tensor[]`,
  registered when `rtx_backend` is imported. `plan` is the region's serialized engine and `onnx`
  its ONNX model, each a uint8 buffer of the exported program (empty where the package has none);
  `meta` is JSON: the region's input and output specs (dynamic dims as expressions of the inputs'
  symbols, for the fake kernel), its engine's profile, the targets, the TensorRT-RTX version and
  the runtime options. The first call with a given `plan` buffer makes the region's runtime
  module (the same RegionModule, executors, runtime cache, kernel-specialization and CUDA-graph
  strategies as a compiled model); later calls find it by the buffer;
- the archive's manifest (`extra/trtrtx.json`, added after torch.export.save wrote the rest):
  format version, versions, targets, options, and the size and SHA-256 of every other member, so
  that a truncated or altered archive is refused before torch.export.load reads any of it;
  optionally an HMAC under a key that the saving and loading sides share;
- `load(path)`: those checks, then torch.export.load, with each op call replaced by its region
  module (what a compiled model calls: no dispatcher round trip per call).

Long because the format is read in one place: the archive's integrity checks, the graph's JSON
form and its rebuild with torch.fx, and the op's kernels each rely on what the one before checked;
splitting them would spread one file format over several modules.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import logging
import operator
import os
import threading
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .._errors import PackageError, RuntimeUnavailableError

log = logging.getLogger("rtx_backend")

FORMAT = 1  # of the manifest and of each op's meta
MANIFEST = "extra/trtrtx.json"  # under the archive's top-level folder
OP_NAME = "trtrtx::engine"


# ---- the op ------------------------------------------------------------------------------------


@torch.library.custom_op(OP_NAME, mutates_args=())
def engine(plan: torch.Tensor, onnx: torch.Tensor, meta: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """One region of a saved package: its engine (or ONNX model) run on `inputs`."""
    region = _REGIONS.get(plan)
    if region is None:
        region = _region_for_buffers(plan, onnx, meta, inputs[0].device if inputs else torch.device("cpu"))
    return list(region(*inputs))


@engine.register_fake
def _engine_fake(plan: torch.Tensor, onnx: torch.Tensor, meta: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    region = specs(meta)
    sizes: dict[str, Any] = {}
    for spec, tensor in zip(region.inputs, inputs):
        for dim, size in zip(spec.shape, tensor.shape):
            if isinstance(dim, str) and dim.isidentifier():
                sizes.setdefault(dim, size)
    device = inputs[0].device if inputs else torch.device("cpu")
    return [torch.empty([d if isinstance(d, int) else _size(d, sizes) for d in spec.shape], dtype=spec.dtype,
                        device=device) for spec in region.outputs]


_REGIONS: WeakIdKeyDictionary = WeakIdKeyDictionary()  # plan buffer -> its region module
_REGIONS_LOCK = threading.Lock()


def _region_for_buffers(plan: torch.Tensor, onnx: torch.Tensor, meta: str, device: torch.device) -> Any:
    with _REGIONS_LOCK:
        region = _REGIONS.get(plan)
        if region is None:
            region = region_module(_host_bytes(plan), _host_bytes(onnx), parse_meta(meta), device, {})
            _REGIONS[plan] = region
    return region


def _host_bytes(t: torch.Tensor) -> bytes:
    return t.detach().to("cpu").contiguous().numpy().tobytes() if t.numel() else b""


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


@functools.lru_cache(maxsize=256)
def specs(meta: str) -> Any:
    return region_specs(parse_meta(meta))


_OPS: dict[type, Callable[[Any, Any], Any]] = {ast.Add: operator.add, ast.Sub: operator.sub,
                                               ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
                                               ast.Mod: operator.mod}


def _size(expr: str, sizes: Mapping[str, Any]) -> Any:
    """An output dimension from its expression over the inputs' symbols ("s0", "2*s0", "s0*s1",
    "(s0//2)", "Max(1, s0)"): arithmetic only, never eval. A symbol no input carries gets a new
    size of its own (an unbacked symbol)."""

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in sizes:
            return sizes[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("Max", "Min"):
            args = [value(a) for a in node.args]
            pick = torch.sym_max if node.func.id == "Max" else torch.sym_min
            return functools.reduce(pick, args)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "FloorDiv":
            a, b = (value(x) for x in node.args)
            return a // b
        raise ValueError(type(node).__name__)

    try:
        return value(ast.parse(expr, mode="eval").body)
    except (ValueError, SyntaxError, TypeError, RecursionError):
        return torch.library.get_ctx().new_dynamic_size()


# ---- region modules ----------------------------------------------------------------------------


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


def why_not_tensorrt(info: Mapping[str, Any], device: torch.device) -> str | None:
    """Why the package's engines cannot run here (None: they can): no engine saved, TensorRT-RTX
    missing or another version than the one that built them, no CUDA, a GPU not among the targets."""
    from .. import _targets, _trt

    if not info.get("plan", {}).get("size"):
        return "the package holds no engine for this region (saved with runtime='onnxruntime', or without targets)"
    missing = _trt.unavailable_reason()
    if missing is not None:
        return missing
    built_by = info.get("tensorrt_rtx")
    if built_by != _trt.version():
        return (f"its engines were built by TensorRT-RTX {built_by}, and this is TensorRT-RTX {_trt.version()}, "
                "which does not run them; save the package again with this version, or install that one")
    if device.type != "cuda":
        return _targets.no_cuda_reason() or f"the inputs are on {device}; load with device='cuda' for TensorRT-RTX"
    current = _targets.current_capability()
    targets = [tuple(t) for t in info.get("targets") or []]
    if targets and current not in targets:
        return (f"its engines are built for {_targets.describe(tuple(targets))}, not for this GPU "  # type: ignore[arg-type]
                f"(SM{current[0]}.{current[1]}); save it again with {current} among the targets" if current else
                "there is no usable GPU")
    return None


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
    why = why_not_tensorrt(info, device) if options.runtime != "onnxruntime" else "runtime='onnxruntime' was asked for"
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
        warn_once(f"trtrtx: TensorRT-RTX cannot run the package's engines here ({why}); its regions run in ONNX "
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


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning(message)


# ---- the archive -------------------------------------------------------------------------------


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k not in ("manifest_sha256", "mac")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def seal(path: Path, manifest: dict[str, Any], key: bytes | None) -> None:
    """Add the manifest to the archive that torch.export.save wrote at `path`: the size and
    SHA-256 of every member, its own SHA-256, and the HMAC of that under `key` when given."""
    from .. import _trust

    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        prefix = _prefix(names)
        files = {}
        for item in archive.infolist():
            with archive.open(item) as f:
                files[item.filename[len(prefix):]] = {"size": item.file_size, "sha256": _sha256(f)}
        if manifest.get("graph") is not None:
            try:
                attach_members(archive, prefix, manifest["graph"], manifest.pop("graph_owner", ""))
            except Unencodable as exc:
                log.info("trtrtx: the package holds no graph of its own (%s); load uses torch.export.load", exc)
                manifest["graph"] = None
    manifest.pop("graph_owner", None)
    manifest["files"] = files
    digest = manifest_digest(manifest)
    manifest["manifest_sha256"] = digest
    if key is not None:
        manifest["mac"] = _trust.sign(digest, key)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(prefix + MANIFEST, json.dumps(manifest, sort_keys=True, indent=1))


def _prefix(names: Sequence[str]) -> str:
    """The archive's top-level folder ("name/"), as torch.export.save lays it out."""
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) != 1 or not all("/" in n for n in names):
        raise PackageError("not a .pt2 archive of torch.export.save (no single top-level folder)")
    return f"{tops.pop()}/"


def _sha256(f: Any) -> str:
    h = hashlib.sha256()
    for chunk in iter(lambda: f.read(1 << 22), b""):
        h.update(chunk)
    return h.hexdigest()


def verify(path: str | os.PathLike[str], key: bytes | None = None) -> dict[str, Any]:
    """The package's manifest, after checking the archive against it: every member present, of
    its size and SHA-256, nothing added; the manifest's own checksum (and HMAC, with `key`); and
    nothing in it that torch.export.load would unpickle. Raises PackageError; reads the archive
    as a zip file only (no unpickling, no torch.export)."""
    from .. import _trust

    where = os.fspath(path)
    try:
        with zipfile.ZipFile(where) as archive:
            names = archive.namelist()
            prefix = _prefix(names)
            if prefix + MANIFEST not in names:
                raise PackageError(f"{where} is not a package saved by rtx_backend.save (no {MANIFEST})")
            manifest = json.loads(archive.read(prefix + MANIFEST))
            if not isinstance(manifest, dict):
                raise PackageError(f"{where}: its manifest is not a JSON object")
            if manifest.get("format") != FORMAT:
                raise PackageError(f"{where} is a package of format {manifest.get('format')!r}; this rtx_backend "
                                   f"reads format {FORMAT}: save it again with this version")
            if manifest.get("manifest_sha256") != manifest_digest(manifest):
                raise PackageError(f"{where}: its manifest was altered (checksum mismatch)")
            if key is not None and not _trust.verify(manifest["manifest_sha256"], manifest.get("mac"), key):
                raise PackageError(f"{where} is not signed with the given key (saved with another key, without "
                                   "one, or altered)")
            files = manifest.get("files")
            members = {n[len(prefix):]: n for n in names if n != prefix + MANIFEST}
            if not isinstance(files, dict) or set(files) != set(members):
                extra = sorted(set(members) - set(files or {}))[:3]
                absent = sorted(set(files or {}) - set(members))[:3]
                raise PackageError(f"{where}: its members are not the ones it was saved with "
                                   f"(added {extra}, missing {absent})")
            for name, full in members.items():
                info = archive.getinfo(full)
                with archive.open(info) as f:
                    if info.file_size != files[name]["size"] or _sha256(f) != files[name]["sha256"]:
                        raise PackageError(f"{where}: member {name} was altered or truncated (checksum mismatch)")
            _no_pickles(archive, prefix, where)
    except PackageError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError, KeyError, TypeError) as exc:
        raise PackageError(f"{where} cannot be read as a package ({type(exc).__name__}: {exc}); it is truncated, "
                           "damaged or not a .pt2 of rtx_backend.save") from exc
    return manifest


def _no_pickles(archive: zipfile.ZipFile, prefix: str, where: str) -> None:
    """rtx_backend.save writes every tensor as raw bytes and no example inputs: a package that
    asks torch.export.load to unpickle something is not one it wrote."""
    for name in archive.namelist():
        rel = name[len(prefix):]
        if rel.startswith("data/sample_inputs/") and archive.getinfo(name).file_size:
            raise PackageError(f"{where}: it holds pickled example inputs, which rtx_backend.save never writes")
        if rel.endswith("_config.json") and rel.startswith("data/"):
            config = json.loads(archive.read(name)).get("config", {})
            if any(meta.get("use_pickle") for meta in config.values()):
                raise PackageError(f"{where}: it holds pickled tensors ({rel}), which rtx_backend.save never writes")
        if rel.startswith("data/constants/") and not rel.endswith(".json") and "tensor" not in rel.rsplit("/", 1)[-1]:
            raise PackageError(f"{where}: it holds pickled objects ({rel}), which rtx_backend.save never writes")


# ---- load --------------------------------------------------------------------------------------


def load(path: str | os.PathLike[str], *, device: str | torch.device | None = None,
         options: Mapping[str, Any] | None = None, key: bytes | None = None) -> torch.nn.Module:
    """A package saved by `rtx_backend.save`, ready to run: no trace, no export, no build.

    The archive is checked first (see `verify`: a truncated, altered or foreign file raises
    PackageError before torch.export.load reads it; with `key`, its HMAC too). Then each region
    gets its runtime module: TensorRT-RTX where this GPU is one of the recorded targets and the
    installed TensorRT-RTX is the one that built the engines, else ONNX Runtime with one warning
    (or PackageError where the package holds no ONNX models). `device`: where the model runs
    (default: CUDA when there is a GPU); `options`: runtime options (runtime,
    cuda_graph_strategy, dynamic_shapes_kernel_specialization_strategy, strict, default_max_dim,
    runtime_cache_path). The engine and graph caches are never touched.

    The graph is rebuilt from the package's own JSON form of it with torch.fx (torch.export.load
    would import Dynamo, seconds of a fresh process); a package without one (a graph that form
    cannot express) goes through torch.export.load.
    """
    manifest = verify(path, key)
    overrides = dict(options or {})
    runtime_options({"options": manifest.get("options", {})}, overrides)  # bad keys raise before the load
    target = torch.device(device) if device is not None else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    if target.type == "cuda" and target.index is None:
        target = torch.device("cuda", torch.cuda.current_device())
    graph = manifest.get("graph")
    if graph:
        try:
            with zipfile.ZipFile(os.fspath(path)) as archive:
                gm, out_spec = graph_module(archive, _prefix(archive.namelist()), graph, target)
        except PackageError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
            raise PackageError(f"{os.fspath(path)}: its graph cannot be rebuilt ({type(exc).__name__}: {exc})") from exc
        swap_in_regions(gm, target, overrides)
        return LoadedPackage(gm, out_spec, graph["inputs"])
    program = torch.export.load(os.fspath(path))
    if target.type != "cpu":
        from torch.export.passes import move_to_device_pass

        program = move_to_device_pass(program, target)
    module = program.module()
    swap_in_regions(module, target, overrides)
    return module


def swap_in_regions(module: torch.fx.GraphModule, device: torch.device, overrides: Mapping[str, Any]) -> None:
    """Replace each trtrtx::engine call by a call of its region module (made now: engines are
    deserialized at load, not on the first call), and drop the engine and ONNX buffers from the
    module (the region modules hold the bytes they need). torch.export's check of the input
    shapes runs only when they change."""
    op = torch.ops.trtrtx.engine.default
    graph = module.graph
    index = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not op:
            continue
        plan_node, onnx_node, meta, inputs = node.args
        plan = _attr(module, plan_node)
        onnx = _attr(module, onnx_node)
        region = region_module(_host_bytes(plan), _host_bytes(onnx), parse_meta(meta), device, overrides)
        name = f"trtrtx_region_{index}"
        index += 1
        module.add_submodule(name, region)
        with graph.inserting_before(node):
            call = graph.call_module(name, tuple(inputs))
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        graph.erase_node(node)
        for used in (plan_node, onnx_node):
            if not used.users:
                target = str(used.target)
                graph.erase_node(used)
                _delete_attr(module, target)
    graph.lint()
    module.recompile()
    _check_shapes_on_change(module)


def _attr(module: torch.nn.Module, node: Any) -> torch.Tensor:
    value: Any = module
    for part in str(node.target).split("."):
        value = getattr(value, part)
    if not isinstance(value, torch.Tensor):
        raise PackageError(f"{node.target} of the package is not a tensor")
    return value


def _delete_attr(module: torch.nn.Module, target: str) -> None:
    owner_path, _, name = target.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    if name in owner._buffers:
        del owner._buffers[name]
    elif hasattr(owner, name):
        delattr(owner, name)


def _check_shapes_on_change(module: torch.nn.Module) -> None:
    """torch.export's module checks its inputs against the exported ranges on every call (a
    Python walk over every dim); the compiled model's guards cost far less. Run the check when
    the input shapes differ from the last ones that passed."""
    hooks = module._forward_pre_hooks
    for hook_id, hook in list(hooks.items()):
        if getattr(hook, "__name__", "") != "_check_input_constraints_pre_hook":
            continue
        passed: list[Any] = [None]
        check = hook

        def on_change(self: Any, args: Any, kwargs: Any, check: Any = check, passed: list[Any] = passed) -> None:
            shapes = tuple(a.shape if isinstance(a, torch.Tensor) else a for a in args)
            if shapes == passed[0] and not kwargs:
                return
            check(self, args, kwargs)
            passed[0] = shapes

        hooks[hook_id] = on_change
        module._forward_pre_hooks_with_kwargs[hook_id] = True



# ---- the package's own graph: loading without torch.export.load --------------------------------
#
# torch.export.load imports Dynamo (torch._export.serde imports torch._export.non_strict_utils,
# which imports torch._dynamo): seconds of a fresh process. So the manifest also holds the saved
# graph in a small JSON form of our own (ATen ops, trtrtx::engine calls, `operator` functions on
# sizes; tensors by the archive member torch.export.save wrote them to, as raw bytes), which
# `load` turns into a GraphModule with torch.fx alone. A graph that this form cannot express has
# none, and `load` uses torch.export.load.


class Unencodable(Exception):
    """A node or argument that the package's graph form does not express."""


_PY_OPS = ("getitem", "add", "sub", "mul", "floordiv", "truediv", "mod", "neg", "pow", "eq", "ne", "lt", "le",
           "gt", "ge", "and_", "or_", "not_")


def encode_graph(gm: torch.fx.GraphModule, out_spec: Any) -> dict[str, Any]:
    """The graph of `gm` (placeholders, get_attr, call_function, output) as JSON; raises Unencodable."""
    from .._torch_compat import treespec_dumps

    nodes = []
    attrs: dict[str, Any] = {}
    inputs = []
    for node in gm.graph.nodes:
        entry: dict[str, Any] = {"name": node.name, "op": node.op}
        if node.op == "placeholder":
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor):
                raise Unencodable(f"input {node.name} is not a tensor")
            inputs.append({"dtype": str(val.dtype).removeprefix("torch."),
                           "shape": [int(s) if isinstance(s, int) else None for s in val.shape]})
        elif node.op == "get_attr":
            value = _fetch(gm, str(node.target))
            if not isinstance(value, torch.Tensor):
                raise Unencodable(f"{node.target} is not a tensor")
            entry["target"] = str(node.target)
            attrs[str(node.target)] = {"dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape),
                                       "stride": list(value.stride()), "offset": int(value.storage_offset())}
        elif node.op == "call_function":
            entry["target"] = _encode_target(node.target)
            entry["args"] = _encode(node.args)
            entry["kwargs"] = _encode(dict(node.kwargs))
        elif node.op == "output":
            entry["args"] = _encode(node.args)
        else:
            raise Unencodable(f"a {node.op} node ({node.target})")
        nodes.append(entry)
    try:
        spec = treespec_dumps(out_spec)
    except Exception as exc:
        raise Unencodable(f"the output structure: {exc}") from exc
    return {"nodes": nodes, "attrs": attrs, "inputs": inputs, "out_spec": spec}


def _fetch(gm: torch.nn.Module, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part, None)
    return value


def _encode_target(target: Any) -> dict[str, str]:
    if isinstance(target, torch._ops.OpOverload):
        return {"op": f"{target._schema.name}.{target._overloadname}"}
    if getattr(target, "__module__", None) in ("_operator", "operator") and target.__name__ in _PY_OPS:
        return {"py": target.__name__}
    raise Unencodable(f"call of {target}")


def _encode(value: Any) -> Any:
    if isinstance(value, torch.fx.Node):
        return {"n": value.name}
    if value is None or isinstance(value, (bool, str)):
        return {"v": value}
    if isinstance(value, int):
        return {"v": int(value)}
    if isinstance(value, float):
        return {"f": repr(value)}
    if isinstance(value, (list, tuple)):
        return {"l" if isinstance(value, list) else "t": [_encode(v) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"d": {k: _encode(v) for k, v in value.items()}}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    raise Unencodable(f"an argument of type {type(value).__name__}")


def _decode(value: Any, env: Mapping[str, torch.fx.Node], device: torch.device | None) -> Any:
    (kind, item), = value.items()
    if kind == "n":
        return env[item]
    if kind == "v":
        return item
    if kind == "f":
        return float(item)
    if kind == "l":
        return [_decode(v, env, device) for v in item]
    if kind == "t":
        return tuple(_decode(v, env, device) for v in item)
    if kind == "d":
        return {k: _decode(v, env, device) for k, v in item.items()}
    if kind in ("dtype", "layout", "memory_format"):
        found = getattr(torch, item, None)
        if not isinstance(found, (torch.dtype, torch.layout, torch.memory_format)):
            raise PackageError(f"unknown {kind} {item!r} in the package's graph")
        return found
    if kind == "device":
        return device if device is not None else torch.device(item)
    raise PackageError(f"unknown value {value!r} in the package's graph")


def _decode_target(target: Mapping[str, str]) -> Any:
    if "py" in target:
        if target["py"] not in _PY_OPS:
            raise PackageError(f"the package's graph calls operator.{target['py']}, which it may not")
        return getattr(operator, target["py"])
    qualified, _, overload = target["op"].rpartition(".")
    namespace, _, name = qualified.partition("::")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), name), overload)
    except (AttributeError, RuntimeError) as exc:
        raise PackageError(f"the package's graph calls {target['op']}, which this PyTorch does not have") from exc


def attach_members(archive: zipfile.ZipFile, prefix: str, graph: dict[str, Any], owner: str) -> None:
    """Name, for each tensor of the graph, the archive member that torch.export.save wrote it to
    (as raw bytes: its configs say where); `owner` is the graph's path in the saved module."""
    where: dict[str, str] = {}
    for name in archive.namelist():
        rel = name[len(prefix):]
        if rel.startswith("data/") and rel.endswith("_config.json"):
            folder = rel.rsplit("/", 1)[0]
            for fqn, meta in json.loads(archive.read(name)).get("config", {}).items():
                where[fqn] = f"{folder}/{meta['path_name']}"
    for target, attr in graph["attrs"].items():
        member = where.get(f"{owner}.{target}" if owner else target)
        if member is None:
            raise Unencodable(f"{target} is not among the archive's tensors")
        attr["member"] = member


def graph_module(archive: zipfile.ZipFile, prefix: str, graph: Mapping[str, Any],
                 device: torch.device) -> tuple[torch.fx.GraphModule, Any]:
    """The package's graph as a GraphModule (its tensors on `device`), and its output structure."""
    from .._torch_compat import treespec_loads

    root = torch.nn.Module()
    fx = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}
    moved = device  # the graph's device arguments (aten.full(..., device=)) follow the model
    for entry in graph["nodes"]:
        op = entry["op"]
        if op == "placeholder":
            env[entry["name"]] = fx.placeholder(entry["name"])
        elif op == "get_attr":
            target = entry["target"]
            if "." in target or not target.isidentifier():
                raise PackageError(f"bad tensor name {target!r} in the package's graph")
            blob = target.endswith(("_plan", "_onnx"))  # engine and ONNX bytes stay on the host
            root.register_buffer(target, _read_tensor(archive, prefix, graph["attrs"][target],
                                                      torch.device("cpu") if blob else device))
            env[entry["name"]] = fx.get_attr(target)
        elif op == "call_function":
            env[entry["name"]] = fx.call_function(_decode_target(entry["target"]),
                                                  _decode(entry["args"], env, moved), _decode(entry["kwargs"], env, moved))
        elif op == "output":
            fx.output(_decode(entry["args"], env, moved)[0])
        else:
            raise PackageError(f"unknown node kind {op!r} in the package's graph")
    return torch.fx.GraphModule(root, fx), treespec_loads(graph["out_spec"])


def _read_tensor(archive: zipfile.ZipFile, prefix: str, attr: Mapping[str, Any], device: torch.device) -> torch.Tensor:
    data = archive.read(prefix + attr["member"])
    dtype = getattr(torch, attr["dtype"])
    if not data:
        base = torch.zeros(0, dtype=dtype)
    else:
        base = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype)
    tensor = base.as_strided(attr["shape"], attr["stride"], attr["offset"]) if base.numel() else base.reshape(attr["shape"])
    return tensor if device.type == "cpu" else tensor.to(device)


class LoadedPackage(torch.nn.Module):
    """What `rtx_backend.load` returns for a package that holds its own graph: the graph module
    (its regions swapped in), called with the model's positional arguments, returning what the
    model returns. Each input's dtype and static sizes are checked when the input shapes change."""

    def __init__(self, graph: torch.fx.GraphModule, out_spec: Any, inputs: Sequence[Mapping[str, Any]]) -> None:
        super().__init__()
        self.graph_module = graph
        self.out_spec = out_spec
        self.inputs = [(getattr(torch, i["dtype"]), tuple(i["shape"])) for i in inputs]
        self.checked: Any = None
        from .._torch_compat import tree_unflatten

        self.unflatten = tree_unflatten
        self.leaf = out_spec.is_leaf() if hasattr(out_spec, "is_leaf") else False

    def forward(self, *args: torch.Tensor) -> Any:
        shapes = tuple(a.shape if isinstance(a, torch.Tensor) else None for a in args)
        if shapes != self.checked:
            self.check(args)
            self.checked = shapes
        outputs = self.graph_module(*args)
        return self.unflatten(list(outputs), self.out_spec)

    def check(self, args: Sequence[Any]) -> None:
        if len(args) != len(self.inputs):
            raise PackageError(f"the package takes {len(self.inputs)} tensor argument(s), got {len(args)}")
        for index, (arg, (dtype, shape)) in enumerate(zip(args, self.inputs)):
            if not isinstance(arg, torch.Tensor) or arg.dtype != dtype or arg.dim() != len(shape) or any(
                    s is not None and s != a for s, a in zip(shape, arg.shape)):
                got = f"{arg.dtype} {tuple(arg.shape)}" if isinstance(arg, torch.Tensor) else type(arg).__name__
                want = "x".join("*" if s is None else str(s) for s in shape)
                raise PackageError(f"argument {index} must be a {dtype} tensor of shape [{want}] (* : dynamic), "
                                   f"got {got}")
