"""GPU probe: does TensorRT-RTX's IRuntimeCache.deserialize add to a cache or replace it?

Two fresh processes each run a different model with its own runtime cache file (A, B); then
this process loads both files into one cache, in both orders, and into a cache that already
holds A's kernels, and prints the serialized sizes. Merging on save is only safe if a second
deserialize adds to the cache (the merged size is about the sum).

    python bench/probes/runtime_cache_merge.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import sys, torch, rtx_backend
from torch import nn
torch.manual_seed(0)
kind, path = sys.argv[1], sys.argv[2]
if kind == "mlp":
    model, x = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 64)), torch.randn(8, 256)
else:
    model, x = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Conv2d(16, 8, 3)), torch.randn(2, 3, 32, 32)
model = model.eval().cuda().half()
fn = torch.compile(model, backend="trtrtx", options={"min_block_size": 1, "engine_cache_dir": "",
                                                     "runtime_cache_path": path})
with torch.no_grad():
    fn(x.cuda().half())
print(rtx_backend.save_runtime_cache())
"""


def sizes(label: str, cache) -> None:
    blob = cache.serialize()
    print(f"{label}: {len(bytes(blob)) if blob is not None else 0} bytes", flush=True)


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="rtcache-"))
    files = {}
    for kind in ("mlp", "conv"):
        files[kind] = tmp / f"{kind}.bin"
        res = subprocess.run([sys.executable, "-c", CHILD, kind, str(files[kind])], capture_output=True, text=True)
        print(kind, res.returncode, res.stdout.strip()[-200:], res.stderr.strip()[-300:] if res.returncode else "")
    a, b = files["mlp"].read_bytes(), files["conv"].read_bytes()
    print(f"A (mlp) {len(a)} bytes, B (conv) {len(b)} bytes")

    import torch
    from torch import nn

    from rtx_backend._record import recording

    tiny = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval().cuda().half()
    fn = torch.compile(tiny, backend="trtrtx", options={"min_block_size": 1, "engine_cache_dir": "",
                                                         "runtime_cache_path": ""})
    with torch.no_grad(), recording() as graphs:
        fn(torch.randn(2, 4, device="cuda", dtype=torch.half))
    engine = graphs[0].regions[0].executor.engine  # any engine gives a runtime config
    config = engine.create_runtime_config()
    for order in (("A", a, "B", b), ("B", b, "A", a)):
        cache = config.create_runtime_cache()
        print(f"deserialize {order[0]}:", cache.deserialize(order[1]))
        sizes(f"after {order[0]}", cache)
        print(f"deserialize {order[2]}:", cache.deserialize(order[3]))
        sizes(f"after {order[0]} then {order[2]}", cache)
        again = config.create_runtime_cache()
        again.deserialize(cache.serialize())
        sizes("that, serialized and loaded again", again)


if __name__ == "__main__":
    main()
