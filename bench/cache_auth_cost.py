"""What authenticating cache files costs: per file read (the HMAC of a header, whose SHA-256 of
the payloads is computed for the integrity check anyway), per process (reading the key), and
per call (nothing: files are checked when they are read, not when a model runs).

    python bench/cache_auth_cost.py [--engine-mb 64]

Prints the numbers and saves bench/results/<date>-<device>-<TensorRT-RTX version>-cache-auth-cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench
from rtx_backend import _files, _trust
from rtx_backend._types import OnnxRegion, TensorSpec
from rtx_backend.cache import engines as _engine_cache
from rtx_backend.cache.engines import EngineCache, EngineEntry, Key


def best_of(fn, n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine-mb", type=int, default=64)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="trtrtx-auth-config-")  # a fresh key
    directory = Path(tempfile.mkdtemp(prefix="trtrtx-auth-"))

    start = time.perf_counter()
    secret = _trust.secret()
    make_key_s = time.perf_counter() - start
    assert secret is not None
    _trust.KEYS.clear()
    read_key_s = best_of(lambda: (_trust.KEYS.clear(), _trust.secret()), 20)
    cached_key_s = best_of(_trust.secret, 200)

    digest = "ab" * 32
    sign_s = best_of(lambda: _trust.sign(digest, secret), 2000)
    verify_s = best_of(lambda: _trust.verify(digest, _trust.sign(digest, secret), secret), 2000)

    spec = TensorSpec("input_0", (4, 16), torch.float32, (4, 16), None)
    region = OnnxRegion(os.urandom(1 << 20), (0,), (spec,), (spec,))
    entry = EngineEntry(region, os.urandom(args.engine_mb << 20), {})
    key = Key("cd" * 32, {"graph": "bench"})
    cache = EngineCache(directory, 1 << 40)
    assert cache.store(key, entry)
    data = _files.read_buffer(cache.path(key), limit=cache.size_limit)
    real_verify = _trust.verify
    with_auth, without = [], []
    for _ in range(8):  # interleaved, best of each: the machine's noise is larger than the difference
        with_auth.append(best_of(lambda: _engine_cache.decode(data, key), 1))
        _trust.verify = lambda digest, mac, key: True  # type: ignore[assignment]
        try:
            without.append(best_of(lambda: _engine_cache.decode(data, key), 1))
        finally:
            _trust.verify = real_verify  # type: ignore[assignment]
    decode_s, decode_unauthenticated_s = min(with_auth), min(without)
    directory_check_s = best_of(lambda: _trust.trusted_directory(directory, "engine cache"), 200)

    result = {
        "what": "cost of authenticating cache files (HMAC-SHA256 of each file's header under a per-user key)",
        "per_call_s": 0.0,
        "per_call_note": "nothing is checked on a model's call: files are authenticated when they are read",
        "make_key_once_s": make_key_s,
        "read_key_once_per_process_s": read_key_s,
        "key_lookup_cached_s": cached_key_s,
        "sign_header_s": sign_s,
        "verify_header_s": verify_s,
        "directory_check_s": directory_check_s,
        "engine_entry_mb": args.engine_mb + 1,
        "decode_entry_s": decode_s,
        "decode_entry_without_authentication_s": decode_unauthenticated_s,
        "authentication_share_of_decode": (decode_s - decode_unauthenticated_s) / decode_s,
        "note": "the payloads' SHA-256 (the integrity check) is what the HMAC covers: a large engine is hashed once",
        "torch": torch.__version__,
    }
    for k, v in result.items():
        print(f"{k}: {v * 1e6:.1f} us" if isinstance(v, float) and k.endswith("_s") else f"{k}: {v}")
    if not args.no_save:
        env = bench.environment()
        out = bench.result_path("cache-auth-cost", env)
        out.write_text(json.dumps({"env": env, **result}, indent=2) + "\n")
        print(f"saved {out}")


if __name__ == "__main__":
    main()
