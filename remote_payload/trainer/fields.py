"""The fields an example of each ``data.format`` must hold, and the check that names where one lacks them.

Shared by the data reader (``data.py``) and ``data.transform``'s output check (``transform.py``),
which sits below the reader: the reader applies the transform.
"""

from __future__ import annotations

from remote_payload.contract.train_config import DataFormat, TrainSetupError


def format_fields(fmt: DataFormat) -> tuple[str, ...]:
    """The fields every example of `fmt` needs."""
    return ("text",) if fmt == "text" else ("instruction", "output")


def check_fields(row: object, fields: tuple[str, ...], where: str, what: str = "") -> None:
    """`TrainSetupError` naming `where` (file:line) when `row` is not an object holding `fields`."""
    missing = [k for k in fields if not isinstance(row, dict) or k not in row]
    if missing:
        raise TrainSetupError(f"{where}: {what}missing field(s) {missing} for this data.format")
