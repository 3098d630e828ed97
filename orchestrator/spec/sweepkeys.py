"""Sweep keys and values: the pure rules shared by job.yaml's ``sweep:`` block (``model.py``)
and ``orch submit --sweep`` (``orchestrator/sweep/expand.py``). No I/O; yaml only, imported when a flag is parsed
(``orch status --sweep`` loads this module and must stay light).

A key is a dotted path into the job file: ``train.lr``, ``train.lora.r``, ``env.LR``; a part
made of digits indexes a list written in the file (``launch.command.3``, 0-based). ``name``,
``hosts``, ``workspace`` and ``sweep`` itself cannot be swept (``NOT_SWEPT`` says why).

A value is one YAML scalar: a number, text, true/false or null. As in YAML 1.2, ``1e-4`` is a
number (PyYAML's YAML 1.1 reads it as text); quote it (``'1e-4'``) to keep text. Values of
``env.NAME`` and of list items are always text, as written (``is_text``).
"""

from __future__ import annotations

import math
import re
from typing import Any

from remote_payload.contract import envvars

MAX_COMBINATIONS = 256
KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")
FLOAT_RE = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")
NOT_SWEPT = {
    "name": "every job of a sweep shares the job's name (the sweep names each combination)",
    "hosts": "`hosts:` is the pool the combinations are spread over",
    "workspace": "one workspace is synced for the whole sweep",
    "sweep": "a sweep cannot sweep itself",
}

Scalar = str | int | float | bool | None
Valued = tuple[Any, str]  # (the value, how it is spelled for people)


def check_key(key: str) -> str:
    """``key`` when it is a dotted path a sweep may vary; ``ValueError`` saying why not."""
    if not isinstance(key, str) or not KEY_RE.match(key):
        raise ValueError(f"{key!r} is not a dotted path into the job file (train.lr, train.lora.r, env.LR, "
                         "launch.command.2)")
    root = key.split(".", 1)[0]
    if root in NOT_SWEPT:
        raise ValueError(f"{root} cannot be swept: {NOT_SWEPT[root]}")
    if root == "env" and key.count(".") != 1:
        raise ValueError(f"{key!r} is not env.NAME (an environment variable)")
    if root == "env" and envvars.reserved(key[4:]):
        raise ValueError(f"{key}: {envvars.reserved(key[4:])}")
    return key


def key_path(key: str) -> tuple[str, ...]:
    """``train.lora.r`` -> ``("train", "lora", "r")`` (checked by ``check_key``)."""
    return tuple(check_key(key).split("."))


def is_text(key: str) -> bool:
    """Values of ``env.NAME`` and of list items (``launch.command.3``: every list of values in a
    job file holds text) are text, spelled as written."""
    return key.startswith("env.") or key.rsplit(".", 1)[-1].isdigit()


def spelled(value: Any) -> str:
    """A scalar as YAML spells it: ``true``, ``null``, ``0.0003``, text as is (one line)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value).replace("\n", "\\n").replace("\r", "\\r")


def number_fix(value: Any) -> Any:
    """YAML 1.2's reading of a plain ``1e-4`` (a number), which PyYAML reads as text."""
    if isinstance(value, str) and FLOAT_RE.match(value.strip()) and ("e" in value or "E" in value):
        number = float(value)
        return number if math.isfinite(number) else value
    return value


def block_values(key: str, values: list[Any]) -> tuple[Valued, ...]:
    """The values of one key of the ``sweep:`` block, read as the CLI reads them."""
    out = []
    for value in values:
        text = value if isinstance(value, str) else spelled(value)
        if is_text(key) and value is not None:
            out.append((text, spelled(text)))
        else:
            out.append((number_fix(value), spelled(text)))
    return tuple(out)


def parse_flag(flag: str) -> tuple[str, tuple[Valued, ...]]:
    """``--sweep KEY=V1,V2,...`` (or ``KEY=[V1, "V,2"]``, a YAML flow list for values holding a
    comma) -> (key, values). ``ValueError`` with the reason for anything else."""
    key, eq, rest = flag.partition("=")
    key = key.strip()
    if not eq:
        raise ValueError(f"--sweep {flag!r}: write KEY=VALUE1,VALUE2 (train.lr=1e-4,3e-4)")
    check_key(key)
    rest = rest.strip()
    if rest.startswith("["):
        import yaml

        try:
            items = yaml.safe_load(rest)
        except yaml.YAMLError as exc:
            raise ValueError(f"--sweep {key}: {rest!r} is not a YAML list: {str(exc).splitlines()[0]}") from None
        if not isinstance(items, list):
            raise ValueError(f"--sweep {key}: {rest!r} is not a YAML list")
        texts = [item if isinstance(item, str) else spelled(item) for item in items]
        raw = [(item, text) for item, text in zip(items, texts)]
    else:
        raw = []
        for text in rest.split(","):
            text = text.strip()
            if not text:
                raise ValueError(f"--sweep {key}: an empty value in {rest!r} (values are separated by commas)")
            raw.append((text if is_text(key) else _scalar(key, text), text))
    if not raw:
        raise ValueError(f"--sweep {key}: no values")
    values = []
    for value, text in raw:
        if isinstance(value, (list, dict)):
            raise ValueError(f"--sweep {key}: {text!r} is not one value (a number, text, true/false or null)")
        if is_text(key) and value is not None:
            value = text
        quoted = text.lstrip().startswith(("'", '"'))
        values.append((number_fix(value) if not is_text(key) and not quoted else value, spelled(text)))
    return key, tuple(values)


def _scalar(key: str, text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"--sweep {key}: {text!r} is not a YAML value: {str(exc).splitlines()[0]}") from None


def duplicates(values: list[Any]) -> list[Any]:
    """The values listed more than once (each once), in order."""
    seen: list[Any] = []
    twice: list[Any] = []
    for value in values:
        key = (type(value).__name__ if isinstance(value, bool) else "", value)
        if key in seen and value not in twice:
            twice.append(value)
        seen.append(key)
    return twice


def short_keys(keys: list[str]) -> dict[str, str]:
    """Each key's shortest tail of parts that no other key ends with: ``train.lr`` -> ``lr``,
    ``train.lora.r`` -> ``r``, a list item with its list (``command.3``); ``a.x`` and ``b.x``
    stay whole enough to differ."""
    out = {}
    for key in keys:
        parts = key.split(".")
        for n in range(2 if parts[-1].isdigit() and len(parts) > 1 else 1, len(parts) + 1):
            tail = ".".join(parts[-n:])
            if not any(other != key and (other == tail or other.endswith("." + tail)) for other in keys):
                break
        out[key] = tail
    return out


def label(values: list[tuple[str, str]], short: dict[str, str] | None = None) -> str:
    """``train.lr=1e-4, train.lora.r=8`` from (key, spelled value) pairs (``short`` names the keys)."""
    return ", ".join(f"{(short or {}).get(k, k)}={text}" for k, text in values)
