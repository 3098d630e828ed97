"""The newest complete checkpoint a job's own script wrote (standard library only): what
``{last_checkpoint}`` in ``launch.resume_args`` becomes (``attempt.py``).

Layouts looked for, breadth-first under the job folder (its ``code/`` included), ``SCAN_DEPTH``
levels of folders within ``jobdir/scan.py``'s bounds: no hidden folders, no folder links
followed (docs/own-script.md, "Resume"):

- Hugging Face ``Trainer``: ``checkpoint-N/``, complete when its ``trainer_state.json``
  (written after the model and optimizer) is whole JSON;
- accelerate's ``save_state``: ``step_N/`` and ``epoch_N/`` (the ``no_trainer`` examples'
  ``--checkpointing_steps``), ``checkpoint_N/`` (``automatic_checkpoint_naming``): a folder
  holding any file save_state writes (``model.safetensors``, ``pytorch_model.bin``,
  ``optimizer.bin``, ``scheduler.bin``, ...) is complete only when ``random_states_0.pkl``
  (written after the model, optimizer, scheduler and sampler states) is whole;
- torchtune: ``epoch_N/`` (and ``step_N/``) holding weights of other names
  (``model-00001-of-00002.safetensors``, ``adapter_model.safetensors``), complete when they
  are (below);
- Lightning: ``*.ckpt`` files (``last.ckpt``, ``last-v1.ckpt``, ``epoch=E-step=S.ckpt``);
- nanoGPT: ``ckpt.pt`` (also ``ckpt.pth``, ``checkpoint.pt``, ``checkpoint.pth``).

Complete, for every layout: no file in the folder has a temporary name (``*.tmp``, ``*.part``,
``tmp*``, …); every weights file is whole — a safetensors file exactly as long as its header
says, a zip (what ``torch.save`` writes: ``.pt``, ``.pth``, ``.bin``, ``.ckpt``) ending in its
end-of-central-directory record, never an empty file; every shard of a ``-0000K-of-0000N``
set and every file an ``*.index.json`` names is there; a folder of none of the named kinds
holds at least one weights file.

Newest: among numbered folders side by side, the highest number (what Trainer, accelerate and
torchtune pick themselves); among ``.ckpt`` files in one folder, the newest ``last*.ckpt`` by
modification time (Lightning's own ``ckpt_path="last"``), else the highest ``step=S``, else the
newest; across folders and layouts, the most recently written. A torn or partial one is never
chosen: the next complete one is.

Contract: never raises; reads only headers and tails of files (bounded).
"""

from __future__ import annotations

import json
import os
import re
import struct
from typing import Dict, List, NamedTuple, Optional, Tuple

from remote_payload.jobdir import scan

SCAN_DEPTH = 5  # levels of folders looked in: code/lightning_logs/version_0/checkpoints/ is the fifth
FOLDER_ENTRIES = 2000  # entries of one checkpoint folder looked at
JSON_BYTES = 32 << 20  # a trainer_state.json or index larger than this is judged by its last byte
SAFETENSORS_HEADER = 100 << 20
ZIP_TAIL = 65536 + 22  # the end-of-central-directory record and the longest comment

_NUMBERED = re.compile(r"^(checkpoint-|checkpoint_|step_|epoch_)(\d+)$")
_SINGLE = ("ckpt.pt", "ckpt.pth", "checkpoint.pt", "checkpoint.pth")
_LAST = re.compile(r"^last(-v\d+)?\.ckpt$")
_STEP = re.compile(r"(?:^|[-_])step=(\d+)")
_TEMP = re.compile(r"(^\.?tmp)|(\.(tmp|temp|part|partial|incomplete)$)|~$", re.IGNORECASE)
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
_SHARD = re.compile(r"^(.*)-(\d+)-of-(\d+)(\.[a-z]+)$")
ACCELERATE_MARK = "random_states_0.pkl"
# The files accelerate's save_state writes (a folder holding any is accelerate's, whatever else it holds)
_ACCELERATE = re.compile(r"^(model(_\d+)?\.safetensors|pytorch_model(_\d+)?\.bin|"
                         r"(optimizer|scheduler|sampler|dl_state_dict)(_\d+)?\.bin|scaler\.pt|"
                         r"(random_states|custom_checkpoint)_\d+\.pkl)$")
