"""TensorRT-RTX's runtime cache (JIT-compiled kernels), shared by the engines of a process.

attach(config, options) gives a runtime config the process-wide cache object for its path and
returns it; the caller keeps that reference while the config lives.
"""

from __future__ import annotations

import threading
from typing import Any

from ._options import Options

_LOCK = threading.Lock()
_CACHES: dict[str, Any] = {}


def attach(config: Any, options: Options) -> Any:
    key = options.runtime_cache_path or ""
    with _LOCK:
        cache = _CACHES.get(key)
        if cache is None:
            cache = config.create_runtime_cache()
            _CACHES[key] = cache
    config.set_runtime_cache(cache)
    return cache
