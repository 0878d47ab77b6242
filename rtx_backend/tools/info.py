"""`python -m rtx_backend info`, `clear-cache` and `adopt-cache`: what is installed, what this
machine can do, and the caches.

The first thing to ask when something goes wrong: which TensorRT-RTX, torch and ONNX versions
are installed, whether the installed TensorRT-RTX can run engines on this GPU (tried, with a
tiny engine, not guessed), which GPUs it can build for, and where the caches are. Everything
here works without TensorRT-RTX or a GPU, and says so.
"""

from __future__ import annotations

import contextlib
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from .. import _trt
from .._options import Options, default_cache_root

PACKAGES = ("torch", "tensorrt-rtx", "onnx", "onnxruntime", "onnxscript")
RUNTIME_FILES = "tensorrt_rtx-*.cache"  # _runtime_cache.default_file_name()


def collect(engine_dir: Path | None = None, runtime_dir: Path | None = None, *, probe: bool = True) -> dict[str, Any]:
    """Everything `info` prints, as JSON-serialisable values."""
    lo, hi = _trt.SUPPORTED_VERSIONS
    missing = _trt.unavailable_reason()
    return {
        "rtx_backend": _version("trtrtx") or "unknown",
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in PACKAGES},
        "tensorrt_rtx": {
            "usable": missing is None,
            "version": _trt.version() if missing is None else None,
            "problem": missing,
            "supported": f"{lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}",
        },
        "gpu": gpu_info(probe),
        "buildable": [list(t) for t in _trt.buildable_capabilities()],
        "buildable_source": "installed TensorRT-RTX" if missing is None else "TensorRT-RTX 1.7's list; it is not usable here",
        "caches": cache_info(engine_dir, runtime_dir),
    }


def gpu_info(probe: bool = True) -> dict[str, Any]:
    """The current GPU and whether the installed TensorRT-RTX runs an engine built for it."""
    import torch

    out: dict[str, Any] = {"name": None, "compute_capability": None, "runs_engines": False, "why": ""}
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        out["why"] = f"no CUDA GPU visible to torch (torch {torch.__version__} is {build})"
        return out
    index = torch.cuda.current_device()
    out["name"] = torch.cuda.get_device_name(index)
    out["compute_capability"] = list(torch.cuda.get_device_capability(index))
    missing = _trt.unavailable_reason()
    if missing is not None:
        out["why"] = missing
    elif probe:
        out["runs_engines"], out["why"] = probe_engine()
    else:
        out["runs_engines"], out["why"] = None, "not tried (--no-probe)"
    return out


def probe_engine() -> tuple[bool, str]:
    """Build a one-op engine for this GPU and load it: the only sure test that engines run here."""
    from ..build.engine import build
    from ..run.executors import deserialize

    try:
        engine = build(_tiny_onnx(), None, {})
        deserialize(engine.data)
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
    return True, f"a test engine was built for this GPU and loaded ({engine.seconds:.1f}s)"


def _tiny_onnx() -> bytes:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def cache_dirs(engine_dir: Path | None = None, runtime_dir: Path | None = None) -> dict[str, Path]:
    """The engine and runtime cache directories (the per-user defaults unless given)."""
    engines = engine_dir or Options().engine_cache_path or default_cache_root() / "engines"
    return {"engines": Path(engines), "runtime": Path(runtime_dir or default_cache_root() / "runtime")}


def cache_info(engine_dir: Path | None = None, runtime_dir: Path | None = None) -> dict[str, Any]:
    dirs = cache_dirs(engine_dir, runtime_dir)
    out: dict[str, Any] = {"root": str(default_cache_root())}
    for kind in ("engines", "runtime"):
        files = _files(kind, dirs[kind])
        out[kind] = {"path": str(dirs[kind]), "files": len(files), "bytes": sum(size for _, size in files)}
    return out