TRAINER_MARK = "trainer_state.json"

# The layouts, as docs and log lines name them.
KINDS = {"checkpoint-": "Hugging Face checkpoint-N/", "checkpoint_": "accelerate checkpoint_N/",
         "step_": "step_N/", "epoch_": "epoch_N/", ".ckpt": "Lightning .ckpt", "single": "ckpt.pt"}
LOOKED_FOR = "checkpoint-N/, step_N/, epoch_N/, checkpoint_N/, *.ckpt, ckpt.pt"


class Found(NamedTuple):
    """A complete checkpoint: its ``path`` (a folder or a file), the layout (a ``KINDS``
    key) and when it was written (the newest modification time of what makes it complete)."""

    path: str
    kind: str
    mtime: float


def find(root: str) -> Optional[Found]:
    """The newest complete checkpoint under ``root`` (module docstring), or None."""
    try:
        groups = _scan(root)
    except Exception:  # noqa: BLE001 - a look for checkpoints must never fail the supervisor
        return None
    best: Optional[Found] = None
    for (folder, kind), names in sorted(groups.items()):
        try:
            pick = _pick(folder, kind, names)
        except Exception:  # noqa: BLE001
            pick = None
        if pick is not None and (best is None or pick.mtime > best.mtime):
            best = pick
    return best


def _scan(root: str) -> Dict[Tuple[str, str], List[str]]:
    """(folder, kind) -> the candidate names in that folder (a numbered folder is not entered)."""
    groups: Dict[Tuple[str, str], List[str]] = {}
    for folder, entries in scan.folders(root, SCAN_DEPTH, enter=lambda e: not _NUMBERED.match(e.name)):
        for entry in entries:
            name = entry.name
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            m = _NUMBERED.match(name) if is_dir else None
            if m:
                groups.setdefault((folder, m.group(1)), []).append(name)
            elif name.endswith(".ckpt") and not is_dir:
                groups.setdefault((folder, ".ckpt"), []).append(name)
            elif name in _SINGLE and not is_dir:
                groups.setdefault((folder, "single"), []).append(name)
    return groups


def _pick(folder: str, kind: str, names: List[str]) -> Optional[Found]:
    """The newest complete one of ``names`` (all of ``kind``, side by side in ``folder``)."""
    if kind in ("checkpoint-", "checkpoint_", "step_", "epoch_"):
        for name in sorted(names, key=lambda n: int(_NUMBERED.match(n).group(2)), reverse=True):  # type: ignore[union-attr]
            mtime = folder_complete(os.path.join(folder, name), kind)
            if mtime is not None:
                return Found(os.path.join(folder, name), kind, mtime)
        return None
    whole = []
    for name in names:
        path = os.path.join(folder, name)
        if file_complete(path):
            try:
                whole.append((name, os.stat(path).st_mtime))
            except OSError:
                continue
    if not whole:
        return None
    last = [w for w in whole if _LAST.match(w[0])]
    stepped = [(int(m.group(1)), w[1], w[0]) for w in whole for m in [_STEP.search(w[0])] if m]
    if kind == ".ckpt" and not last and stepped:
        _, mtime, name = max(stepped)
    else:
        name, mtime = max(last or whole, key=lambda w: (w[1], w[0]))
    return Found(os.path.join(folder, name), kind, mtime)


