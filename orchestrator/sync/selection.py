"""Workspace sync: choose files and diff them against what the host recorded (sending is
``send.py``).

Promises: ``.git/`` is never sent; files are chosen with gitignore semantics from the
workspace's top-level ``.gitignore``, ``.orchignore`` and ``workspace.exclude``, read in that
order as one list of rules (the last rule that matches a path decides, so a ``!pattern`` of
``.orchignore`` brings back what ``.gitignore`` left out, and ``workspace.exclude`` has the last
word); a folder left out is never entered, so nothing under it comes back unless the folder
does; each path left out is recorded with the rule that left it out (``Skipped.excluded``); only
changed files move (a second sync with no change sends no file data); each file lands under
a temporary name and is renamed into place; a file deleted locally is deleted remotely only
if orch synced it earlier; a file edited on the server since the last sync is never
overwritten unless ``force``.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import settings
from orchestrator.errors import UsageError
from orchestrator.globs.match import Patterns
from orchestrator.globs.read import PatternError
from orchestrator.home import laptop_id
from orchestrator.state import runs
from remote_payload.contract.jobfolder import TEMP_PREFIX
from remote_payload.contract.protocol import tree_digest

SECRET_RE = re.compile(r"^(\.env(\..*)?|.*\.pem|.*\.key|id_(rsa|dsa|ecdsa|ed25519)|\.netrc|\.pypirc|credentials(\.json)?|.*\.p12)$")


@dataclass(frozen=True)
class LocalFile:
    rel: str
    size: int
    mtime_ns: int
    mode: int
    link: str | None = None


@dataclass
class SyncPlan:
    send: list[str] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    send_bytes: int = 0
    noop: bool = False  # nothing to send, delete or re-record: no round trip needed
    base: str | None = None  # the generation of the server's record this plan was made from
    recorded: dict[str, dict[str, Any]] = field(default_factory=dict)  # that record's files
    changed: dict[str, dict[str, Any]] = field(default_factory=dict)  # entries that differ from it
    # files the server holds the first bytes of (an interrupted sync): rel -> {offset, prefix, sha256}
    resume: dict[str, dict[str, Any]] = field(default_factory=dict)
    stage: str | None = None  # set the sent tree apart on the server under this token (a submit's code)
    stage_tree: bool = False  # send that tree itself, not its digest (the server's selection was another)

    def summary(self) -> str:
        """``3 changed file(s), 12.0 MB`` with what is resumed and deleted, for a person."""
        text = f"{len(self.send)} changed file(s), {self.send_bytes / 2**20:.1f} MB"
        if self.resume:
            held = sum(r["offset"] for r in self.resume.values())
            text += f" (the server holds {held / 2**20:.1f} MB more from an interrupted sync)"
        return text + (f", deleting {len(self.delete)}" if self.delete else "")

    def control(self) -> dict[str, Any]:
        """What ``.orch-sync.json`` says: the changes since ``base`` (or, without one, every
        entry) and the deletions; with ``stage``, the whole tree this sync means, each file
        by the hash the laptop knows (none yet for one this stream brings for the first time),
        for ``remote_payload/helper/stage.py`` — as its digest, which the server checks the
        tree it makes from its record and these changes against, or with ``stage_tree`` as
        the tree itself."""
        out: dict[str, Any] = {"delete": self.delete, "entries": self.entries} if self.base is None else \
            {"delete": self.delete, "base": self.base, "changed": self.changed}
        if self.stage is not None:
            tree = {rel: [e["sha256"] if e["link"] is None else None, e["link"]] for rel, e in self.entries.items()}
            out["stage"] = {"token": self.stage, "tree": tree} if self.stage_tree else \
                {"token": self.stage, "digest": tree_digest(tree)}
        return out


def project_name(workspace: Path) -> str:
    """The workspace's folder on a server: ``<folder name>-<8 hex>``, the hex from this
    laptop's id and the checkout's absolute path. Readable in VSCode, the same for every
    submit from one checkout (incremental sync), and never shared by two checkouts — two
    clones called ``train/`` on one laptop, or on two laptops, get folders of their own."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", workspace.name).strip(".-")[:40] or "workspace"
    key = hashlib.sha256(f"{laptop_id()}\0{os.path.realpath(workspace)}".encode()).hexdigest()[:8]
    return f"{name}-{key}"


IGNORE_FILES = (".gitignore", ".orchignore")  # read in this order, then workspace.exclude
EXCLUDE = "workspace.exclude"


