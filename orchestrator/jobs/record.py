"""What the laptop records about a submission, for ``orch show`` and ``orch rerun``:
the spec as written and as resolved, and the workspace's git commit and uncommitted diff."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from orchestrator.spec.load import LoadedSpec

MAX_DIFF_BYTES = 1 << 20


def _git(workspace: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(workspace), *args], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.decode("utf-8", "replace") if proc.returncode == 0 else None


def git_state(workspace: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(commit, branch, dirty files) and the ``git diff HEAD`` of the workspace; (None,
    None) outside a git repository or without git."""
    commit = _git(workspace, "rev-parse", "HEAD")
    if commit is None:
        return None, None
    status = _git(workspace, "status", "--porcelain", "--", ".") or ""
    diff = _git(workspace, "diff", "HEAD", "--", ".") or ""
    if len(diff) > MAX_DIFF_BYTES:
        diff = diff[:MAX_DIFF_BYTES] + "\n[orch: diff cut at 1 MiB]\n"
    info = {"commit": commit.strip(), "branch": (_git(workspace, "rev-parse", "--abbrev-ref", "HEAD") or "").strip(),
            "dirty": [line[3:] for line in status.splitlines()]}
    return info, diff


def record(loaded: LoadedSpec, git_info: tuple[dict[str, Any] | None, str | None] | None = None) -> dict[str, Any]:
    """What the job's ``repro/`` keeps from the laptop. ``git_info``: ``git_state`` already
    read for this workspace (a sweep's jobs share one), else it is read now."""
    git, diff = git_info if git_info is not None else git_state(loaded.workspace_dir)
    return {"spec_text": loaded.text, "spec_resolved": loaded.spec.model_dump(mode="json"),
            "git": git, "git_diff": diff}
