"""`data.transform: "module:function"`: the user's function applied to every training example.

Contracts:
- `load(spec)` imports `module` from the working directory (the job's code snapshot, put first on
  `sys.path`) and returns a `Transform`; a module that is not there, fails to import, or lacks a
  callable `function` is a `TrainSetupError` naming it.
- `Transform.apply` calls `function(example, rng)` on each row, in file order: `example` is a copy
  of the row's dict, `rng` a `random.Random` seeded from (seed, mix source, line number) alone, so
  what one example becomes never depends on the others, on the number of processes or on a
  resume. The function returns a dict (the example), a list of dicts (several, in order; [] drops
  it too) or None (dropped). Anything else, a returned example without the format's fields, or an
  exception, is a `TrainSetupError` naming the row's file:line, the function and the cause.
- It runs in every process, before tokenizing, sampling and mixing; evaluation data is read as is.
"""

from __future__ import annotations

import importlib
import logging
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from remote_payload.contract.train_config import TrainSetupError
from remote_payload.trainer.fields import check_fields

log = logging.getLogger("remote_payload.train")


@dataclass(frozen=True)
class Transform:
    """The loaded `data.transform` (`spec` as written, `fn` the function)."""

    spec: str
    fn: Callable[..., object]

    def apply(self, rows: list[tuple[int, dict]], path: Path, fields: tuple[str, ...], seed: int,
              source: int = 0) -> list[dict]:
        """What the function makes of `rows` ((line, object) of `path`), checked against `fields`."""
        out: list[dict] = []
        for lineno, row in rows:
            where = f"{path}:{lineno}"
            rng = random.Random(f"{seed}:{source}:{lineno}")  # str seeds hash with sha512: stable across runs
            try:
                made = self.fn(dict(row) if isinstance(row, dict) else row, rng)
            except Exception as exc:  # the user's code: any error is theirs, named with the example
                raise TrainSetupError(f"{where}: data.transform {self.spec} raised {type(exc).__name__}: {exc}") from None
            items = [] if made is None else made if isinstance(made, list) else [made]
            if not isinstance(made, (dict, list)) and made is not None:
                raise TrainSetupError(f"{where}: data.transform {self.spec} returned {type(made).__name__}; "
                                      "return a dict, a list of dicts, or None to drop the example")
            for item in items:
                check_fields(item, fields, where, f"data.transform {self.spec} returned an example with ")
            out.extend(items)
        log.info("data.transform %s on %s: %d rows -> %d examples", self.spec, path, len(rows), len(out))
        return out


def load(spec: str | None, cwd: Path | None = None) -> Transform | None:
    """Import `module:function` of the workspace (`cwd`, default the working directory); None: no transform."""
    if spec is None:
        return None
    module_name, _, name = spec.partition(":")
    root = str((cwd or Path.cwd()).resolve())
    if root not in sys.path:
        sys.path.insert(0, root)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise TrainSetupError(f"data.transform {spec}: no module {exc.name} in the workspace {root}") from None
        raise TrainSetupError(f"data.transform {spec}: importing {module_name} failed: {exc}") from None
    except Exception as exc:  # the user's module failed while importing
        raise TrainSetupError(f"data.transform {spec}: importing {module_name} failed: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise TrainSetupError(f"data.transform {spec}: {module_name} ({getattr(module, '__file__', '?')}) has no function {name}")
    return Transform(spec, fn)
