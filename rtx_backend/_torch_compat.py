"""Every private torch entry point the package uses, in one place, each with why no public API
serves. A torch upgrade that moves one breaks this file, and tests/test_torch_compat.py resolves
every name in `ENTRY_POINTS`, so CI fails loudly instead of a user's first compile.

Cheap C functions on every call's path are bound at import. Dynamo, aot_autograd, fake tensors
and the ONNX exporter's internals are imported when first asked for (functions below), so that
importing the package does not import them.

Not listed: `torch._ops.OpOverload` (the documented type of `torch.ops.aten.x.default`; no
public alias exists) and `torch._dynamo.reset()` / `mark_dynamic` (documented API under a
private-looking module name).

Long because it is one list on purpose: a torch upgrade is checked against this file alone.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch


def _no_cuda(*args: Any) -> Any:
    raise RuntimeError("this torch has no CUDA")


# ---- on every call's path: torch._C functions, bound once ------------------------------------

# torch.cuda.current_stream(i).cuda_stream makes a Stream object per call; the C function returns
# the current stream's handle.
current_raw_stream: Callable[[int], int] = getattr(torch._C, "_cuda_getCurrentRawStream", _no_cuda)
# torch.cuda.is_current_stream_capturing() is this C function behind a Python frame and a lazy-init check.
stream_capturing: Callable[[], bool] = getattr(torch._C, "_cuda_isCurrentStreamCapturing", _no_cuda)
# torch.cuda.current_device() is this behind lazy initialization; the engine call compares ints.
cuda_current_device: Callable[[], int] = getattr(torch._C, "_cuda_getDevice", _no_cuda)
# Inductor's allocator for its generated code: a CUDA tensor on the current device without
# torch.empty_strided's Python argument parsing and dispatch (a third of its cost). No public twin.
empty_strided_cuda: Callable[..., torch.Tensor] | None = getattr(torch._C._dynamo.guards, "_empty_strided_cuda", None)
# The C base of torch.cuda.Event: its record/wait methods called without the Python wrappers'
# frames (functools.partial of them, set up once per executor).
cuda_event_base: Any = getattr(torch._C, "_CudaEventBase", None)
# torch.is_autocast_enabled(device_type) asks one device type at a time; aot_autograd's own
# wrapper turns off autocast for every device type with these two.
is_any_autocast_enabled: Callable[[], bool] = torch._C._is_any_autocast_enabled
DisableAutocast: Callable[[], Any] = torch._C._DisableAutocast
# A tensor's version counter (what in-place ops bump): torch bumps it only through its own ops,
# and a fused optimizer step writes parameters without it. No public setter.
increment_version: Callable[..., None] = torch._C._increment_version
# Whether an op has a kernel for a dispatch key (a composite op, a Meta kernel): no public query.
dispatch_has_kernel_for_dispatch_key: Callable[[str, Any], bool] = torch._C._dispatch_has_kernel_for_dispatch_key
DispatchKey: Any = torch._C.DispatchKey
# Every registered op's name, for "did you mean" hints on misspelt op names: no public listing.
dispatch_get_all_op_names: Callable[[], list[str]] = torch._C._dispatch_get_all_op_names
# The global module hooks (torch.nn.modules.module.register_module_forward_hook writes them):
# a region module skips nn.Module's hook dispatch when none is set; no public "are there any".
global_forward_hooks: dict[int, Any] = torch.nn.modules.module._global_forward_hooks
global_forward_pre_hooks: dict[int, Any] = torch.nn.modules.module._global_forward_pre_hooks


def cuda_driver_version() -> int | str:
    """The CUDA driver's version (torch.version.cuda is the runtime torch was built with), from the
    driver's own cuDriverGetVersion: torch has no public query, and its private one is missing from
    some CUDA builds (2.11). "?" where no driver library loads."""
    import ctypes
    import ctypes.util

    for name in ("libcuda.so.1", ctypes.util.find_library("cuda"), "nvcuda.dll"):
        if not name:
            continue
        try:
            driver = ctypes.CDLL(name)
            version = ctypes.c_int(0)
            if driver.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value > 0:
                return int(version.value)
        except (OSError, AttributeError):
            continue
    return "?"


# ---- pytrees: torch.utils.pytree is the public name only in newer torch ------------------------


def tree_flatten(tree: Any) -> tuple[list[Any], Any]:
    from torch.utils import _pytree

    return _pytree.tree_flatten(tree)


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    from torch.utils import _pytree

    return _pytree.tree_map(fn, tree)


def tree_unflatten(leaves: Any, spec: Any) -> Any:
    from torch.utils import _pytree

    return _pytree.tree_unflatten(leaves, spec)


def treespec_dumps(spec: Any) -> str:
    """A pytree spec as JSON text (a saved package records its outputs' structure without pickle)."""
    from torch.utils import _pytree

    return _pytree.treespec_dumps(spec)


def treespec_loads(text: str) -> Any:
    from torch.utils import _pytree

    return _pytree.treespec_loads(text)


# ---- inductor ----------------------------------------------------------------------------------


def inductor_compile(gm: torch.fx.GraphModule, example_inputs: list[Any], options: dict[str, Any],
                     static: Sequence[int] = ()) -> Any:
    """torch._inductor.compile (compile_fx, what backend="inductor" runs) on a graph we made: the
    rest of a partitioned graph, its regions as op calls. torch.compile would trace it again with
    Dynamo inside our own backend call; no public entry point takes an FX graph.

    `static`: positions in `example_inputs` of tensors that keep their address (the weights:
    `static_inputs`). Inductor's CUDA graphs read those in place and copy every other input into
    the graph's own memory on each replay. For Dynamo's graphs inductor learns them from Dynamo's
    metadata on the graph, which a graph we made does not carry, so they are given to its inner
    compile here (after the inputs aot_autograd lifts from the graph itself, which come first)."""
    if not static:
        return importlib.import_module("torch._inductor").compile(gm, example_inputs, options=options)
    compile_fx = importlib.import_module("torch._inductor.compile_fx")
    users = len(example_inputs)

    def inner_compile(graph: torch.fx.GraphModule, inputs: Sequence[Any], **kwargs: Any) -> Any:
        lifted = len(inputs) - users
        if lifted >= 0:
            known = kwargs.get("static_input_idxs") or ()
            kwargs["static_input_idxs"] = sorted({*known, *range(lifted), *(lifted + i for i in static)})
        return compile_fx.compile_fx_inner(graph, inputs, **kwargs)

    # (AOTAutograd's cache would serve a graph compiled without them: its key knows nothing of the
    # inner compile's arguments; inductor's own FX graph cache below it keys on them)
    with importlib.import_module("torch._functorch.config").patch(enable_autograd_cache=False):
        return compile_fx.compile_fx(gm, example_inputs, inner_compile=inner_compile, config_patches=options)


def static_inputs(example_inputs: Sequence[Any]) -> list[int]:
    """Positions of the inputs Dynamo marked static (weights and buffers of the modules it inlines,
    `torch._dynamo.mark_static_address`): what inductor's CUDA graphs need not copy."""
    return [i for i, t in enumerate(example_inputs)
            if isinstance(t, torch.Tensor) and getattr(t, "_dynamo_static_input_type", None)]


# ---- Dynamo, aot_autograd, fake tensors, symbolic shapes ---------------------------------------


def detect_fake_mode(tensors: list[Any]) -> Any:
    """The fake mode of the tensors a fake (meta) kernel is called with, or None."""
    return importlib.import_module("torch._guards").detect_fake_mode(tensors)


def is_fake(value: Any) -> bool:
    """Whether `value` is a FakeTensor (a region op's fake kernel meets frozen real weights too)."""
    return isinstance(value, importlib.import_module("torch._subclasses.fake_tensor").FakeTensor)


def dynamo_exc() -> ModuleType:
    """torch._dynamo.exc: the backend tells Dynamo's own control flow (RestartAnalysis, graph
    breaks, UserError) from failures of ours; Dynamo exports no public exception types."""
    return importlib.import_module("torch._dynamo.exc")


def current_compile_id() -> Any:
    """Dynamo's id of the compile in progress (frame_id, frame_compile_id), or None outside one:
    how the backend knows a compile is a recompile of the same code. torch._guards has no public
    twin; Dynamo's own recompile logs read the same field."""
    return importlib.import_module("torch._guards").CompileContext.current_compile_id()


_PAST_DYNAMO: dict[type, type] = {}


def past_dynamo(exc: BaseException) -> BaseException:
    """`exc` as an exception that Dynamo lets through to the caller as it is.

    Dynamo wraps whatever a backend raises in its BackendCompilerFailed, so `except
    rtx_backend.OptionsError` around a compiled model's first call would never match. It re-raises
    its own ShortenTraceback family unwrapped (BackendCompilerFailed is one), so the error we mean
    the user to catch becomes an instance of a subclass of both its own type and ShortenTraceback:
    `except OptionsError` matches, and the message and traceback are the original's. No public API
    lets a backend's error through; the subclass is made once per type.
    """
    base = dynamo_exc().ShortenTraceback
    cls = type(exc)
    if isinstance(exc, base):
        return exc
    sub = _PAST_DYNAMO.get(cls)
    if sub is None:
        # first_useful_frame=None: Dynamo's remove_dynamo_frames() keeps the traceback as it is;
        # __str__: our message alone (Dynamo appends its debugging hints to the exception's args)
        sub = type(cls.__name__, (cls, base), {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                                "first_useful_frame": None,
                                                "__str__": lambda self: self.rtx_message})
        _PAST_DYNAMO[cls] = sub
    passed = sub.__new__(sub, *exc.args)
    passed.__dict__.update(exc.__dict__)
    passed.rtx_message = str(exc)
    passed.__cause__, passed.__context__ = exc.__cause__, exc.__context__
    return passed.with_traceback(exc.__traceback__)


def aot_autograd() -> ModuleType:
    """torch._functorch.aot_autograd: aot_module_simplified and make_boxed_func are how a Dynamo
    backend gets a functionalized, decomposed ATen graph (torch._dynamo.backends.common uses them
    too); torch.export cannot start from Dynamo's graph with its guards."""
    return importlib.import_module("torch._functorch.aot_autograd")


def aot_schemas() -> ModuleType:
    """torch._functorch._aot_autograd.schemas: the metadata (OutputType, SubclassCreationMeta) that
    says whether aot_autograd's runtime wrappers would do anything around our compiled graph."""
    return importlib.import_module("torch._functorch._aot_autograd.schemas")


def unset_fake_temporarily() -> Any:
    """aot_autograd calls the backend under its fake mode; export and build need real tensors."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily as unset

    return unset()


def tracing_context() -> Any:
    """Dynamo's current TracingContext (its fake mode, shape env and aot_autograd's forward
    metadata), or None: the backend reads the guards and metadata of the graph it compiles."""
    from torch._guards import TracingContext

    return TracingContext.try_get()


def outside_tracing() -> Any:
    """A context with no tracing and no compile context: torch.export run from inside a backend
    must not see Dynamo's (nested export refuses it)."""
    import contextlib

    from torch import _guards

    stack = contextlib.ExitStack()
    stack.enter_context(_guards.tracing(None))
    stack.enter_context(_guards.compile_context(None))
    return stack


