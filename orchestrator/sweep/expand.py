"""Sweeps and overrides: one job file -> one validated job per combination (docs/sweeps.md).

Pure but for reading nothing: ``expand`` takes the loaded job file, the sweep's axes (the
file's ``sweep:`` block, with ``orch submit --sweep KEY=...`` adding keys or replacing their
values) and overrides that apply to every job (``--priority N`` is ``launch.priority``), and
returns one ``Combination`` per element of the axes' product (the first key varies slowest),
numbered from 1.

Contracts:

- every combination is validated as a whole ``JobSpec`` with its values applied, before
  anything connects; all failures are reported together as ``SpecError`` (exit 2), each line
  ``WHERE: combination N (key=value, ...): field: message`` where WHERE is the value's
  ``file:line:col`` in the ``sweep:`` block, or the flag that gave it (``--sweep train.lr``);
  a failure every combination shares is one line, ``WHERE: every combination: ...``;
- ``hosts:`` is a pool (``pool``, from ``--hosts``, replaces it): the combinations submitted
  (``only``, else all) go round-robin over it in the order written — the k-th of them (from 1)
  on host ``(k-1) mod len(pool)``, so without ``only`` combination N on ``(N-1) mod len`` —
  each a one-node job there; ``launch.nnodes`` above 1 needs a Slurm host
  (the nodes of that combination's allocation);
- each combination's ``LoadedSpec.text`` is a job file that parses alone to exactly that
  job (values applied, ``sweep:`` gone, ``hosts:`` its one host), with a comment header
  naming the sweep and values and the original file as written, commented, below it: it is
  what ``orch show`` prints and what ``orch rerun`` and ``orch resume --on`` read back.
"""

from __future__ import annotations

import copy
import itertools
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Iterable

import yaml
from pydantic import ValidationError

from orchestrator.errors import OrchError, SpecError, UsageError
from orchestrator.spec.load import LoadedSpec, Marks, format_errors, parse_spec, parse_yaml
from orchestrator.spec.model import JobSpec
from orchestrator.spec.sweepkeys import MAX_COMBINATIONS, Valued, block_values, key_path, label, parse_flag, short_keys

SWEEP_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,78}[a-z0-9])?$")


@dataclass(frozen=True)
class Axis:
    """One swept key and its values. ``origin``: None for the job file's ``sweep:`` block, else
    the command-line flag that gave it (``--sweep train.lr``, ``--priority``)."""

    key: str
    values: tuple[Valued, ...]
    origin: str | None = None

    @property
    def path(self) -> tuple[str, ...]:
        return key_path(self.key)


@dataclass(frozen=True)
class Combination:
    """One job of a sweep: its number (from 1), its values as (key, value, spelled), its host."""

    index: int
    total: int
    values: tuple[tuple[str, Any, str], ...]
    host: str
    loaded: LoadedSpec
    origins: tuple[str, ...] = ()  # the flags the values came from (``_where``)

    @property
    def label(self) -> str:
        """``train.lr=1e-4, train.lora.r=8``."""
        return label([(k, text) for k, _, text in self.values])

    def short_label(self) -> str:
        """``lr=1e-4, r=8``: each key by its shortest distinct tail."""
        keys = [k for k, _, _ in self.values]
        return label([(k, text) for k, _, text in self.values], short_keys(keys))


def axes_of(loaded: LoadedSpec, flags: Iterable[str]) -> list[Axis]:
    """The sweep's axes: the block's keys in written order, a flag's key replacing the block's
    values in place (or added after them). ``UsageError`` for a bad or repeated flag."""
    axes = {key: Axis(key, block_values(key, values)) for key, values in (loaded.spec.sweep or {}).items()}
    given: set[str] = set()
    for flag in flags:
        try:
            key, values = parse_flag(flag)
        except ValueError as exc:
            raise UsageError(str(exc) if str(exc).startswith("--sweep") else f"--sweep {flag}: {exc}") from None
        if key in given:
            raise UsageError(f"--sweep {key} is given twice: put every value in one flag ({key}=A,B,C)")
        given.add(key)
        axes[key] = Axis(key, values, origin=f"--sweep {key}")
    for axis in axes.values():
        values = [v for v, _ in axis.values]
        if axis.origin and len(set(map(repr, values))) != len(values):
            raise UsageError(f"{axis.origin}: a value is listed more than once")
    count = 1
    for axis in axes.values():
        count *= len(axis.values)
    if count > MAX_COMBINATIONS:
        raise UsageError(f"the sweep makes {count} combinations; one sweep makes at most {MAX_COMBINATIONS} jobs")
    _no_overlap(list(axes))
    return list(axes.values())


