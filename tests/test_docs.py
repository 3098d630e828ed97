"""The docs check themselves against the tree, so they cannot drift from it:

- every module of ``orchestrator/`` and ``remote_payload/`` is named in its side's table of
  docs/architecture.md ("Laptop side", "Server side"): a top-level module by a row of its own
  (first cell `` `trace.py` ``), a module in a package by the package's row (first cell
  `` `sync/` ``) naming it by its path relative to the package (`` `tarstream.py` ``) — the way
  the doc writes paths; a package's ``__init__.py`` is named by the package's row;
- every test folder (a folder under ``tests/`` holding a Python file besides ``__init__.py``) is
  named in the "Tests" table by its path (`` `tests/e2e/daily/` ``); a first cell may write
  ``<package>`` for each name its row lists in backticks (`` `tests/orchestrator/<package>/` ``
  with `` `cli` ``, `` `jobs` ``, ...);
- the import-linter contract "cli is the only importer of click" in pyproject.toml names every
  top-level package and module of ``orchestrator/`` but ``cli``, read from the tree;
- README.md's "Development" tree names every top-level package of both sides (``warm/`` too);
- docs/commands.md has a heading ``orch <command>`` for every command and subcommand of the real
  click group, and names each of its options (`` `--flag` ``, every spelling) under that heading;
  a hidden option (``--iterations`` of ``status``, for tests) is no part of the interface.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import click
import pytest

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "architecture.md"
COMMANDS = REPO / "docs" / "commands.md"


def section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section of a markdown text (up to the next ``## ``)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("## ") and line[3:].startswith(heading))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "\n".join(lines[start + 1:end])


def first_table(text: str) -> list[tuple[str, str]]:
    """The rows of the first markdown table in ``text`` as (first cell, rest of the row), the
    header and the separator left out."""
    rows: list[tuple[str, str]] = []
    for line in text.splitlines():
        if line.startswith("|"):
            first, _, rest = line[1:].partition(" | ")
            rows.append((first.strip(), rest))
        elif rows:
            break
    return rows[2:]


def backticked(text: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", text))


def unnamed_modules(doc: str, heading: str, root: Path) -> list[str]:
    """The modules under ``root`` that the table of ``doc``'s section ``heading`` does not name."""
    rows = first_table(section(doc, heading))
    by_first = {name: rest for first, rest in rows for name in backticked(first)}
    missing = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if "__pycache__" in rel.parts:
            continue
        if len(rel.parts) == 1:
            if rel.name != "__init__.py" and rel.name not in by_first:
                missing.append(f"{root.name}/{rel}")
            continue
        package = rel.parts[0] + "/"
        if package not in by_first:
            missing.append(f"{root.name}/{rel} (no row for {package})")
        elif rel.name != "__init__.py" and "/".join(rel.parts[1:]) not in backticked(by_first[package]):
            missing.append(f"{root.name}/{rel}")
    return missing


@pytest.mark.parametrize(("root", "heading"), [("orchestrator", "Laptop side"), ("remote_payload", "Server side")])
def test_architecture_md_names_every_module_of_each_side(root: str, heading: str) -> None:
    missing = unnamed_modules(ARCHITECTURE.read_text(encoding="utf-8"), heading, REPO / root)
    assert missing == [], "\n".join(missing)


def test_the_module_rule_names_what_the_doc_leaves_out(tmp_path: Path) -> None:
    root = tmp_path / "orchestrator"
    for rel in ("__init__.py", "ask.py", "trace.py", "sync/__init__.py", "sync/send.py", "sync/tarstream.py",
                "warm/__init__.py", "warm/client.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    doc = ("## Laptop side\n\n| package / module | modules |\n|---|---|\n"
           "| `sync/` | `send.py` the send, headers by tarstream.py |\n| `ask.py` | asks |\n\n## Server side\n")
    assert unnamed_modules(doc, "Laptop side", root) == [
        "orchestrator/sync/tarstream.py", "orchestrator/trace.py", "orchestrator/warm/__init__.py (no row for warm/)",
        "orchestrator/warm/client.py (no row for warm/)"]


