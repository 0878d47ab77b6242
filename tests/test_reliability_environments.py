"""Reliability across environments: no GPU, a GPU that the installed TensorRT-RTX refuses,
TensorRT-RTX missing, too old or too new. Each is simulated; each gives a clear message and the
documented behaviour of the `runtime` option:

    auto         -> regions run in ONNX Runtime, one warning says why
    tensorrt_rtx -> RuntimeUnavailableError (through Dynamo's wrapper), saying why
    onnxruntime  -> regions run in ONNX Runtime, nothing to say
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

import pytest
import torch

import rtx_backend
from rtx_backend import RuntimeUnavailableError, _log, _targets, _trt
from rtx_backend.assemble import region as _region
from rtx_backend.run import executors as _executors

from .helpers import compile_and_run, regions
from .models import WithEagerOp, eval_model

SM86 = [(8, 6)]
TWO_REGIONS = {"min_block_size": 1, "torch_executed_ops": ["aten.sigmoid"]}


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    """The 'runs in ONNX Runtime' warning is once per process: start each test without it."""
    monkeypatch.setattr(_log, "SAID", _log.Once())


def _fallback_warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "regions run in ONNX Runtime" in r.getMessage()]


def _check_runtime_behaviour(caplog, runtime, why, **options):
    """Compile the two-region model with `runtime` and check the documented outcome."""
    model = eval_model(WithEagerOp())
    x = torch.randn(3, 16)
    options = {**TWO_REGIONS, **options, "runtime": runtime}
    with caplog.at_level(logging.WARNING, logger="rtx_backend"):
        if runtime == "tensorrt_rtx":
            with pytest.raises(RuntimeUnavailableError) as info:  # as documented, not Dynamo's wrapper
                compile_and_run(model, x, **options)
            error = info.value
            assert "runtime='tensorrt_rtx'" in str(error) and why in str(error)
            return
        y = compile_and_run(model, x, **options)
        torch._dynamo.reset()
        y2 = compile_and_run(model, x, **options)  # a second compile: still one warning in all
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(y2, y)
    assert [r.kind for r in regions()] == ["onnxruntime", "onnxruntime"]
    warnings = _fallback_warnings(caplog)
    if runtime == "auto":
        assert len(warnings) == 1, caplog.text
        assert why in warnings[0]
    else:
        assert warnings == [], caplog.text


# ---- no GPU ------------------------------------------------------------------------------------

@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(_targets, "current_capability", lambda: None)


# A CPU-only torch cannot be fixed by moving tensors to CUDA: the message says what can.
NO_GPU_WHY = ("is a CPU-only build" if torch.version.cuda is None else "sees no CUDA GPU")


@pytest.mark.parametrize("runtime", ["auto", "tensorrt_rtx", "onnxruntime"])
def test_no_gpu(no_gpu, caplog, runtime):
    _check_runtime_behaviour(caplog, runtime, NO_GPU_WHY, target_compute_capabilities=SM86)
    if runtime != "tensorrt_rtx":
        assert (rtx_backend.stats().get("engine_builds", 0) > 0) == (runtime == "auto")  # AOT build


def test_cpu_only_torch_says_to_install_a_cuda_build_not_to_move_tensors(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(_targets, "current_capability", lambda: None)
    _check_runtime_behaviour(caplog, "tensorrt_rtx", "install a CUDA build of torch", target_compute_capabilities=SM86)
    assert "move model and inputs" not in caplog.text


def test_cuda_torch_without_a_visible_gpu_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    why = _targets.no_cuda_reason()
    assert why is not None and "sees no CUDA GPU" in why and "CUDA_VISIBLE_DEVICES" in why


def test_cpu_tensors_on_a_gpu_machine_say_to_move_them(monkeypatch, caplog):
    monkeypatch.setattr(_targets, "no_cuda_reason", lambda: None)  # torch has CUDA and sees a GPU
    monkeypatch.setattr(_targets, "current_capability", lambda: (8, 6))
    _check_runtime_behaviour(caplog, "auto", "the model's tensors are on cpu; move model and inputs to CUDA",
                             target_compute_capabilities=SM86)


def test_no_gpu_and_no_target_builds_nothing_and_says_so(no_gpu, caplog):
    model = eval_model(WithEagerOp())
    x = torch.randn(3, 16)
    y = compile_and_run(model, x, **TWO_REGIONS)
    torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    assert "engine_builds" not in rtx_backend.stats()
    assert all(r.engine is None and r.kind == "onnxruntime" for r in regions())


# ---- a GPU that the installed TensorRT-RTX refuses -------------------------------------------------

REFUSAL = "The engine cannot run on this GPU, which has compute capability 8.6 (simulated)"


@pytest.fixture
def refusing_gpu(monkeypatch):
    """An SM 8.6 GPU on which TensorRT-RTX's deserialize fails (say, a driver too old for it)."""
    calls = []

    def deserialize(engine_bytes, threads=None):
        calls.append(len(engine_bytes))
        raise RuntimeUnavailableError(f"TensorRT-RTX cannot run this engine on this GPU: {REFUSAL}")

    # torch.cuda itself stays as it is (Dynamo reads it); our code asks _targets and _executors
    monkeypatch.setattr(_targets, "current_capability", lambda: (8, 6))
    monkeypatch.setattr(_region, "region_device", lambda gm: torch.device("cuda", 0))
    monkeypatch.setattr(_executors, "deserialize", deserialize)
    return calls


