"""The code a submit sent, set apart on the server before anything else can sync.

A submit's last ``receive`` (``workspace.receive``) ends, still holding the workspace's lease,
by hard-linking the submit's own tree into ``<root>/staged/<token>/``: every path of the
laptop's ``tree`` (``{rel: [sha256 or null, link or null]}``, the whole selection of that
submit), each one verified — a file that arrived in this stream by the hash of what arrived, one
that did not by the hash the laptop expects (the record's hash, trusted while the file's size and
mtime are the ones recorded; else the file is hashed), a symlink by its target. A path that
differs (another submit of the same workspace replaced it after this one planned its sync) stages
nothing: its name comes back in ``differ`` and the laptop sends it again. The launch takes the
staged tree as the job's ``code/`` (``take``), so what a job runs is exactly what its submit
sent, whatever syncs after.

The laptop sends the tree's digest (``contract/protocol.py``: ``tree_digest``), not the tree
(200 KB for 2000 files): the receive's own selection — the record it found with the stream's
changes and deletions put in — is that tree when the digests agree, as they do when no other
sync moved the record since the laptop planned. When they do not, nothing is staged and the
answer is ``{"stale": true}``: the laptop sends the tree itself in its next round. A resubmit
that changed nothing is staged from the server's own record instead, in its ``hello``
(``from_record``): no receive at all. Standard library only.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from typing import Any, Callable, Dict, List, Optional, Set

from remote_payload.contract.jobfolder import sha256_file
from remote_payload.contract.protocol import tree_digest
from remote_payload.helper import workspace
from remote_payload.helper.workspace import Finish, link_tree, tree_files, safe_join
from remote_payload.jobdir import lease

STALE_S = 24 * 3600.0  # a staged tree no launch took (an interrupted submit's) is removed after this


class StageError(Exception):
    pass


def staged_dir(root: str, token: str) -> str:
    """``<root>/staged/<token>``; ``StageError`` for a token that is not one plain name."""
    if not token or len(token) > 200 or token.startswith(".") or any(c in token for c in "/\\\x00"):
        raise StageError("bad stage token %r" % token[:80])
    return os.path.join(root, "staged", token)


Progress = Callable[[], None]


def finisher(root: str, ws: str) -> Finish:
    """What ``workspace.receive`` runs last, under its lease: stage the control's ``stage``
    request, if it has one (``{"stage": <stage's answer>}``, else nothing)."""

    def finish(control: Dict[str, Any], record: Dict[str, Any], received: Dict[str, str],
               progress: Progress) -> Dict[str, Any]:
        if control.get("stage") is None:
            return {}
        return {"stage": stage(root, ws, control["stage"], record, received, progress, control["entries"])}

    return finish


def stage(root: str, ws: str, request: Any, record: Dict[str, Any], received: Dict[str, str],
          progress: Progress, entries: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Stage ``request["tree"]`` of workspace ``ws`` as ``request["token"]`` (see the module
    docstring) — or, for a request with ``digest`` instead, the tree of ``entries`` (the
    receive's whole selection: its record with the stream's changes) when its digest is that
    one. The caller holds the workspace's lease; ``record`` is the sync record just
    written, ``received`` the hash of each file that arrived in this stream; ``progress`` is
    the lease's sign of life, given per file. Returns ``{"staged": n}``,
    ``{"differ": [rel, ...]}`` or ``{"stale": true}``, the last two with nothing staged."""
    if not isinstance(request, dict) or not isinstance(request.get("token"), str):
        raise StageError("malformed stage request")
    if isinstance(request.get("digest"), str) and request.get("tree") is None:
        tree = tree_of(entries or {})
        if tree_digest(tree) != request["digest"]:
            return {"stale": True}
        request = {"token": request["token"], "tree": tree}
    if not isinstance(request.get("tree"), dict):
        raise StageError("malformed stage request")
    final = staged_dir(root, request["token"])
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    _remove_stale(parent)
    tmp = os.path.join(parent, ".tmp-%s-%d" % (request["token"], os.getpid()))
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    differ: List[str] = []
    made = {tmp}  # folders of the staged tree made so far (one mkdir per folder, not per file)
    try:
        for rel, want in request["tree"].items():
            if not _link_verified(ws, tmp, rel, want, record.get(rel), received.get(rel), made):
                differ.append(rel)
            progress()
        if differ:
            return {"differ": sorted(differ)}
        shutil.rmtree(final, ignore_errors=True)  # an earlier round's, or an interrupted submit's under this token
        os.rename(tmp, final)
        return {"staged": len(request["tree"])}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def from_record(root: str, project: str, request: Any) -> Dict[str, Any]:
    """Stage ``request["token"]`` from the workspace's own record, for a submit whose laptop
    found its whole selection to be exactly the record of generation ``request["generation"]``
    (a resubmit with no change: ``hello`` asks, and no ``receive`` is needed). The tree is the
    record's files, each verified as ``stage`` verifies one that did not arrive (its recorded
    hash, trusted while its size and mtime are the recorded ones, else hashed). Under the
    workspace's lease, taken only when free. Answers ``stage``'s answer, ``{"busy": true}``
    (a receive holds the lease) or ``{"stale": true}`` (the record is another generation):
    the laptop then syncs and stages as usual."""
    if not isinstance(request, dict) or not isinstance(request.get("token"), str) \
            or not isinstance(request.get("generation"), str):
        raise StageError("malformed stage request")
    if workspace.whole_record(root, project).get("generation") != request["generation"]:
        return {"stale": True}
    try:
        held = lease.acquire(workspace.record_lock(root, project), "stage " + project, max_wait_s=0)
    except lease.LeaseBusy:
        return {"busy": True}
    try:
        whole = workspace.whole_record(root, project)  # again, under the lease
        files = whole.get("files")
        if whole.get("generation") != request["generation"] or not isinstance(files, dict):
            return {"stale": True}
        return stage(root, workspace.workspace_dir(root, project), {"token": request["token"], "tree": tree_of(files)},
                     files, {}, held.progress)
    finally:
        held.release()


def tree_of(entries: Dict[str, Any]) -> Dict[str, Any]:
    """The staged tree that record entries mean: ``{rel: [sha256 or None, link or None]}``
    (a symlink by its target alone), as the laptop writes it (``SyncPlan.control``)."""
    return {rel: [e.get("sha256") if e.get("link") is None else None, e.get("link")]
            for rel, e in entries.items() if isinstance(e, dict)}


def _link_verified(ws: str, dest: str, rel: str, want: Any, recorded: Optional[Dict[str, Any]],
                   arrived: Optional[str], made: Set[str]) -> bool:
    """Link ``ws/rel`` into ``dest/rel`` (a symlink is copied as a link) and check the linked
    copy is the one the laptop means; False (and nothing kept) when it is not there or differs."""
    if not (isinstance(want, list) and len(want) == 2):
        raise StageError("malformed stage entry for %r" % rel[:200])
    sha, link = want
    src = safe_join(ws, rel)  # checks rel once for both
    dst = os.path.join(dest, rel)
    folder = os.path.dirname(dst)
    if folder not in made:
        os.makedirs(folder, exist_ok=True)
        made.add(folder)
    if link is not None:
        try:
            target = os.readlink(src)
        except OSError:
            return False
        if target != link:
            return False
        os.symlink(target, dst)
        return True
    try:  # the entry itself, never a symlink's target: checked below through the link (the inode this job keeps)
        os.link(src, dst, follow_symlinks=False)
    except OSError:  # gone, or a folder
        return False
    st = os.lstat(dst)
    if not stat.S_ISREG(st.st_mode):  # a symlink (or a device, a fifo) where the laptop has a file
        os.unlink(dst)
        return False
    if arrived is not None and sha in (None, arrived) and _as_recorded(st, recorded, arrived):
        return True  # written by this very stream under the lease this caller holds
    if sha is None:
        ok = False  # a file this stream was to bring that did not come (it vanished on the laptop)
    elif _as_recorded(st, recorded, sha):
        ok = True
    else:
        ok = sha256_file(dst) == sha
    if not ok:
        os.unlink(dst)
    return ok


def _as_recorded(st: os.stat_result, recorded: Optional[Dict[str, Any]], sha: str) -> bool:
    """The record says this file holds ``sha`` and it has not been touched since it was written."""
    return isinstance(recorded, dict) and recorded.get("sha256") == sha \
        and st.st_size == recorded.get("rsize") and st.st_mtime_ns == recorded.get("rmtime_ns")


def _remove_stale(parent: str) -> None:
    """Remove staged trees (and temporaries) older than ``STALE_S``: no launch will take them."""
    now = time.time()
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        path = os.path.join(parent, name)
        try:
            if now - os.lstat(path).st_mtime > STALE_S:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def take(root: str, token: str, code_dir: str, last: bool) -> List[str]:
    """Make the staged tree ``token`` the job's ``code_dir``: moved there when this is its
    ``last`` launch, else hard-linked (a sweep launches several jobs from one sync). Returns the
    relative paths. ``StageError`` when there is no such tree (cleaned away, or never staged)."""
    src = staged_dir(root, token)
    if not os.path.isdir(src):
        raise StageError("the code this submit sent is not staged on this host any more (%s): nothing was "
                         "started; run the same orch submit again" % src)
    if not last:
        return link_tree(src, code_dir)
    os.rename(src, code_dir)
    return tree_files(code_dir)


def discard(root: str, token: str) -> None:
    """Remove the staged tree ``token`` (its job had started already); nothing if there is none."""
    try:
        shutil.rmtree(staged_dir(root, token), ignore_errors=True)
    except StageError:
        pass
