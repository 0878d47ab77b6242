"""The package's layout, read from its source with `ast`: stages import only the stages before
them and the shared modules, there is no import circle, and a long module says why it is long.

Every import counts, also one inside a function (a lazy import is still a dependency); only
imports under `if TYPE_CHECKING:` (annotations, never run) are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "rtx_backend"

# The floors, from the bottom. A module may import its own floor's modules and those of the
# floors below. The shared modules (rtx_backend/_*.py: types, errors, options, targets, files,
# the torch compat layer) are the ground floor; the backend's chain and the package's public
# face sit on top.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("_shared",),
    ("lower",),
    ("plan",),
    ("export",),
    ("build",),
    ("cache",),
    ("run",),
    ("assemble",),
    ("_backend",),
    ("tools",),
    ("__init__", "__main__"),
)
MAX_LINES = 300


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports (a `from pkg import mod` names mod)."""
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            bases = [a.name for a in node.names]
            names: list[str] = []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            bases, names = [base], [a.name for a in node.names]
        else:
            continue
        for base in bases:
            if base != "rtx_backend" and not base.startswith("rtx_backend."):
                continue
            subs = [f"{base}.{n}" for n in names if f"{base}.{n}" in modules]
            found.update(subs or [base])
    found.discard(name)
    return {m for m in found if m in modules}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _floor(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:  # the package itself
        return len(FLOORS) - 1
    key = parts[1]
    if len(parts) == 2 and key.startswith("_") and key not in ("_backend", "__main__"):
        key = "_shared"
    for i, floor in enumerate(FLOORS):
        if key in floor:
            return i
    raise AssertionError(f"{module} is on no floor: add its folder to FLOORS in {__file__}")


def test_every_module_is_on_a_floor():
    for module in _modules():
        _floor(module)


def test_no_module_imports_a_floor_above_its_own():
    upward = [f"{m} -> {d}" for m, deps in _graph().items() for d in sorted(deps) if _floor(d) > _floor(m)]
    assert not upward, "imports of a later stage:\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), and self-loops."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_has_no_circle():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("module", sorted(_modules()))
def test_a_long_module_says_why(module):
    """A module over MAX_LINES lines carries a paragraph in its docstring that starts with
    "Long because" and gives the reason."""
    path = _modules()[module]
    text = path.read_text()
    lines = len(text.splitlines())
    if lines <= MAX_LINES:
        return
    doc = ast.get_docstring(ast.parse(text)) or ""
    assert "Long because" in doc, f"{path.relative_to(PACKAGE.parent)} has {lines} lines and no reason"


def test_the_backend_is_only_the_chain():
    """_backend.py is the torch.compile entry point and nothing else: one public function."""
    tree = ast.parse((PACKAGE / "_backend.py").read_text())
    functions = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert functions == ["trtrtx"]
    assert len((PACKAGE / "_backend.py").read_text().splitlines()) <= 120