def dynamo_sources() -> ModuleType:
    """torch._dynamo.source: the sources (LocalSource, GetItemSource) that name a graph input in
    Dynamo's guards, to map `dynamic_shapes` argument names onto graph inputs."""
    return importlib.import_module("torch._dynamo.source")


def dynamo_explain_parts() -> tuple[ModuleType, Any]:
    """torch._dynamo.symbolic_convert and torch._dynamo.utils.counters: where graph breaks are
    recorded (torch._dynamo.explain reads the same; it gives no per-break user frames)."""
    from torch._dynamo import symbolic_convert
    from torch._dynamo.utils import counters

    return symbolic_convert, counters


def fx_experimental_config() -> ModuleType:
    """torch.fx.experimental._config: symbolic-shape settings (backed_size_oblivious), patched
    while a region is exported as Dynamo compiled it."""
    return importlib.import_module("torch.fx.experimental._config")


def shape_env_hints(env: Any) -> dict[Any, Any]:
    """A ShapeEnv's example values of its symbols (renamed backed_var_to_val in torch 2.12)."""
    return env.backed_var_to_val if hasattr(env, "backed_var_to_val") else env.var_to_val


def sympy_interp() -> tuple[Callable[..., Any], Any]:
    """torch.utils._sympy's interpreter and its Python reference analysis: a symbolic size made
    into FX nodes computing it from the inputs' dimensions (what Dynamo's own codegen does)."""
    from torch.utils._sympy.interp import sympy_interp as interp
    from torch.utils._sympy.reference import PythonReferenceAnalysis

    return interp, PythonReferenceAnalysis


