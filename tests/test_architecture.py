"""The house rules (docs/architecture.md), checked so the tree cannot drift back: the
import-linter contracts in pyproject.toml pass, no module import circle exists (imports inside
functions and under TYPE_CHECKING count), only the CLI makes a rich Console, every package says
what it is for, the top-level folders stay small, and no test ships inside the payload."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("orchestrator", "remote_payload")


def test_the_import_contracts_in_pyproject_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " 0 broken" in proc.stdout and "Contracts:" in proc.stdout, proc.stdout[-2000:]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    member = stack.pop()
                    on.discard(member)
                    part.append(member)
                    if member == node:
                        break
                if len(part) > 1:
                    found.append(sorted(part))
    return found


def test_no_module_imports_itself_through_others() -> None:
    graph = grimp.build_graph(*ROOTS, cache_dir=None)
    modules = {m for m in graph.modules if m.split(".")[0] in ROOTS}
    edges = {m: {t for t in graph.find_modules_directly_imported_by(m) if t in modules} for m in modules}
    # a package's __init__ is no import target that closes a loop: count only module -> module
    assert _cycles(edges) == []


def test_the_cycle_finder_sees_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _runtime_imports(path: Path) -> list[str]:
    """Modules ``path`` imports outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(block.test) for n in ast.walk(block)}
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return out


def test_only_the_cli_makes_a_rich_console() -> None:
    offenders = [str(p.relative_to(REPO)) for p in sorted((REPO / "orchestrator").rglob("*.py"))
                 if "cli" not in p.relative_to(REPO / "orchestrator").parts[:1]
                 and any(m == "rich.console" or m.startswith("rich.console.") for m in _runtime_imports(p))]
    assert offenders == []


def test_every_package_states_its_purpose_in_one_line() -> None:
    missing = []
    for root in ROOTS:
        for init in sorted((REPO / root).rglob("__init__.py")):
            doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
            if not doc or "\n" in doc.split("\n\n")[0].strip():
                missing.append(str(init.relative_to(REPO)))
    assert missing == []


@pytest.mark.parametrize("root", ROOTS)
def test_a_top_level_folder_holds_packages_not_a_pile_of_modules(root: str) -> None:
    flat = sorted(p.name for p in (REPO / root).glob("*.py"))
    assert len(flat) <= 10, flat


def test_no_test_ships_inside_the_payload() -> None:
    shipped = [str(p.relative_to(REPO)) for p in (REPO / "remote_payload").rglob("*.py")
               if p.name.startswith("test_") or p.name == "conftest.py" or "tests" in p.parts]
    assert shipped == []