@dataclass(frozen=True)
class Rule:
    """One line of the ignore rules: where it is written and what it says."""

    source: str  # ".gitignore", ".orchignore" or EXCLUDE
    line: int  # the file's line (from 1), or the item of workspace.exclude (from 0)
    pattern: str

    def __str__(self) -> str:
        """``.gitignore:6 '*.bin'``, ``workspace.exclude[0] 'data/raw/'``."""
        where = f"{self.source}[{self.line}]" if self.source == EXCLUDE else f"{self.source}:{self.line}"
        return f"{where} {self.pattern.strip()!r}"


class IgnoreRules:
    """The workspace's ignore rules compiled once: every line of ``.gitignore``, then of
    ``.orchignore`` (each the workspace's top-level file), then ``workspace.exclude``, as one
    gitignore list, matched in time linear in a path's length (``orchestrator/globs/``).
    ``extra``: lines read as if appended to ``.orchignore`` (to try a fix). ``rules[i]`` is
    the line at the patterns' index ``i`` (empty lines, which are dropped before counting,
    are left out of both). A line that is not a pattern raises ``UsageError`` naming it."""

    def __init__(self, root: Path, exclude: list[str], extra: tuple[str, ...] = ()) -> None:
        lines: list[str] = []
        rules: list[Rule] = []
        for name in IGNORE_FILES:
            path = root / name
            text = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []
            if name == ".orchignore":
                text += list(extra)
            numbered = [(n, line) for n, line in enumerate(text, start=1) if line]  # '' lines are no rule
            lines += [line for _, line in numbered]
            rules += [Rule(name, n, line) for n, line in numbered]
        lines += [pattern for pattern in exclude if pattern]
        rules += [Rule(EXCLUDE, n, pattern) for n, pattern in enumerate(exclude) if pattern]
        self.root, self.exclude, self.extra = root, list(exclude), extra
        self.rules: tuple[Rule, ...] = tuple(rules)
        try:
            self.patterns = Patterns(lines)
        except PatternError as exc:
            raise UsageError(f"{self.rule(exc.index)} is not a pattern: {exc.reason} — fix or remove that line") from None

    def rule(self, index: int | None) -> Rule | None:
        return self.rules[index] if index is not None and 0 <= index < len(self.rules) else None

    def deciding(self, path: str) -> int | None:
        """The index of the rule that leaves ``path`` out (a folder written with its trailing
        ``/``), or ``None`` when no rule does."""
        verdict = self.patterns.check(path)
        return verdict.index if verdict.matched else None

    def with_lines(self, extra: tuple[str, ...]) -> IgnoreRules:
        """These rules with ``extra`` appended to ``.orchignore`` (before ``workspace.exclude``)."""
        return IgnoreRules(self.root, self.exclude, self.extra + extra)


@dataclass(frozen=True)
class Excluded:
    """A path the ignore rules left out: a file (with its size), or a folder (``rel`` ending in
    ``/``, size 0: it is never entered) and the index of the rule that decided."""

    rel: str
    rule: int | None
    size: int = 0


@dataclass
class Skipped:
    """What ``select_files`` left out for a reason the user should hear about."""

    orch_dirs: list[str] = field(default_factory=list)    # folders orch wrote (fetch/plot): never synced
    unreadable: list[str] = field(default_factory=list)   # "path/ (reason)": folders that cannot be listed
    special: list[str] = field(default_factory=list)      # sockets, FIFOs, devices: not files
    excluded: list[Excluded] = field(default_factory=list)  # left out by an ignore rule, in walk order
    rules: IgnoreRules | None = None                      # the rules ``excluded`` indexes