def folder_complete(path: str, kind: str) -> Optional[float]:
    """When the checkpoint folder ``path`` of ``kind`` was completed (its newest file's
    modification time), or None when it is not complete (module docstring)."""
    try:
        with os.scandir(path) as it:
            entries = [e for _, e in zip(range(FOLDER_ENTRIES), it)]
        files = {e.name: e.stat().st_mtime for e in entries if e.is_file()}
    except OSError:
        return None
    if any(_TEMP.search(e.name) for e in entries):
        return None
    if kind == "checkpoint-":
        if TRAINER_MARK not in files or not file_complete(os.path.join(path, TRAINER_MARK)):
            return None
    elif any(_ACCELERATE.match(n) for n in files):  # accelerate's: complete once its last file is
        if ACCELERATE_MARK not in files or not file_complete(os.path.join(path, ACCELERATE_MARK)):
            return None
    elif not any(n.endswith(_WEIGHTS) for n in files):
        return None
    for name in files:
        if (name.endswith(_WEIGHTS) or name.endswith(".index.json")) and not file_complete(os.path.join(path, name)):
            return None
    if not _shards_whole(path, set(files)):
        return None
    return max(files.values()) if files else None


def _shards_whole(path: str, names: set) -> bool:
    """Every shard of each ``-0000K-of-0000N`` set, and every file an index names, is there."""
    sets: Dict[Tuple[str, str, str], set] = {}
    for name in names:
        m = _SHARD.match(name)
        if m:
            sets.setdefault((m.group(1), m.group(3), m.group(4)), set()).add(int(m.group(2)))
    for (_, total, _), have in sets.items():
        if not set(range(1, int(total) + 1)) <= have:
            return False
    for name in names:
        if name.endswith(".index.json"):
            data = _json(os.path.join(path, name))
            wanted = data.get("weight_map") if isinstance(data, dict) else None
            if isinstance(wanted, dict) and not {str(v) for v in wanted.values()} <= names:
                return False
    return True


def file_complete(path: str) -> bool:
    """True when the file at ``path`` (a link followed) is whole as far as its format tells:
    never an empty file; safetensors as long as its header says; a zip (``torch.save``) with
    its end record; another ``.pkl`` ending in pickle's STOP opcode; JSON that parses."""
    try:
        size = os.stat(path).st_size
        if size == 0:
            return False
        with open(path, "rb") as f:
            head = f.read(8)
            if path.endswith(".safetensors"):
                return _safetensors_whole(f, head, size)
            if path.endswith(".json"):
                return _json(path) is not None if size <= JSON_BYTES else _last_byte(f, size) in (b"}", b"\n")
            if head[:4] == b"PK\x03\x04":  # torch.save's format (accelerate's random_states_N.pkl too)
                return _zip_whole(f, size)
            if path.endswith(".pkl"):
                return _last_byte(f, size) == b"."
            return True  # a format without an end to check (torch's legacy pickle): not empty is all
    except OSError:
        return False


def _last_byte(f, size: int) -> bytes:
    f.seek(size - 1)
    return f.read(1)


def _safetensors_whole(f, head: bytes, size: int) -> bool:
    if len(head) < 8:
        return False
    (length,) = struct.unpack("<Q", head)
    if length > SAFETENSORS_HEADER or 8 + length > size:
        return False
    try:
        header = json.loads(f.read(length).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return False
    if not isinstance(header, dict):
        return False
    end = 0
    for key, value in header.items():
        offsets = value.get("data_offsets") if isinstance(value, dict) and key != "__metadata__" else None
        if isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets):
            end = max(end, offsets[1])
    return size == 8 + length + end


def _zip_whole(f, size: int) -> bool:
    """The zip's end-of-central-directory record ends the file (with its comment)."""
    start = max(0, size - ZIP_TAIL)
    f.seek(start)
    tail = f.read(size - start)
    at = tail.rfind(b"PK\x05\x06")
    while at >= 0:
        if at + 22 <= len(tail):
            (comment,) = struct.unpack("<H", tail[at + 20:at + 22])
            if at + 22 + comment == len(tail):
                return True
        at = tail.rfind(b"PK\x05\x06", 0, at)
    return False


def _json(path: str) -> Optional[object]:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read(JSON_BYTES).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