def _no_overlap(keys: list[str]) -> None:
    for a, b in itertools.permutations(keys, 2):
        if b.startswith(a + "."):
            raise UsageError(f"the sweep varies both {a} and {b}, which is inside it: vary one of them")


def expand(loaded: LoadedSpec, axes: list[Axis], overrides: list[Axis], sweep_name: str | None,
           slurm_hosts: frozenset[str] = frozenset(), pool: list[str] | None = None,
           only: frozenset[int] | None = None) -> list[Combination]:
    """One validated ``Combination`` per element of the axes' product (see the module
    docstring); with no axes, one job (index 1 of 1) on the file's hosts with the overrides
    applied. ``slurm_hosts``: the pool's hosts that are Slurm login nodes; ``pool``: the
    hosts instead of the file's; ``only``: the combinations placed first on the pool."""
    for axis in overrides:
        if any(axis.key == a.key for a in axes):
            raise UsageError(f"{axis.origin} sets {axis.key}, which the sweep varies: drop one of them")
    data, marks = parse_yaml(loaded.text, loaded.where or str(loaded.path))
    data.pop("sweep", None)
    origins = [a.origin or "" for a in [*axes, *overrides]]
    pool = list(pool or data.get("hosts") or [])
    products = list(itertools.product(*(range(len(a.values)) for a in axes)))
    if only is not None and not only <= set(range(1, len(products) + 1)):
        raise UsageError(f"--only {','.join(map(str, sorted(only - set(range(1, len(products) + 1)))))}: the sweep has "
                         f"{len(products)} combination(s), numbered from 1")
    rank = {n: k for k, n in enumerate(n for n in range(1, len(products) + 1) if only is None or n in only)}
    combos: list[Combination] = []
    failures: list[tuple[int, str, list[tuple[str, str]]]] = []
    for n, choice in enumerate(products, start=1):
        values = tuple((a.key, a.values[j][0], a.values[j][1]) for a, j in zip(axes, choice))
        job = copy.deepcopy(data)
        job_marks = dict(marks)
        for k, (axis, j) in enumerate([*zip(axes, choice), *((o, 0) for o in overrides)]):
            where = _origin_mark(marks, axis, j, k)
            path = _apply(job, axis.path, axis.values[j][0])
            if isinstance(path, str):
                raise SpecError(f"{_where(loaded, where, origins)}: {axis.key}: {path}")
            job_marks[path] = where
            job_marks[path + ("<key>",)] = where if axis.origin else marks.get(("sweep", axis.key, "<key>"), where)
        ref = pool[rank.get(n, n - 1) % len(pool)] if axes and pool else None
        if ref is not None:
            job["hosts"] = [ref]
        combo_label = label([(k, text) for k, _, text in values])
        try:
            spec = JobSpec.model_validate(job)
        except ValidationError as exc:
            failures.append((n, combo_label, _lines(exc, job, job_marks, loaded, origins)))
            continue
        host = ref if isinstance(ref, str) else getattr(spec.hosts[0], "name", str(spec.hosts[0]))
        nnodes_problem = _nnodes(spec, host, bool(axes), slurm_hosts)
        text = job_text(job, loaded, sweep_name, n, len(products), host, combo_label, overrides)
        one = LoadedSpec(spec, loaded.path, text, job_marks, loaded.where)
        if nnodes_problem:
            failures.append((n, combo_label, _located(f"{one.locate(('launch', 'nnodes'))}: {nnodes_problem}",
                                                      loaded, origins)))
            continue
        combos.append(Combination(n, len(products), values, host, one, tuple(origins)))
        _same_when_read_back(text, loaded, spec)
    if failures:
        raise SpecError(failure_text(failures, len(products), bool(axes)))
    return combos