def select_files(root: Path, exclude: list[str], skipped: Skipped | None = None) -> dict[str, LocalFile]:
    """The workspace files to sync, by POSIX relative path.

    Never ``.git/``, never a folder orch wrote itself (``runs.MARKER`` inside: fetched jobs,
    plots), never orch's own temporaries. A symlink — to a file or to a folder — is synced as
    a symlink (its target text), never followed. What is left out for a reason (orch's
    folders, folders that cannot be read, sockets and FIFOs) goes into ``skipped``. A file
    that cannot be read raises ``UsageError`` naming it: a job must not run without it
    unawares."""
    if not root.is_dir():
        raise UsageError(f"workspace {root} is not a folder")
    rules = IgnoreRules(root, exclude)
    match = rules.patterns.match
    notes = skipped if skipped is not None else Skipped()
    notes.rules = rules
    left_out = notes.excluded.append
    out: dict[str, LocalFile] = {}

    def unreadable(exc: OSError) -> None:
        rel = Path(exc.filename).relative_to(root).as_posix() if exc.filename else "?"
        notes.unreadable.append(f"{rel}/ ({exc.strerror or exc})")

    for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        kept = []
        for d in sorted(dirnames):
            rel = prefix + d
            if d == ".git":
                continue
            if match(rel + "/"):
                left_out(Excluded(rel + "/", rules.deciding(rel + "/")))
                continue
            full = os.path.join(dirpath, d)
            if os.path.islink(full):  # a symlink to a folder: synced as a link, like one to a file
                if not match(rel):
                    out[rel] = LocalFile(rel, 0, os.lstat(full).st_mtime_ns, 0o777, os.readlink(full))
                else:
                    left_out(Excluded(rel, rules.deciding(rel)))
                continue
            if runs.is_run_dir(Path(full)):
                notes.orch_dirs.append(rel + "/")
                continue
            kept.append(d)
        dirnames[:] = kept
        for name in sorted(filenames):
            rel = prefix + name
            if name.startswith((TEMP_PREFIX, ".orch-pull-")):  # orch's temporaries (--pull-remote-edits)
                continue
            full = f"{dirpath}/{name}"  # (os.path.join is measurably slower over thousands of files)
            if match(rel):  # only a file left out pays for its rule (a second match) and its size
                try:
                    left_out(Excluded(rel, rules.deciding(rel), os.lstat(full).st_size))
                except OSError:
                    pass
                continue
            try:
                st = os.lstat(full)
            except FileNotFoundError:
                continue  # deleted while we looked
            if stat.S_ISLNK(st.st_mode):
                out[rel] = LocalFile(rel, 0, st.st_mtime_ns, 0o777, os.readlink(full))
            elif stat.S_ISREG(st.st_mode):
                if not os.access(full, os.R_OK):
                    raise UsageError(f"cannot read {Path(root, rel)} (permission denied): make it readable "
                                     f"(chmod u+r) or leave it out of the sync in .orchignore")
                out[rel] = LocalFile(rel, st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode))
            else:
                notes.special.append(rel)
    return out


class Chosen:
    """One walk of a workspace (``select_files``), made when first asked for and shared by
    what one command does with it: ``orch submit``'s checks and its sync."""

    def __init__(self, root: Path, exclude: list[str]) -> None:
        self.root, self.exclude = root, list(exclude)
        self.skipped = Skipped()
        self._files: dict[str, LocalFile] | None = None

    def files(self) -> dict[str, LocalFile]:
        if self._files is None:
            self._files = select_files(self.root, self.exclude, self.skipped)
        return self._files


def warnings_for(files: dict[str, LocalFile], skipped: Skipped | None = None) -> list[str]:
    """Likely secrets, a too-large workspace, and what was skipped, each with a hint."""
    out = []
    secrets = [rel for rel in files if SECRET_RE.match(rel.rsplit("/", 1)[-1])]
    if secrets:
        out.append(f"these look like secrets and will be sent: {', '.join(secrets[:8])}"
                   " (add them to .orchignore to keep them on the laptop)")
    total = sum(f.size for f in files.values())
    if total > settings.LARGE_WORKSPACE.whole() << 20:
        big = sorted(files.values(), key=lambda f: -f.size)[:3]
        out.append(f"the workspace is {total / 2**20:.0f} MB; largest: "
                   + ", ".join(f"{f.rel} ({f.size / 2**20:.0f} MB)" for f in big)
                   + " — ignore data and checkpoints in .orchignore")
    outside = [f"{f.rel} -> {f.link}" for f in files.values()
               if f.link is not None and (f.link.startswith("/") or posixpath.normpath(
                   posixpath.join(posixpath.dirname(f.rel), f.link)).startswith(".."))]
    if outside:
        out.append(f"these symlinks point outside the workspace and are synced as links (they may dangle on the "
                   f"server): {few(outside)}")
    if skipped is not None and skipped.unreadable:
        out.append(f"not synced, cannot be read: {few(skipped.unreadable)} (fix the permissions, or .orchignore it)")
    if skipped is not None and skipped.special:
        out.append(f"not synced, not regular files (socket, FIFO or device): {few(skipped.special)}")
    return out


