"""A job folder as both sides see it: the names they rely on (and the supervisor's script inside
a shipped payload), JSON files written whole and read as untrusted, and the one sha256 helper.

Standard library only (Python >= 3.8): the laptop imports this, and so does the supervisor,
which runs before a job's setup step has installed anything.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Optional

CODE_DIR = "code"  # the job's working directory: the workspace snapshot, plus what the job writes there
SNAPSHOT = "snapshot.json"  # what the snapshot held at launch: {"files": {rel: {"size", "mtime_ns"}}}
SKIP_DIRS = ("__pycache__",)  # written by python itself in the working directory, never an output
HASHES = ".hashes.json"  # a cache of sha256 by (path, size, mtime_ns) for live manifests and move listings
SUPERVISOR_SCRIPT = ("remote_payload", "supervisor", "supervisor.py")  # under <root>/payload/<hash>/
AWAITING_FETCH = ".awaiting-fetch"  # on_finish.shutdown: the records are done, the supervisor waits for a fetch
STATUS_RESERVE = ".status.reserve"  # room the supervisor keeps for its terminal status on a full disk
NOT_LISTED = ("manifest.json", "status.json", "job.json", ".fetched", AWAITING_FETCH, HASHES, SNAPSHOT,
              STATUS_RESERVE)
DEEPSPEED_HOSTFILE = "deepspeed_hostfile"  # a multi-node deepspeed job's nodes, written by each node's supervisor
FREE_PORT = "@free-port@"  # in a plan's argv: a TCP port free on the node, picked by its supervisor at start
PROGRESS_GROUPS = ("step", "loss", "total_steps", "epoch", "lr", "eval_loss", "tokens_per_s")  # launch.progress's
BASH_ENV = "bash_env.sh"  # what BASH_ENV names in a job: the job's front of PATH after a login shell
TEMP_PREFIX = ".orch-tmp-"  # a temporary orch keeps beside a file it writes: never listed, moved or fetched
NAME_MAX = 255  # bytes in one file name on the file systems of Linux and macOS
# What orch itself writes into a job folder beside NOT_LISTED (the names a manifest may list that
# no job wrote): its records, its logs, the metrics, the trainer config, the setup script, a
# move's history, a Slurm job's script, record and cancel mark, the BASH_ENV file and a deepspeed
# hostfile (supervisor/environment.py, supervisor/launchers.py). Top-level names starting with
# "." are orch's too (markers, a move's staging).
ORCH_WRITTEN = ("repro", "logs", "metrics.jsonl", "train.json", "setup.sh", "moves.json", "slurm.sh", "slurm.json",
                "cancel.requested", BASH_ENV, DEEPSPEED_HOSTFILE)


def temp_name(name: str, suffix: str = "", name_max: int = NAME_MAX) -> str:
    """The name of the temporary that becomes ``name`` (same folder, renamed into place once
    complete): ``name + suffix`` when a ``suffix`` is given and that fits in ``name_max``
    bytes, else ``.orch-tmp-<16 hex of name's sha256>`` + ``suffix`` — a name of fixed length,
    so a temporary fits wherever its final name fits, and the same for the same name (a cut
    transfer finds its partial again)."""
    raw = name.encode("utf-8", "surrogateescape")
    if suffix and len(raw) + len(suffix.encode("utf-8")) <= name_max:
        return name + suffix
    return TEMP_PREFIX + hashlib.sha256(raw).hexdigest()[:16] + suffix


def part_rel(rel: str, suffix: str) -> str:
    """``temp_name`` of the file at relative path ``rel``, as a relative path (same folder)."""
    folder, _, name = rel.rpartition("/")
    return (folder + "/" if folder else "") + temp_name(name, suffix)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 20)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` so a reader sees the old or the new file, never half of one; when the
    write fails (a full disk) the error is raised and no temporary is left behind."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_json(path: str, data: Any, compact: bool = False) -> None:
    """``data`` as JSON, written as ``atomic_write_text`` writes: indented for the small files
    people read (status, job), ``compact`` for records of many entries (a sync record, a
    manifest: json's C encoder serves only unindented output, ~10x faster)."""
    text = json.dumps(data, separators=(",", ":"), sort_keys=True) if compact \
        else json.dumps(data, indent=1, sort_keys=True)
    atomic_write_text(path, text)


def read_json(path: str) -> Optional[Any]:
    """The parsed file, or None when it is missing or not valid JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