def check_each(combos: list[Combination], check: Callable[[LoadedSpec], None]) -> None:
    """Run ``check`` (``checks.laptop_checks``) on every combination; its ``SpecError`` lines
    gathered into one, worded like ``expand``'s."""
    failures: list[tuple[int, str, list[tuple[str, str]]]] = []
    for combo in combos:
        try:
            check(combo.loaded)
        except SpecError as exc:
            failures.append((combo.index, combo.label, _located(str(exc), combo.loaded, list(combo.origins))))
    if failures:
        raise SpecError(failure_text(failures, len(combos)))


def default_name(job_name: str, taken: Callable[[str], bool], now: datetime) -> str:
    """``<job name>-sweep-<yyyymmdd-hhmmss>``, with ``-2``, ``-3``, ... when ``taken``."""
    base = f"{job_name}-sweep-{now:%Y%m%d-%H%M%S}"
    name, n = base, 1
    while taken(name):
        n += 1
        name = f"{base}-{n}"
    return name


def _origin_mark(marks: Marks, axis: Axis, j: int, k: int) -> tuple[int, int]:
    """Where a value comes from: its place in the ``sweep:`` block, or (0, k) for the k-th
    command-line origin (``_where`` turns it into the flag's name)."""
    if axis.origin:
        return (0, k)
    return marks.get(("sweep", axis.key, j)) or marks.get(("sweep", axis.key)) or (1, 1)


def _where(loaded: LoadedSpec, mark: tuple[int, int], origins: list[str]) -> str:
    if mark[0] == 0:
        return origins[mark[1]]
    return f"{loaded.where or loaded.path}:{mark[0]}:{mark[1]}"


def _lines(exc: ValidationError, job: dict[str, Any], marks: Marks, loaded: LoadedSpec,
           origins: list[str]) -> list[tuple[str, str]]:
    """(where, ``field: message``) per error of one combination."""
    where = loaded.where or str(loaded.path)
    return _located(format_errors(exc, job, marks, where), loaded, origins)


def _located(message: str, loaded: LoadedSpec, origins: list[str]) -> list[tuple[str, str]]:
    """(where, the rest) per line of a ``file:line:col: ...`` message; line 0 is a flag."""
    where = loaded.where or str(loaded.path)
    head = re.compile(re.escape(where) + r":(\d+):(\d+): (.*)", re.S)
    out = []
    for line in message.splitlines():
        found = head.match(line)
        out.append((_where(loaded, (int(found[1]), int(found[2])), origins), found[3]) if found else (where, line))
    return out


def failure_text(failures: list[tuple[int, str, list[tuple[str, str]]]], total: int, swept: bool = True) -> str:
    """The error message: one line per (combination, error); an error every combination of
    several has, once, as ``every combination``; without a sweep (``swept`` False: overrides
    only), the errors alone."""
    if not swept:
        return "\n".join(f"{where}: {rest}" for _, _, lines in failures for where, rest in dict.fromkeys(lines))
    shared = set(failures[0][2]) if len(failures) == total > 1 else set()
    for _, _, lines in failures[1:]:
        shared &= set(lines)
    out = [f"{where}: every combination: {rest}" for where, rest in dict.fromkeys(failures[0][2])
           if (where, rest) in shared]
    for n, combo_label, lines in failures:
        out += [f"{where}: combination {n} ({combo_label}): {rest}" for where, rest in dict.fromkeys(lines)
                if (where, rest) not in shared]
    return "\n".join(out)