def few(items: list[str], n: int = 5) -> str:
    return ", ".join(items[:n]) + (f" (+{len(items) - n} more)" if len(items) > n else "")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def plan_sync(root: Path, files: dict[str, LocalFile], remote: dict[str, Any], force: bool,
              pulled: frozenset[str] = frozenset()) -> SyncPlan:
    """Decide what to send and delete from local stats and the host's record. Files edited
    on the server are refused unless ``force``, or unless they were just ``pulled`` (then the
    laptop's copy is the server's)."""
    recorded: dict[str, Any] = remote.get("files", {})
    edited = set(remote.get("edited", []))
    plan = SyncPlan()
    for rel, f in files.items():
        rec = recorded.get(rel)
        entry = {"size": f.size, "mtime_ns": f.mtime_ns, "mode": f.mode, "link": f.link}
        same_stat = rec is not None and all(rec.get(k) == entry[k] for k in entry)
        if same_stat:
            entry["sha256"] = rec.get("sha256")
        else:  # a new file is hashed while it is sent (the server records the hash of what arrived)
            entry["sha256"] = None if f.link is not None or rec is None else sha256_of(root / rel)
        unchanged = rec is not None and rec.get("sha256") == entry["sha256"] and rec.get("mode") == f.mode \
            and rec.get("link") == f.link
        plan.entries[rel] = entry
        if unchanged and rel not in remote.get("missing", []) and (rel not in edited or not force):
            continue
        plan.send.append(rel)
        plan.send_bytes += f.size
    plan.delete = sorted(rel for rel in recorded if rel not in files)
    generation = remote.get("generation")  # "" stands for "no record yet": every entry is a change
    plan.base = generation if isinstance(generation, str) else ("" if not recorded else None)
    plan.recorded = recorded
    sending = set(plan.send)
    plan.changed = {rel: entry for rel, entry in plan.entries.items()
                    if rel in sending or _laptop_fields(recorded[rel]) != entry}
    plan.noop = not plan.send and not plan.delete and not plan.changed
    _resumable(root, plan, remote.get("partial"))
    clobber = sorted(edited - pulled) if not force else []
    if clobber:
        raise UsageError(
            "these files were changed on the server since the last sync (the laptop's copy would replace them): "
            + ", ".join(clobber[:20]) + ("" if len(clobber) <= 20 else f" (+{len(clobber) - 20} more)")
            + "\nBring them to the laptop with --pull-remote-edits, or pass --force to overwrite them."
        )
    return plan


def same_as_record(files: dict[str, LocalFile], recorded: dict[str, Any]) -> bool:
    """True when ``files`` are exactly the record's files by what the laptop sees without
    reading them (path, size, mtime, mode, link): a sync would send, delete and re-record
    nothing (``plan_sync``'s ``noop``). A file touched but unchanged counts as changed here."""
    if len(files) != len(recorded):
        return False
    for rel, f in files.items():
        rec = recorded.get(rel)
        if not isinstance(rec, dict) or rec.get("size") != f.size or rec.get("mtime_ns") != f.mtime_ns \
                or rec.get("mode") != f.mode or rec.get("link") != f.link:
            return False
    return True


def _resumable(root: Path, plan: SyncPlan, partial: Any) -> None:
    """Fill ``plan.resume``: each file to send whose first bytes the server kept from an
    interrupted sync (hello's ``partial``: size and sha256, untrusted) and whose own first
    bytes hash the same; the file is hashed whole too (the server checks the joined file
    against it before it takes its name), and only the rest counts in ``send_bytes``."""
    sending = set(plan.send) if partial else set()
    for rel, held in (partial.items() if isinstance(partial, dict) else []):
        entry = plan.entries.get(rel)
        if rel not in sending or entry is None or entry["link"] is not None or not isinstance(held, dict):
            continue
        offset, prefix = held.get("size"), held.get("sha256")
        if not (isinstance(offset, int) and 0 < offset < entry["size"] and isinstance(prefix, str)):
            continue
        try:
            seen, whole = _hash_with_prefix(root / rel, offset)
        except OSError:
            continue
        if seen == prefix:
            plan.resume[rel] = {"offset": offset, "prefix": prefix, "sha256": whole}
            entry["sha256"] = whole
            plan.send_bytes -= offset


def _hash_with_prefix(path: Path, offset: int) -> tuple[str | None, str]:
    """(sha256 of the first ``offset`` bytes — None when the file is shorter —, sha256 of all)."""
    h, prefix, done = hashlib.sha256(), None, 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20 if prefix is not None else min(1 << 20, offset - done) or 1 << 20):
            h.update(block)
            done += len(block)
            if prefix is None and done == offset:
                prefix = h.copy().hexdigest()
    return prefix, h.hexdigest()


def _laptop_fields(entry: dict[str, Any]) -> dict[str, Any]:
    """A record entry without what only the server writes (its own size and mtime)."""
    return {k: v for k, v in entry.items() if k not in ("rsize", "rmtime_ns")}