# ---- the ONNX exporter's internals (torch.onnx.export builds the registry on every call) -------


def exporter(name: str) -> Any:
    """torch.onnx._internal.exporter.<name> (_core, _decomp, _registration, _fx_passes, _constants):
    torch.onnx.export takes no registry, rebuilds the full one on every call (about a second) and
    re-decomposes graphs that are decomposed already; the bridge calls _core.export with its own."""
    return importlib.import_module(f"torch.onnx._internal.exporter.{name}")


def torchlib_registry() -> ModuleType:
    """torch.onnx._internal.exporter._torchlib._torchlib_registry: torch's own torchlib entries,
    indexed next to onnxscript's for the lazy registry."""
    return importlib.import_module("torch.onnx._internal.exporter._torchlib._torchlib_registry")


def onnx_constants() -> ModuleType:
    """torch.onnx._constants: the exporter's default opset."""
    return importlib.import_module("torch.onnx._constants")


# What tests/test_torch_compat.py resolves: (name, how to get it, needs a CUDA build of torch).
ENTRY_POINTS: tuple[tuple[str, Callable[[], Any], bool], ...] = (
    ("torch._C._cuda_getCurrentRawStream", lambda: torch._C._cuda_getCurrentRawStream, True),
    ("torch._C._cuda_isCurrentStreamCapturing", lambda: torch._C._cuda_isCurrentStreamCapturing, True),
    ("torch._C._cuda_getDevice", lambda: torch._C._cuda_getDevice, True),
    ("torch._C._CudaEventBase", lambda: torch._C._CudaEventBase, True),
    ("torch._C._dynamo.guards._empty_strided_cuda", lambda: torch._C._dynamo.guards._empty_strided_cuda, True),  # type: ignore[attr-defined]
    ("torch._C._is_any_autocast_enabled", lambda: is_any_autocast_enabled, False),
    ("torch._C._DisableAutocast", lambda: DisableAutocast, False),
    ("torch._C._increment_version", lambda: increment_version, False),
    ("torch._C._dispatch_has_kernel_for_dispatch_key", lambda: dispatch_has_kernel_for_dispatch_key, False),
    ("torch._C.DispatchKey.CompositeImplicitAutograd", lambda: DispatchKey.CompositeImplicitAutograd, False),
    ("torch._C._dispatch_get_all_op_names", lambda: dispatch_get_all_op_names, False),
    ("torch.nn.modules.module._global_forward_hooks", lambda: global_forward_hooks, False),
    ("torch.nn.modules.module._global_forward_pre_hooks", lambda: global_forward_pre_hooks, False),
    ("torch.utils._pytree.tree_flatten", lambda: importlib.import_module("torch.utils._pytree").tree_flatten, False),
    ("torch.utils._pytree.tree_map", lambda: importlib.import_module("torch.utils._pytree").tree_map, False),
    ("torch.utils._pytree.tree_unflatten", lambda: importlib.import_module("torch.utils._pytree").tree_unflatten, False),
    ("torch.utils._pytree.treespec_dumps", lambda: importlib.import_module("torch.utils._pytree").treespec_dumps, False),
    ("torch.utils._pytree.treespec_loads", lambda: importlib.import_module("torch.utils._pytree").treespec_loads, False),
    ("torch._inductor.compile", lambda: importlib.import_module("torch._inductor").compile, False),
    ("torch._guards.detect_fake_mode", lambda: importlib.import_module("torch._guards").detect_fake_mode, False),
    ("torch._subclasses.fake_tensor.FakeTensor",
     lambda: importlib.import_module("torch._subclasses.fake_tensor").FakeTensor, False),
    ("torch._dynamo.exc.TorchDynamoException", lambda: dynamo_exc().TorchDynamoException, False),
    ("torch._dynamo.exc.RestartAnalysis", lambda: dynamo_exc().RestartAnalysis, False),
    ("torch._dynamo.exc.UserError", lambda: dynamo_exc().UserError, False),
    ("torch._dynamo.exc.ShortenTraceback", lambda: dynamo_exc().ShortenTraceback, False),
    ("torch._guards.CompileContext.current_compile_id",
     lambda: importlib.import_module("torch._guards").CompileContext.current_compile_id, False),
    ("torch._functorch.aot_autograd.aot_module_simplified", lambda: aot_autograd().aot_module_simplified, False),
    ("torch._functorch.aot_autograd.make_boxed_func", lambda: aot_autograd().make_boxed_func, False),
    ("torch._functorch._aot_autograd.schemas.OutputType.non_alias", lambda: aot_schemas().OutputType.non_alias, False),
    ("torch._functorch._aot_autograd.schemas.SubclassCreationMeta", lambda: aot_schemas().SubclassCreationMeta, False),
    ("torch._subclasses.fake_tensor.unset_fake_temporarily",
     lambda: importlib.import_module("torch._subclasses.fake_tensor").unset_fake_temporarily, False),
    ("torch._guards.TracingContext.try_get", lambda: importlib.import_module("torch._guards").TracingContext.try_get,
     False),
    ("torch._guards.tracing", lambda: importlib.import_module("torch._guards").tracing, False),
    ("torch._guards.compile_context", lambda: importlib.import_module("torch._guards").compile_context, False),
    ("torch._dynamo.source.LocalSource", lambda: dynamo_sources().LocalSource, False),
    ("torch._dynamo.source.GetItemSource", lambda: dynamo_sources().GetItemSource, False),
    ("torch._dynamo.symbolic_convert, torch._dynamo.utils.counters", dynamo_explain_parts, False),
    ("torch.fx.experimental._config.backed_size_oblivious", lambda: fx_experimental_config().backed_size_oblivious,
     False),
    ("torch.utils._sympy.interp.sympy_interp, reference.PythonReferenceAnalysis", sympy_interp, False),
    ("torch.onnx._internal.exporter._core.export", lambda: exporter("_core").export, False),
    ("torch.onnx._internal.exporter._decomp.get_onnx_implemented_overloads",
     lambda: exporter("_decomp").get_onnx_implemented_overloads, False),
    ("torch.onnx._internal.exporter._decomp.create_onnx_friendly_decomposition_table",
     lambda: exporter("_decomp").create_onnx_friendly_decomposition_table, False),
    ("torch.onnx._internal.exporter._registration.ONNXRegistry.from_torchlib",
     lambda: exporter("_registration").ONNXRegistry.from_torchlib, False),
    ("torch.onnx._internal.exporter._fx_passes.decompose_with_registry",
     lambda: exporter("_fx_passes").decompose_with_registry, False),
    ("torch.onnx._internal.exporter._constants", lambda: exporter("_constants"), False),
    ("torch.onnx._internal.exporter._torchlib._torchlib_registry", torchlib_registry, False),
    ("torch.onnx._constants.ONNX_DEFAULT_OPSET", lambda: onnx_constants().ONNX_DEFAULT_OPSET, False),
)