def _apply(data: dict[str, Any], path: tuple[str, ...], value: Any) -> tuple[Any, ...] | str:
    """Set ``path`` to ``value`` in ``data`` (mappings made on the way) and return the path as
    the document has it (list indexes as ints); the reason when it cannot: a part below text,
    an index into something that is not a list written in the file, ``train.*`` of a job that
    runs ``launch.command``."""
    if path[0] == "train" and data.get("train") is None:
        return ("the job has no train: section (it runs launch.command): to vary what your script gets, sweep "
                "env.NAME (read it in the script) or an item of launch.command (launch.command.N)")
    node: Any = data
    real: list[Any] = []
    for depth, part in enumerate(path):
        last = depth == len(path) - 1
        here = ".".join(path[:depth]) or "the job file"
        if isinstance(node, list):
            if not part.isdigit():
                return f"{here} is a list: name an item by its index ({here}.0 is the first)"
            if int(part) >= len(node):
                return f"{here} has {len(node)} item(s): there is no index {part} (the first is 0)"
            index: Any = int(part)
        elif isinstance(node, dict):
            index = part
            if part.isdigit() and not last and not isinstance(node.get(part), (dict, list)):
                return f"{here}.{part}: an index goes into a list written in the job file"
        else:
            kind = "text" if isinstance(node, str) else "a single value"
            hint = (" — write it as a list (command: [python, train.py, --lr, 1e-4]) to sweep one of its "
                    "items, or sweep env.NAME and read it in your script") if path[:2] == ("launch", "command") else ""
            return f"{here} is {kind} in the job file, not a mapping or a list{hint}"
        real.append(index)
        if last:
            node[index] = value
            return tuple(real)
        if isinstance(node, dict) and node.get(index) is None:
            if path[depth + 1].isdigit():
                return f"{'.'.join(path[:depth + 1])} is not a list written in the job file: an index needs one"
            node[index] = {}
        node = node[index]
    return tuple(real)


def _nnodes(spec: JobSpec, host: str, swept: bool, slurm_hosts: frozenset[str]) -> str | None:
    if swept and spec.launch.nnodes not in (None, 1) and host not in slurm_hosts:
        return (f"launch.nnodes is {spec.launch.nnodes}, but a sweep runs each combination on one host of "
                f"`hosts:` ({host} is one node, not a Slurm cluster): a sweep of multi-node jobs needs Slurm hosts, where "
                "launch.nnodes is the nodes of each combination's allocation")
    return None


def job_text(job: dict[str, Any], loaded: LoadedSpec, sweep_name: str | None, n: int, total: int, host: str,
             combo_label: str, overrides: list[Axis]) -> str:
    """The job file one combination ran (see the module docstring)."""
    where = loaded.where or loaded.path.name
    head = []
    if sweep_name is not None:
        head.append(f"# orch sweep {sweep_name}: combination {n} of {total} on {host}: {combo_label}")
    for axis in overrides:
        head.append(f"# orch submit {axis.origin}: {axis.key}={axis.values[0][1]}")
    head.append(f"# made by orch from {where} (as written there, below) with these values")
    body = yaml.safe_dump(job, sort_keys=False, allow_unicode=True, default_flow_style=False, width=4096)
    written = "".join(f"# {line}".rstrip() + "\n" for line in loaded.text.splitlines())
    return "\n".join(head) + "\n" + body + f"# --- {where} as written:\n" + written


def _same_when_read_back(text: str, loaded: LoadedSpec, spec: JobSpec) -> None:
    try:
        again = parse_spec(text, loaded.path).spec
    except OrchError as exc:
        raise OrchError(f"orch could not write this combination as a job file: {exc}") from None
    if again != spec:
        raise OrchError("orch could not write this combination as a job file that reads back the same")


def check_name(name: str) -> str:
    """A sweep name given with ``--sweep-name``: ``UsageError`` unless lowercase letters, digits,
    '.', '_' and '-', 1–80 characters."""
    if not SWEEP_NAME_RE.match(name):
        raise UsageError(f"--sweep-name {name!r}: use lowercase letters, digits, '.', '_' and '-' (1–80 characters, "
                         "starting and ending with a letter or digit)")
    return name


def parse_only(text: str) -> frozenset[int]:
    """``--only 2,4,6-8``: combination numbers and ranges; ``UsageError`` for anything else."""
    numbers: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()) or int(low) < 1 or (dash and int(high) < int(low)):
            raise UsageError(f"--only {text!r}: give combination numbers from 1 and ranges, e.g. --only 2,4,6-8")
        numbers.update(range(int(low), int(high if dash else low) + 1))
    return frozenset(numbers)