def clear_caches(engine_dir: Path | None = None, runtime_dir: Path | None = None) -> dict[str, dict[str, Any]]:
    """Delete everything the caches wrote: engines, graphs, validation records, runtime caches,
    the exporter's op list, and temp files that killed writers left behind. Only files whose
    names and first bytes are ours (never a user's file that happens to sit there), never lock
    files, never the temp file of a writer that is still running.

    The engine cache's own lock is held, as its eviction does, so no writer is mid-way.
    """
    from .._files import file_lock

    dirs = {**cache_dirs(engine_dir, runtime_dir), "exporter": default_cache_root() / "exporter"}
    out: dict[str, dict[str, Any]] = {}
    for kind in ("engines", "runtime", "exporter"):
        directory = dirs[kind]
        removed = freed = 0
        lock = (file_lock(directory / ".lock")
                if kind == "engines" and directory.is_dir() else contextlib.nullcontext())
        with lock:
            for path, size in _files(kind, directory) + _stale_temps(kind, directory):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed, freed = removed + 1, freed + size
        out[kind] = {"path": str(directory), "files": removed, "bytes": freed}
    return out


def _files(kind: str, directory: Path) -> list[tuple[Path, int]]:
    """The cache files of ours in `directory` (engine cache, runtime cache or the exporter's op
    list) and their sizes."""
    from .. import _files
    from ..cache import store
    from ..lower import exporter_ops
    from ..run.runtime_cache import MAGIC

    paths: list[Path] = []
    if kind == "engines":
        paths = store.our_files(directory)
    elif kind == "runtime":
        with contextlib.suppress(OSError):
            paths = [p for p in directory.glob(RUNTIME_FILES) if _files.read_head(p, len(MAGIC)) == MAGIC]
    else:
        with contextlib.suppress(OSError):
            paths = [p for p in directory.glob(exporter_ops.FILES) if exporter_ops.is_ours(p)]
    out = []
    for path in paths:
        with contextlib.suppress(OSError):
            out.append((path, path.lstat().st_size))
    return out


def _stale_temps(kind: str, directory: Path) -> list[tuple[Path, int]]:
    """The temp files of our files in `directory` whose writers are gone, and their sizes."""
    import fnmatch
    import os
    import stat

    from .. import _files
    from ..cache import store
    from ..lower import exporter_ops

    ours = {"engines": store.is_our_name, "runtime": lambda n: fnmatch.fnmatch(n, RUNTIME_FILES),
            "exporter": lambda n: fnmatch.fnmatch(n, exporter_ops.FILES)}[kind]
    out = []
    for path, host, pid in _files.temps(directory, ours):
        with contextlib.suppress(OSError):
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and _files.stale(host, pid, st.st_mtime):
                out.append((path, st.st_size))
    return out


