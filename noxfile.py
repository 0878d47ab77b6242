"""Developer sessions: `nox -s lint`, `nox -s typecheck`, `nox -s tests`, `nox -s zoo`, `nox -s smoke`."""

from __future__ import annotations

import nox

TORCH = "torch==2.13.0"  # CPU build; install it before the project so pip does not fetch CUDA torch
PYTHON = ["3.11"]
nox.options.sessions = ["lint", "typecheck", "tests", "zoo"]


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", "rtx_backend", "tests", "examples", "bench")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    session.install(TORCH)
    session.install("-e", ".[dev]")
    session.run("mypy", "rtx_backend")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    session.install(TORCH)
    session.install("-e", ".[test]")
    session.run("pytest", "-q", *session.posargs)


@nox.session(python=PYTHON)
def zoo(session: nox.Session) -> None:
    """The model zoo on the CPU (tests/test_zoo.py: Hugging Face models from their configs), which
    the default test run leaves out: several minutes on two cores."""
    session.install(TORCH)
    session.install("-e", ".[test]")
    session.run("pytest", "-q", "-m", "zoo", "tests/test_zoo.py", *session.posargs)


@nox.session(python=PYTHON)
def smoke(session: nox.Session) -> None:
    """The main job on this machine (ONNX Runtime path without a GPU)."""
    session.install(TORCH)
    session.install("-e", ".")
    session.run("python", "examples/quickstart.py")
