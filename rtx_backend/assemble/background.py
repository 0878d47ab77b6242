"""Engines built in the background (option engine_build="background").

A region whose engine is not in the engine cache is exported and screened by the compile, as
always (the partition must know which nodes TensorRT-RTX's parser takes); then the compile
returns, and PyTorch runs the region from the first call, while the update thread (updates.py,
the one that brings engines new weights) builds the engine, stores it in the engine cache and
makes its execution contexts, in which TensorRT-RTX compiles its kernels for this GPU. Then the
engine takes over, validated on its first call as any new engine is.

Weights that change meanwhile are seen by the weight guard, which starts a new generation of
the region (weights.update_region); an engine built from the older weights is then not put in
place but given the new ones, as a weight update does.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from .. import _host, _stats
from .._log import one_line
from .._options import Options
from ..run.executors import TorchExecutor, TrtExecutor
from ..run.region import RegionModule
from ..run.validation import RECHECKS
from .region import Unbuilt, runtime_module
from .shared import BUILD_LATER
from .updates import UPDATES
from .weights import current_values, update_region

log = logging.getLogger("rtx_backend")

BUILDING = "its engine is being built in the background: PyTorch runs it until the engine is ready"


def wanted(options: Options) -> bool:
    """Whether engines are built in the background: asked for, and no option that needs a
    failure to reach the compile (strict, runtime="tensorrt_rtx") or engines to time against
    inductor at the first calls (fastest)."""
    return (options.engine_build == "background" and not options.strict and options.runtime != "tensorrt_rtx"
            and not options.fastest)


def start(name: str, reference: torch.fx.GraphModule, unbuilt: Unbuilt, options: Options, device: torch.device,
          overrides: dict[str, Any]) -> RegionModule:
    """The region's module, run by PyTorch until the engine that the update thread builds now
    takes over."""
    module = RegionModule(name, reference, unbuilt.onnx_region, None, TorchExecutor(reference), device=device)
    module.why = BUILDING
    module.building = True
    made_for = module.weight_versions()  # the weights the export read
    generation = module.generation  # (nothing else knows the module yet)
    _stats.count("background_builds")
    # in the compile's scope of host copies: the network points into them, and the engine cache
    # stores them (the weights as exported, whatever happens to the model's meanwhile)
    UPDATES.submit(_host.within(_host.current(), lambda: _build(module, unbuilt, options, device, overrides,
                                                                generation, made_for)))
    return module


def _build(module: RegionModule, unbuilt: Unbuilt, options: Options, device: torch.device,
           overrides: dict[str, Any], generation: int, made_for: tuple[tuple[int, int], ...]) -> None:
    """On the update thread: the engine built and stored, its contexts made, then put in place
    (or, if the weights changed meanwhile, brought the new ones first)."""
    start = time.perf_counter()
    try:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        # stored only if no weight changed in place while it was built (the update stores the new one)
        onnx_region, engine, profile, record, source = unbuilt.build(
            options, keep=lambda: module.weight_versions() == made_for)
        fresh = runtime_module(module.name, module.graph_module, onnx_region, engine, profile, record, options,
                               device, overrides=overrides)
        if isinstance(fresh.executor, TrtExecutor):
            fresh.executor.ready()  # its contexts made here, not on the next call
    except Exception as exc:  # PyTorch runs the region already: it goes on doing so
        module.building = False
        module.why = f"its engine could not be built in the background ({one_line(exc)})"
        log.warning("trtrtx: region %s runs in PyTorch: its engine could not be built in the background (%s)",
                    module.name, one_line(exc))
        log.debug("trtrtx: region %s: background build failed", module.name, exc_info=exc)
        _stats.count("background_build_failures")
        return
    fresh.executor.made_for = made_for
    with UPDATES.swap:
        changed = module.generation != generation
        module.engine_source = source
        if not changed:
            module.why = fresh.why
        module.take(fresh, run=not changed)
        if changed:  # (the engine's executor, while PyTorch runs the region, as during an update)
            module.updating = fresh.executor
        module.building = False
    if changed:  # built from older weights: the region takes the new ones as after any change
        _stats.count("background_builds_updated")
        try:
            update_region(module, current_values(module), options, lambda: overrides)
        except Exception as exc:  # PyTorch runs the region, with the live weights: it goes on doing so
            module.updating = None
            module.why = f"its weights changed while its engine was built, and it could not take them ({exc})"
            log.warning("trtrtx: region %s runs in PyTorch: its weights changed while its engine was built in the "
                        "background, and the engine could not take them (%s)", module.name, one_line(exc))
        finally:
            UPDATES.start_deferred()
        return
    RECHECKS.arm()
    _stats.count("background_builds_done")
    log.info("trtrtx: region %s: its engine, built in the background in %.2fs, runs it now (%s)", module.name,
             time.perf_counter() - start, fresh.kind)


BUILD_LATER[0] = start  # a graph switched to weights as inputs builds its engines this way too
