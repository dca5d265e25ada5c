"""No module reaches into another object's or library's private names (docs/architecture.md): the one exception is
the documented stop of torch's worker processes (``_loading/transport.py``, ``_stop_workers``)."""

from __future__ import annotations

import ast
from pathlib import Path

import guideloom

SOURCE = Path(guideloom.__file__).parent
ALLOWED = {("_loading/transport.py", "_stop_workers")}  # torch has no public call to stop persistent workers


def _private_reaches(path: Path) -> list[str]:
    """``x._name`` where ``x`` is not ``self``, ``cls`` or ``super()``, and imports of private names of other
    packages, outside the allowed functions."""
    tree = ast.parse(path.read_text(), str(path))
    relative = path.relative_to(SOURCE).as_posix()
    allowed_lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and (relative, node.name) in ALLOWED:
            allowed_lines |= set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in {"self", "cls"}:
                continue
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                continue
            if node.lineno not in allowed_lines:
                found.append(f"{relative}:{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.ImportFrom) and node.module and not node.module.startswith("guideloom"):
            names = [alias.name for alias in node.names if alias.name.startswith("_")]
            if any(part.startswith("_") and not part.startswith("__") for part in node.module.split(".")):
                names.append(node.module)
            found += [f"{relative}:{node.lineno}: from {node.module} import {name}" for name in names]
    return found


def test_no_module_reaches_into_private_names_but_the_torch_worker_shutdown() -> None:
    reaches = [reach for path in sorted(SOURCE.rglob("*.py")) for reach in _private_reaches(path)]
    assert reaches == []


def test_the_torch_worker_shutdown_is_where_the_exception_says() -> None:
    """The allowed function exists and does reach into torch (so the exception is not stale)."""
    relative, function = next(iter(ALLOWED))
    tree = ast.parse((SOURCE / relative).read_text())
    body = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == function)
    assert any(isinstance(node, ast.Attribute) and node.attr.startswith("_") for node in ast.walk(body))
