"""docs/architecture.md names every module of the package, and no module that is gone; the tests keep its layout."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import grimp

from tests.helpers.processes import ROOT

PACKAGE = ROOT / "src" / "guideloom"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
TOP_LEVEL = "top level"  # the first column of the rows of modules directly under src/guideloom


def modules_in_tree() -> set[str]:
    """Every module's path under the package, but a subpackage's ``__init__.py`` that holds only its docstring."""
    found = set()
    for file in PACKAGE.rglob("*.py"):
        body = ast.parse(file.read_text()).body
        only_docstring = len(body) <= 1 and all(isinstance(node, ast.Expr) for node in body)
        if file.name == "__init__.py" and file.parent != PACKAGE and only_docstring:
            continue
        found.add(file.relative_to(PACKAGE).as_posix())
    return found


def modules_in_architecture() -> set[str]:
    """The modules the table of docs/architecture.md names: ``| subpackage | `a.py`, `b.py` | what they own |``,
    an empty first column continuing the subpackage above."""
    named, subpackage = set(), None
    for line in ARCHITECTURE.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or not cells[1].startswith("`"):
            continue
        if cells[0]:
            subpackage = "" if cells[0] == TOP_LEVEL else cells[0].strip("`") + "/"
        assert subpackage is not None, f"docs/architecture.md: a row names no subpackage before it: {line}"
        named |= {subpackage + module for module in re.findall(r"`([^`]+\.py)`", cells[1])}
    return named


def test_architecture_names_every_module_of_the_package() -> None:
    missing = sorted(modules_in_tree() - modules_in_architecture())
    rows = "\n".join(f"  | | `{Path(path).name}` | what it owns |  (in {Path(path).parent} rows)" for path in missing)
    assert not missing, (
        f"docs/architecture.md does not name these modules of src/guideloom: {', '.join(missing)}.\n"
        f"Add a row for each to its table, after the rows of its subpackage (a new subpackage starts its first "
        f"row with its name in the first column, a top-level module with '{TOP_LEVEL}'):\n{rows}"
    )


def test_architecture_names_no_module_that_is_gone() -> None:
    gone = sorted(modules_in_architecture() - modules_in_tree())
    assert not gone, (
        f"docs/architecture.md names modules that src/guideloom no longer has: {', '.join(gone)}. "
        "Remove their rows, or rename them as the modules were renamed."
    )


def test_every_test_module_lies_in_a_concept_folder_that_is_a_package() -> None:
    """The layout the page's Tests section describes: no test module directly under tests/, and every folder of
    test modules a package (so that modules of the same name in two folders never collide)."""
    tests = ROOT / "tests"
    loose = sorted(f"tests/{path.name}" for path in tests.glob("test_*.py"))
    assert not loose, f"move {', '.join(loose)} into the folder of the concept each tests (docs/architecture.md)"
    folders = {path.parent for path in tests.rglob("test_*.py")}
    not_packages = sorted(str(folder.relative_to(ROOT)) for folder in folders if not (folder / "__init__.py").exists())
    assert not not_packages, f"add an empty __init__.py to {', '.join(not_packages)}"


def test_no_module_of_the_package_imports_itself_through_others() -> None:
    """No import cycle anywhere in src/guideloom, within a subpackage or across, ``if TYPE_CHECKING:`` imports
    included (docs/architecture.md): the strongly connected components of the import graph are single modules."""
    graph = grimp.build_graph("guideloom", exclude_type_checking_imports=False)
    cycles = [sorted(component) for component in _strongly_connected(graph) if len(component) > 1]
    assert not cycles, "these modules import each other, directly or through others:\n" + "\n".join(
        "  " + " <-> ".join(cycle) for cycle in sorted(cycles)
    )


def _strongly_connected(graph: grimp.ImportGraph) -> list[set[str]]:
    """Tarjan's strongly connected components of the graph's direct imports (iteratively: no recursion limit)."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = lowest[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, imported = work[-1]
            following = next(imported, None)
            if following is not None:
                if following not in index:
                    index[following] = lowest[following] = len(index)
                    stack.append(following)
                    on_stack.add(following)
                    work.append((following, iter(sorted(graph.find_modules_directly_imported_by(following)))))
                elif following in on_stack:
                    lowest[module] = min(lowest[module], index[following])
                continue
            work.pop()
            if work:
                lowest[work[-1][0]] = min(lowest[work[-1][0]], lowest[module])
            if lowest[module] == index[module]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == module:
                        break
                components.append(component)
    return components