@pytest.mark.parametrize("runtime", ["auto", "tensorrt_rtx", "onnxruntime"])
def test_gpu_refused_by_tensorrt_rtx(refusing_gpu, caplog, runtime):
    _check_runtime_behaviour(caplog, runtime, REFUSAL, target_compute_capabilities=SM86)
    if runtime == "onnxruntime":
        assert refusing_gpu == []  # no engine was even tried
    else:
        assert refusing_gpu and all(n > 1000 for n in refusing_gpu)  # real engines were offered


def test_gpu_not_among_the_declared_targets(monkeypatch, caplog):
    monkeypatch.setattr(_targets, "current_capability", lambda: (8, 9))
    monkeypatch.setattr(_region, "region_device", lambda gm: torch.device("cuda", 0))
    _check_runtime_behaviour(caplog, "auto", "add (8, 9) to target_compute_capabilities",
                             target_compute_capabilities=SM86)


# ---- TensorRT-RTX too old, too new, broken -----------------------------------------------------------

@pytest.fixture
def trt_version(monkeypatch):
    """Pretend the installed tensorrt_rtx has another version (None: no __version__ at all)."""
    module = _trt.trt()

    def set_version(version):
        if version is None:
            monkeypatch.delattr(module, "__version__")
        else:
            monkeypatch.setattr(module, "__version__", version)
        _trt.reset()

    yield set_version
    _trt.reset()  # monkeypatch restores the version afterwards; the next call re-imports cleanly


@pytest.mark.parametrize("version", ["1.2.0.5", "1.3.9", "1.8.0", "2.0.0", "garbage", None])
def test_unsupported_version_is_unavailable_with_a_clear_message(trt_version, version):
    trt_version(version)
    assert not _trt.available()
    why = _trt.unavailable_reason()
    assert why is not None and "not supported" in why and "1.4 to 1.7" in why and "onnxruntime" in why
    with pytest.raises(RuntimeUnavailableError, match="not supported"):
        _trt.trt()


@pytest.mark.parametrize("runtime", ["auto", "tensorrt_rtx", "onnxruntime"])
def test_too_old_tensorrt_rtx(trt_version, caplog, runtime):
    trt_version("1.2.0")
    _check_runtime_behaviour(caplog, runtime, "TensorRT-RTX 1.2.0 is not supported",
                             target_compute_capabilities=SM86)
    assert "engine_builds" not in rtx_backend.stats()  # nothing is built with an unsupported version


def test_supported_versions_are_accepted(trt_version):
    for version in ("1.4.0", "1.6.1.2", "1.7.1.116"):
        trt_version(version)
        assert _trt.available(), _trt.unavailable_reason()


# ---- TensorRT-RTX not installed (a fresh interpreter where the import fails) -------------------

_MISSING = textwrap.dedent("""
    import json, logging, sys
    sys.modules["tensorrt_rtx"] = None  # `import tensorrt_rtx` now raises ImportError
    import torch
    import rtx_backend
    from rtx_backend import _trt, Options

    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    logging.getLogger("rtx_backend").addHandler(Keep())

    out = {"available": _trt.available(), "reason": _trt.unavailable_reason()}
    out["sm86"] = Options.from_dict({"target_compute_capabilities": [(8, 6)]}).target_compute_capabilities
    try:
        Options.from_dict({"target_compute_capabilities": [(9, 0)]})
    except rtx_backend.TargetError as exc:
        out["sm90"] = str(exc)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)
        def forward(self, x):
            return torch.relu(self.b(torch.sigmoid(torch.tanh(self.a(x)))))

    model = M().eval()
    x = torch.randn(3, 16)
    for runtime in ("auto", "onnxruntime", "tensorrt_rtx"):
        torch._dynamo.reset()
        del records[:]
        opts = {"runtime": runtime, "min_block_size": 1, "torch_executed_ops": ["aten.sigmoid"],
                "target_compute_capabilities": [(8, 6)]}
        try:
            with torch.no_grad():
                y = torch.compile(model, backend="trtrtx", options=opts)(x)
                out[runtime] = {"ok": bool(torch.allclose(y, model(x), atol=1e-5)), "log": list(records)}
        except Exception as exc:
            inner = getattr(exc, "inner_exception", exc)
            out[runtime] = {"error": type(inner).__name__, "message": str(inner)}
    out["builds"] = rtx_backend.stats().get("engine_builds", 0)
    print("RESULT" + json.dumps(out))
""")


def test_tensorrt_rtx_not_installed():
    proc = subprocess.run([sys.executable, "-c", _MISSING], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    out = json.loads(line.removeprefix("RESULT"))
    assert out["available"] is False
    assert "not importable" in out["reason"] and "pip install tensorrt-rtx" in out["reason"]
    assert out["sm86"] == [[8, 6]]  # checked against the known list, without TensorRT-RTX
    assert "not importable" in out["sm90"] and "(8, 6)" in out["sm90"]
    auto = out["auto"]
    assert auto["ok"] is True
    fallback = [m for m in auto["log"] if "regions run in ONNX Runtime" in m]
    assert len(fallback) == 1 and "not importable" in fallback[0], auto["log"]
    assert out["onnxruntime"] == {"ok": True, "log": []}
    assert out["tensorrt_rtx"]["error"] == "RuntimeUnavailableError"
    assert "not importable" in out["tensorrt_rtx"]["message"]
    assert out["builds"] == 0