def _version(distribution: str) -> str | None:
    """The installed distribution's version; for a module imported from the path without package
    metadata (a wheel unpacked onto PYTHONPATH, say), its __version__ and so; None if neither."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        version = getattr(sys.modules.get(distribution.replace("-", "_")), "__version__", None)
        return f"{version} (imported from the path, no package metadata)" if version else None


# ---- text ---------------------------------------------------------------------------------------


def render(info: dict[str, Any]) -> str:
    trt, gpu, caches = info["tensorrt_rtx"], info["gpu"], info["caches"]
    lines = [f"rtx_backend {info['rtx_backend']} (Python {info['python']}, {info['platform']})", "packages:"]
    lines += [f"  {name:<13} {version or 'not installed'}" for name, version in info["packages"].items()]
    if trt["usable"]:
        lines.append(f"TensorRT-RTX:  {trt['version']} (rtx_backend supports {trt['supported']})")
    else:
        lines.append(f"TensorRT-RTX:  not usable: {trt['problem']}")
    if gpu["name"] is None:
        lines.append(f"GPU:           none: {gpu['why']}")
    else:
        major, minor = gpu["compute_capability"]
        lines.append(f"GPU:           {gpu['name']} (SM{major}.{minor})")
    verdict = {True: "yes", False: "no", None: "unknown"}[gpu["runs_engines"]]
    if gpu["name"] is not None:
        lines.append(f"runs engines:  {verdict}: {gpu['why']}")
    elif trt["usable"]:
        lines.append("runs engines:  no GPU: regions run in ONNX Runtime; engines are still built ahead of "
                     "time for declared target_compute_capabilities")
    else:
        lines.append("runs engines:  no: regions run in ONNX Runtime, and no engine is built")
    names = ", ".join(f"SM{a}.{b}" for a, b in info["buildable"])
    lines.append(f"builds for:    {names} ({info['buildable_source']})")
    lines.append(f"caches (root {caches['root']}; set RTX_BACKEND_CACHE_DIR to move it):")
    for kind, label in (("engines", "engine cache"), ("runtime", "runtime cache")):
        c = caches[kind]
        content = f"{c['files']} file(s), {_size(c['bytes'])}" if c["files"] else "empty"
        lines.append(f"  {label:<13} {c['path']}: {content}")
    return "\n".join(lines)


def render_cleared(cleared: dict[str, dict[str, Any]]) -> str:
    return "\n".join(f"{kind}: removed {c['files']} file(s), {_size(c['bytes'])}, from {c['path']}"
                     for kind, c in cleared.items())


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n:.1f} GiB"


def main(argv: list[str] | None = None) -> int:
    """The command line: `python -m rtx_backend {info,clear-cache,adopt-cache}`."""
    import argparse
    import json

    parser = argparse.ArgumentParser(
        prog="python -m rtx_backend", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="trtrtx, the torch.compile backend for NVIDIA TensorRT-RTX: what is installed,\n"
                    "what this machine can do, and the caches.",
        epilog="examples:\n"
               "  python -m rtx_backend info               versions, GPU, whether engines run here, caches\n"
               "  python -m rtx_backend info --json        the same as JSON, for scripts and bug reports\n"
               "  python -m rtx_backend clear-cache        delete cached engines and runtime caches\n"
               "  python -m rtx_backend adopt-cache DIR    trust an engine cache copied from another machine\n"
               "\n'python -m rtx_backend COMMAND --help' shows a command's options. The caches live under\n"
               "$RTX_BACKEND_CACHE_DIR, else $XDG_CACHE_HOME/rtx_backend, else ~/.cache/rtx_backend.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info_p = sub.add_parser("info", help="versions, GPU, buildable targets, caches")
    info_p.add_argument("--json", action="store_true", help="print JSON instead of text")
    info_p.add_argument("--no-probe", action="store_true", help="do not build a test engine on the GPU")
    clear_p = sub.add_parser("clear-cache", help="delete cached engines and TensorRT-RTX runtime caches")
    adopt_p = sub.add_parser("adopt-cache", help="check and re-sign an engine cache directory copied from elsewhere, "
                             "so that this user's compiles use it (see docs/cache-security.md)")
    adopt_p.add_argument("directory", type=Path, help="the engine cache directory to adopt")
    for p in (info_p, clear_p):
        p.add_argument("--engine-cache-dir", type=Path, help="the engine_cache_dir option, if you set one")
        p.add_argument("--runtime-cache-dir", type=Path, help="the directory of runtime_cache_path, if you set one")
    args = parser.parse_args(argv)
    if args.command == "info":
        info = collect(args.engine_cache_dir, args.runtime_cache_dir, probe=not args.no_probe)
        print(json.dumps(info, indent=2) if args.json else render(info))
    elif args.command == "adopt-cache":
        from ..tools.adopt import adopt_cache, render_adopted

        report = adopt_cache(args.directory)
        print(render_adopted(report))
        sys.stdout.flush()
        return 0 if report.ok else 1
    else:
        print(render_cleared(clear_caches(args.engine_cache_dir, args.runtime_cache_dir)))
    sys.stdout.flush()
    return 0
