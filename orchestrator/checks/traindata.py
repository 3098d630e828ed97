"""The built-in trainer's workspace inputs, checked on the laptop: will the server find them?

``train_inputs`` (called by ``checks/laptop.py``'s ``laptop_report``) looks at the relative paths a
``train:`` section reads from the job's code snapshot — ``data.train``, ``data.eval``, every
``data.mix[i].train`` / ``eval``, and the module file of ``data.transform`` (``pkg.mod:fn`` needs
``pkg/mod.py`` or ``pkg/mod/__init__.py``; nothing of it is imported here) — and returns
``(errors, warnings)``, each ``file:line:col: train.data....: why``:

- a path that is in the workspace but left out by an ignore rule is an error (the rule and the
  ``.orchignore`` line that brings it back, ``sync/excluded.py``);
- a ``data.mix`` file or the transform's module that is not in the workspace at all is an error
  (did-you-mean for a near name);
- a ``data.train`` / ``data.eval`` that is not in the workspace is a warning (as before these
  checks: the trainer says so at start);
- absolute, ``~`` and ``$`` paths (only the server has them) and names the job's ``setup`` mentions
  (it may make them) are never flagged.

Weights, formats and the ``module:function`` form are the schema's (``TrainConfig``, exit 2 with
the field's line from ``spec/load.py``).
"""

from __future__ import annotations

import difflib
import posixpath
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.spec.load import LoadedSpec
from orchestrator.sync import excluded
from orchestrator.sync.selection import Chosen


@dataclass(frozen=True)
class Input:
    """One workspace input of the trainer: the key of its field, how to name it, the candidate files."""

    key: tuple[str | int, ...]
    field: str
    names: tuple[str, ...]  # relative paths, any of which will do (a module: its .py or its package)
    strict: bool  # missing from the workspace is an error (else a warning)


def inputs(loaded: LoadedSpec) -> list[Input]:
    """The relative workspace paths of ``loaded``'s ``train:`` section (see the module contract)."""
    train = loaded.spec.train
    if train is None:
        return []
    d = train.data
    found = [Input(("train", "data", k), f"train.data.{k}", (v,), False) for k, v in (("train", d.train), ("eval", d.eval)) if v]
    for i, m in enumerate(d.mix or []):
        found += [Input(("train", "data", "mix", i, k), f"train.data.mix[{i}].{k}", (v,), True)
                  for k, v in (("train", m.train), ("eval", m.eval)) if v]
    if d.transform:
        base = d.transform.partition(":")[0].replace(".", "/")
        found.append(Input(("train", "data", "transform"), "train.data.transform", (f"{base}.py", f"{base}/__init__.py"), True))
    return [i for i in found if not any(n.startswith(("/", "~")) or "$" in n for n in i.names)]


def train_inputs(loaded: LoadedSpec, chosen: Callable[[], Chosen]) -> tuple[list[str], list[str]]:
    """(errors, warnings) for the trainer's workspace inputs; ``chosen`` walks the workspace (once, if needed)."""
    wanted = [i for i in inputs(loaded) if not any(posixpath.basename(n) in (loaded.spec.setup or "") for n in i.names)]
    if not wanted:
        return [], []
    selection = chosen()
    files = set(selection.files())
    rules = selection.skipped.rules
    assert rules is not None
    root = loaded.workspace_dir
    errors, warnings = [], []
    for item in wanted:
        names = [posixpath.normpath(n) for n in item.names]
        if any(n in files for n in names) or any(n in (".", "..") or n.startswith("../") for n in names):
            continue
        where = f"{loaded.locate(item.key)}: {item.field}"
        there = [n for n in names if (root / n).exists() or (root / n).is_symlink()]
        why = excluded.why(rules, there[0], (root / there[0]).is_dir()) if there else None
        if why is not None:
            errors.append(f"{where}: {why.text()}")
            continue
        if there:
            continue  # there, and not left out by a rule: synced unless it is something the sync skips itself
        close = difflib.get_close_matches(names[0], sorted(files), n=1, cutoff=0.7)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        what = " or ".join(names)
        if item.strict:
            errors.append(f"{where}: {what} is not in the workspace {root}{hint}")
        else:
            warnings.append(f"{where}: {what} is not in the workspace {root}{hint}: the trainer will not find it "
                            "unless the job makes it")
    return errors, warnings
