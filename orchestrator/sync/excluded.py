"""What the ignore rules leave out of the sync, said so that a person can act on it.

- ``summarize``: what ``select_files`` left out, per rule (files, bytes, folders) and the
  folders holding the most of it: ``orch submit`` (and ``--dry-run``) print it, ``--json``
  carries it as data. The rules' folders are never entered by the selection; here they are
  sized by a walk of at most ``SIZE_BUDGET`` entries in all, so a huge ``.venv/`` costs a
  bounded time and the totals read "at least" (``complete`` false).
- ``why``: why one path is not synced (the deciding rule, or the excluded folder above it),
  with the ``.orchignore`` lines that bring it back (``fix``). Each fix is tried against the
  real rules (the same matching as the sync, ``orchestrator/globs/``) before it is offered: a folder left out
  must come back before anything under it can (``!/data/``), and a line of ``.orchignore``
  cannot undo ``workspace.exclude``, read after it (the advice is then to take the pattern out
  of ``workspace.exclude``).
- ``explain_failure``: a failed job's reason that names a missing file (``FileNotFoundError``,
  ``No such file or directory``, ``can't open file``, the path quoted) which the laptop's
  workspace has but the rules left out: the file, the rule and the fix, read on the laptop
  (the server does not know the laptop's rules). The reason is untrusted server text; only a
  path inside the job's code folder (relative, or absolute under ``<job_dir>/code/``) is
  looked up, never one that leaves the workspace.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.sync.selection import EXCLUDE, IgnoreRules, Rule, Skipped

SIZE_BUDGET = 10_000  # directory entries the sizing of excluded folders may look at, in all (~10-30 ms)
SHOWN_RULES = 3
SHOWN_FOLDERS = 3
WIDTH = 74  # a summary line's most characters: with say's "orch: " it fits 80 columns
JUNK = frozenset({"__pycache__", ".DS_Store", ".ipynb_checkpoints", ".pytest_cache", ".mypy_cache"})
_SPECIAL = re.compile(r"([\\*?\[])")
_MISSING = re.compile(r"(?:No such file or directory: |can't open file |FileNotFoundError: [^'\"]{0,200}?)"
                      r"(['\"])(?P<path>[^'\"\n]{1,1000})\1")


def mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


def is_junk(rel: str) -> bool:
    """Caches and editor leftovers (``__pycache__/``, ``*.pyc``, ``.DS_Store``): left out on
    purpose everywhere, never worth a warning."""
    parts = rel.rstrip("/").split("/")
    return any(p in JUNK for p in parts) or parts[-1].endswith((".pyc", ".pyo", ".swp"))


# ---------------------------------------------------------------------------- the summary


@dataclass(frozen=True)
class RuleTotal:
    """What one rule left out. ``rule`` None: the rule could not be told (never expected)."""

    rule: Rule | None
    files: int
    bytes: int
    folders: int


@dataclass(frozen=True)
class Folder:
    """A folder holding what the rules left out: an excluded folder, or the folder of files
    excluded one by one."""

    path: str  # ends in "/"
    files: int
    bytes: int


@dataclass(frozen=True)
class Summary:
    """What the ignore rules left out of one selection. ``complete`` false: some excluded
    folders held more than the sizing looked at, so counts and bytes are lower bounds."""

    files: int
    bytes: int
    folders: int
    rules: tuple[RuleTotal, ...]  # the most bytes first
    largest: tuple[Folder, ...]  # the most bytes first, at most SHOWN_FOLDERS
    complete: bool

    def lines(self) -> list[str]:
        """A few lines, each at most ``WIDTH`` characters; none when nothing was left out."""
        if not self.rules:
            return []
        at_least = "" if self.complete else "at least "
        out = [f"left out by ignore rules: {at_least}{self.files} file(s), {mb(self.bytes)}"]
        for total in self.rules[:SHOWN_RULES]:
            inside = f", {total.folders} folder(s)" if total.folders else ""
            name = _cut(str(total.rule) if total.rule else "a rule", WIDTH - 44)
            out.append(_cut(f"  {name}: {total.files} file(s), {mb(total.bytes)}{inside}", WIDTH))
        if len(self.rules) > SHOWN_RULES:
            rest = self.rules[SHOWN_RULES:]
            out.append(f"  +{len(rest)} more rule(s): {sum(r.files for r in rest)} file(s), "
                       f"{mb(sum(r.bytes for r in rest))}")
        shown = [f"{_cut(f.path, 28)} {mb(f.bytes)}" for f in self.largest if f.bytes >= 0.05 * 2**20]
        if shown:
            out.append(_cut("  largest: " + ", ".join(shown), WIDTH))
        return out

    def as_json(self) -> dict[str, Any]:
        return {"files": self.files, "bytes": self.bytes, "folders": self.folders, "complete": self.complete,
                "rules": [{"rule": str(t.rule) if t.rule else None,
                           "source": t.rule.source if t.rule else None, "line": t.rule.line if t.rule else None,
                           "pattern": t.rule.pattern.strip() if t.rule else None,
                           "files": t.files, "bytes": t.bytes, "folders": t.folders} for t in self.rules],
                "largest": [{"path": f.path, "files": f.files, "bytes": f.bytes} for f in self.largest]}


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def folder_size(path: str, budget: int) -> tuple[int, int, int, bool]:
    """(files, bytes, entries looked at, complete) of the tree at ``path``: symlinks are not
    followed (a link counts as a file of size 0), unreadable folders count as empty, and the
    walk stops after ``budget`` entries."""
    files = size = seen = 0
    stack = [path]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    if seen >= budget:
                        return files, size, seen, False
                    seen += 1
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                            continue
                        files += 1
                        if entry.is_file(follow_symlinks=False):
                            size += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        except OSError:
            continue
    return files, size, seen, True


def summarize(root: Path, skipped: Skipped, budget: int = SIZE_BUDGET) -> Summary:
    """``skipped.excluded`` (from ``select_files``) counted per rule, excluded folders sized
    within ``budget`` entries in all: each folder gets an equal share of what is left, so one
    huge folder does not hide the rest."""
    rules = skipped.rules
    per_rule: dict[int | None, list[int]] = {}  # index -> [files, bytes, folders]
    by_folder: dict[str, list[int]] = {}  # folder -> [files, bytes]
    complete = True
    folders = [e for e in skipped.excluded if e.rel.endswith("/")]
    for e in skipped.excluded:
        if e.rel.endswith("/"):
            continue
        total = per_rule.setdefault(e.rule, [0, 0, 0])
        total[0] += 1
        total[1] += e.size
        parent = posixpath.dirname(e.rel)
        here = by_folder.setdefault(parent + "/" if parent else "./", [0, 0])
        here[0] += 1
        here[1] += e.size
    left = budget
    for n, e in enumerate(folders):
        files, size, seen, whole = folder_size(os.path.join(root, e.rel), left // (len(folders) - n))
        left -= seen
        complete = complete and whole
        total = per_rule.setdefault(e.rule, [0, 0, 0])
        total[0] += files
        total[1] += size
        total[2] += 1
        by_folder[e.rel] = [files, size]
    totals = sorted((RuleTotal(rules.rule(i) if rules else None, *t) for i, t in per_rule.items()),
                    key=lambda t: (-t.bytes, -t.files, str(t.rule)))
    largest = sorted((Folder(p, *v) for p, v in by_folder.items()), key=lambda f: (-f.bytes, f.path))
    return Summary(sum(t.files for t in totals), sum(t.bytes for t in totals), len(folders), tuple(totals),
                   tuple(largest[:SHOWN_FOLDERS]), complete)


# ---------------------------------------------------------------------------- one path


@dataclass(frozen=True)
class Exclusion:
    """Why ``rel`` is not synced: ``at`` (``rel`` itself, or the folder above it, ending in
    ``/``) is left out by ``rule`` (None: a ``.git`` folder, never synced). ``fix``: the
    ``.orchignore`` lines that bring ``rel`` back, tried; empty when none does."""

    rel: str
    at: str
    rule: Rule | None
    fix: tuple[str, ...]
    drop: tuple[str, ...] = ()  # patterns to take out of workspace.exclude first (no line can undo them)

    def cause(self) -> str:
        """``is excluded by .gitignore:6 '*.bin'``, or ``is not synced: its folder data/ is
        excluded by .gitignore:2 'data/'``."""
        if self.rule is None:
            return f"is not synced: it is in {self.at}, and a .git folder is never synced"
        if self.at.rstrip("/") == self.rel.rstrip("/"):
            return f"is excluded by {self.rule}"
        return f"is not synced: its folder {self.at} is excluded by {self.rule}"

    def remedy(self) -> str:
        """``add '!data/synth/*.bin' to .orchignore`` (or what to do when no line can)."""
        add = "add " + " and ".join(f"{line!r}" for line in self.fix) + " to .orchignore" if self.fix else ""
        if self.drop:
            take = "take " + " and ".join(f"{p.strip()!r}" for p in self.drop) + " out of workspace.exclude"
            return f"{take} and {add}" if add else take
        if add:
            return add
        if self.rule is not None:
            return f"change {self.rule}"
        return "keep it outside .git/"

    def text(self) -> str:
        """``data/synth/train.bin is excluded by .gitignore:6 '*.bin'; add '!data/synth/*.bin' to .orchignore``."""
        return f"{self.rel} {self.cause()}; {self.remedy()}"

    def as_json(self) -> dict[str, Any]:
        return {"path": self.rel, "excluded_at": self.at, "rule": str(self.rule) if self.rule else None,
                "fix": list(self.fix), "advice": self.remedy()}


def _blocker(rules: IgnoreRules, rel: str, is_dir: bool) -> tuple[str, int | None] | None:
    """Where the selection stops on the way to ``rel``, as ``select_files`` walks: the first
    folder above it that is left out (or ``.git``), else ``rel`` itself; None when selected."""
    parts = rel.split("/")
    for n in range(1, len(parts) + 1):
        sub = "/".join(parts[:n])
        folder = n < len(parts) or is_dir
        if folder and parts[n - 1] == ".git":
            return sub + "/", None
        index = rules.deciding(sub + "/" if folder else sub)
        if index is not None:
            return (sub + "/" if folder else sub), index
    return None


def _escape(path: str) -> str:
    """``path`` as a literal gitignore pattern after a ``!``: wildcards and backslashes
    escaped, a trailing space kept (every fix is tried before it is offered, so a name this
    misses gets no fix rather than a wrong one)."""
    out = _SPECIAL.sub(r"\\\1", path)
    if out.endswith(" "):
        out = out[:-1] + "\\ "
    return out


def _negation(at: str, rule: Rule | None) -> list[str]:
    """Candidate lines that bring ``at`` back, the one likely wanted first: a folder
    ``!data/synth/`` (a top-level one anchored, ``!/data/``); a file left out by a wildcard
    rule (``*.bin``) by its folder and extension (``!data/synth/*.bin``: its siblings come
    too), else by its name."""
    if at.endswith("/"):
        name = at[:-1]
        return [f"!{'/' if '/' not in name else ''}{_escape(name)}/"]
    parent, base = posixpath.split(at)
    lead = f"{_escape(parent)}/" if parent else "/"
    by_name = f"!{lead}{_escape(base)}"
    ext = posixpath.splitext(base)[1]
    if not ext or base == ext:
        return [by_name]
    by_ext = f"!{lead}*{_escape(ext)}"
    wildcard = rule is not None and bool(re.search(r"[*?\[]", rule.pattern))
    return [by_ext, by_name] if wildcard else [by_name, by_ext]


def why(rules: IgnoreRules, rel: str, is_dir: bool = False) -> Exclusion | None:
    """Why the POSIX path ``rel`` (under the rules' root) is not selected; None when it is.
    The fix is found by trying lines in ``.orchignore`` one obstacle at a time (at most one
    per path component), keeping only lines the rules then honour."""
    first = _blocker(rules, rel, is_dir)
    if first is None:
        return None
    at, index = first
    rule = rules.rule(index) if index is not None else None
    if index is None:
        return Exclusion(rel, at, None, ())
    fix: tuple[str, ...] = ()
    blocked: tuple[str, int | None] | None = first
    for _ in range(rel.count("/") + 2):
        assert blocked is not None
        for line in _negation(blocked[0], rules.rule(blocked[1])):
            after = _blocker(rules.with_lines(fix + (line,)), rel, is_dir)
            if after is None or after[0] != blocked[0]:  # this obstacle is gone: keep the line
                fix, blocked = fix + (line,), after
                break
        else:  # no line of .orchignore moves it: a rule of workspace.exclude (read last) holds it
            return _without_exclude(rules, rel, is_dir, at, rule, blocked[1])
        if blocked is None:
            return Exclusion(rel, at, rule, fix)
        if blocked[1] is None:  # a .git folder further down
            break
    return Exclusion(rel, at, rule, ())


def _without_exclude(rules: IgnoreRules, rel: str, is_dir: bool, at: str, rule: Rule | None,
                     index: int | None) -> Exclusion:
    """The advice when the obstacle is ``workspace.exclude``'s rule at ``index``: take it out,
    then whatever ``.orchignore`` lines the rest still needs."""
    blocking = rules.rule(index)
    if blocking is None or blocking.source != EXCLUDE:
        return Exclusion(rel, at, rule, ())
    kept = [p for n, p in enumerate(rules.exclude) if n != blocking.line]
    rest = why(IgnoreRules(rules.root, kept, rules.extra), rel, is_dir)
    if rest is None:
        return Exclusion(rel, at, rule, (), (blocking.pattern,))
    if rest.rule is None or (not rest.fix and not rest.drop):
        return Exclusion(rel, at, rule, ())
    return Exclusion(rel, at, rule, rest.fix, (blocking.pattern, *rest.drop))


def fix_for(exclusions: list[Exclusion]) -> tuple[str, ...]:
    """The lines that bring all of ``exclusions`` back, each once, in order."""
    return tuple(dict.fromkeys(line for e in exclusions for line in e.fix))


# ---------------------------------------------------------------------------- a failure


def missing_paths(reason: str) -> list[str]:
    """The quoted paths a failure reason says are missing, in order (untrusted text)."""
    return list(dict.fromkeys(m["path"] for m in _MISSING.finditer(reason or "")))


def code_relative(path: str, job_dir: str) -> str | None:
    """``path`` as the job saw it (relative to its code folder ``<job_dir>/code``, or absolute
    inside it) made relative to the workspace; None when it points elsewhere."""
    code = posixpath.normpath(posixpath.join(job_dir, "code")) if job_dir.startswith("/") else None
    if path.startswith("/"):
        if code is None:
            return None
        norm = posixpath.normpath(path)
        if not norm.startswith(code + "/"):
            return None
        path = norm[len(code) + 1:]
    rel = posixpath.normpath(path)
    if rel in (".", "") or rel == ".." or rel.startswith("../") or rel.startswith("/"):
        return None
    return rel


def explain_failure(reason: str, job_dir: str, root: Path, exclude: list[str]) -> Exclusion | None:
    """The first missing file of ``reason`` that the workspace ``root`` has on disk but the
    rules leave out, with the rule and the fix; None when no such file is named."""
    paths = [p for p in (code_relative(p, job_dir) for p in missing_paths(reason)) if p is not None]
    if not paths:
        return None
    rules: IgnoreRules | None = None
    for rel in paths:
        target = root / rel
        if not (target.exists() or target.is_symlink()):
            continue
        rules = rules or IgnoreRules(root, exclude)
        found = why(rules, rel, target.is_dir() and not target.is_symlink())
        if found is not None:
            return found
    return None


def explained_status(status: dict[str, Any], job_dir: str, spec_path: str) -> dict[str, Any]:
    """``status`` (a job's aggregated status) with a failure on a file the rules left out
    explained: ``reason`` begins with the file, the rule and the fix, and ``excluded`` holds
    them as data. Anything else, or a job file that no longer loads, leaves it as it is. The
    job file (``spec_path``, recorded at submit) is read only when the reason names a missing
    file, so statuses of other jobs never load it."""
    reason = status.get("reason")
    if status.get("state") != "failed" or not isinstance(reason, str) or "excluded" in status \
            or not missing_paths(reason):
        return status
    from orchestrator.errors import OrchError
    from orchestrator.spec.load import load_spec

    try:
        loaded = load_spec(spec_path)
        found = explain_failure(reason, job_dir, loaded.workspace_dir, loaded.spec.workspace.exclude)
    except (OrchError, OSError, ValueError):
        return status
    if found is None:
        return status
    return dict(status, reason=f"{found.text()} — {reason}", excluded=found.as_json())