def test_architecture_md_names_every_test_folder() -> None:
    rows = first_table(section(ARCHITECTURE.read_text(encoding="utf-8"), "Tests"))
    named: set[str] = set()
    for first, rest in rows:
        for path in backticked(first):
            if "<package>" in path:
                named |= {path.replace("<package>", name) for name in backticked(rest)}
            else:
                named.add(path)
    folders = sorted({p.parent for p in (REPO / "tests").rglob("*.py")
                      if p.name != "__init__.py" and "__pycache__" not in p.parts and p.parent != REPO / "tests"})
    missing = [f"{folder.relative_to(REPO)}/" for folder in folders if f"{folder.relative_to(REPO)}/" not in named]
    assert missing == [], "\n".join(missing)


def test_the_click_contract_covers_every_laptop_package_but_cli() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    contract = next(c for c in config["tool"]["importlinter"]["contracts"]
                    if c["name"] == "cli is the only importer of click")
    assert contract["forbidden_modules"] == ["click"]
    tops = {p.stem if p.suffix == ".py" else p.name for p in (REPO / "orchestrator").iterdir()
            if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()}
    assert sorted(tops - {"cli"} - {m.removeprefix("orchestrator.") for m in contract["source_modules"]}) == []


def real_commands() -> list[tuple[str, click.Command]]:
    """Every command and subcommand of the real ``orch`` group, by its path (``hosts add``),
    loaded as ``orch`` loads them (its lazy group imports each command's module)."""
    from orchestrator.cli.main import cli

    found: list[tuple[str, click.Command]] = []

    def walk(group: click.Group, ctx: click.Context, prefix: str) -> None:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            assert command is not None, name
            found.append((prefix + name, command))
            if isinstance(command, click.Group):
                walk(command, click.Context(command, info_name=name, parent=ctx), prefix + name + " ")

    walk(cli, click.Context(cli, info_name="orch"), "")
    return found


def command_sections(text: str) -> dict[str, str]:
    """docs/commands.md's sections by command path: a heading ``### `orch hosts add` `` (any
    level), its body up to the next heading."""
    sections: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        heading = re.match(r"#+ `orch ([a-z][a-z -]*)`\s*$", line)
        if heading:
            current = heading.group(1).strip()
            sections[current] = ""
        elif line.startswith("#"):
            current = None
        elif current is not None:
            sections[current] += line + "\n"
    return sections


def test_commands_md_has_a_section_for_every_command_naming_each_option() -> None:
    sections = command_sections(COMMANDS.read_text(encoding="utf-8"))
    missing = []
    for path, command in real_commands():
        if path not in sections:
            missing.append(f"orch {path}")
            continue
        for param in command.params:
            if not isinstance(param, click.Option) or param.name == "help" or param.hidden:
                continue
            for flag in [*param.opts, *param.secondary_opts]:
                if not re.search(rf"`{re.escape(flag)}[` =/\[]", sections[path]):
                    missing.append(f"orch {path} {flag}")
    assert missing == [], "\n".join(missing)


def test_the_command_rule_reads_headings_and_their_bodies() -> None:
    text = "# Commands\n\n### `orch hosts add`\n\n`--ssh CMD` what\n\n### `orch up`\n\n`--trust`\n## Exit codes\nx\n"
    assert command_sections(text) == {"hosts add": "\n`--ssh CMD` what\n\n", "up": "\n`--trust`\n"}


def test_the_readme_development_tree_names_every_top_level_package() -> None:
    tree = section((REPO / "README.md").read_text(encoding="utf-8"), "Development")
    packages = [f"{root}/{p.name}/" for root in ("orchestrator", "remote_payload")
                for p in sorted((REPO / root).iterdir()) if (p / "__init__.py").is_file()]
    missing = [p for p in packages if not re.search(rf"(?<![\w/]){re.escape(p.split('/')[1])}/", tree)]
    assert missing == [], "\n".join(missing)
