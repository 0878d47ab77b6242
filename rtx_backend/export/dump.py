"""`dump_onnx_dir`: write each region's ONNX model, with a JSON sidecar of its inputs and outputs,
so that users can open what was lowered in their own tools (Netron, Polygraphy, trtexec).

Files are named by region and content hash, `<region>-<sha256[:12]>.onnx` and `.json`, so regions
of different graphs or processes never overwrite each other and an unchanged region is written
once. Each file is written to a temp file and renamed (_files.atomic_write): a reader never sees
half a model. A failed write is a warning; dumping never fails a compilation.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from .._files import atomic_write
from .._types import OnnxRegion, TensorSpec

log = logging.getLogger("rtx_backend")


def dump_region(name: str, region: OnnxRegion, directory: str) -> Path | None:
    """Write the region's ONNX model and sidecar; returns the model's path, or None on failure."""
    digest = hashlib.sha256(region.model).hexdigest()
    stem = f"{name}-{digest[:12]}"
    sidecar = {
        "region": name,
        "onnx": f"{stem}.onnx",
        "sha256": digest,
        "inputs": [_describe(s) for s in region.inputs],
        "outputs": [_describe(s) for s in region.outputs],
        "region_tensor_args": list(region.tensor_args),
    }
    try:
        root = Path(directory)
        model_path = root / f"{stem}.onnx"
        lock = root / ".trtrtx-dump.lock"  # one lock file, not one beside every model
        atomic_write(model_path, [region.model], lock=lock)
        atomic_write(root / f"{stem}.json", [(json.dumps(sidecar, indent=2) + "\n").encode()], lock=lock)
    except OSError as exc:
        log.warning("trtrtx: could not write region %s's ONNX model to dump_onnx_dir=%r: %s", name, directory, exc)
        return None
    log.info("trtrtx: wrote region %s's ONNX model to %s", name, model_path)
    return model_path


def _describe(spec: TensorSpec) -> dict[str, Any]:
    """Shape with dynamic dims as their names; example shape; dtype; per-dim bounds."""
    return {
        "name": spec.name,
        "shape": list(spec.shape),
        "example_shape": list(spec.hint),
        "dtype": str(spec.dtype).removeprefix("torch."),
        "bounds": [[lo, hi] for lo, hi in spec.bounds],
    }
