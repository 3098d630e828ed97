"""Starting a one-process job directly, without torchrun's agent (standard library only).

torchrun's agent imports torch once more than the job does and costs seconds before the job's
first line; for one node × one process it buys nothing. The plan marks such a node ``direct``
(``launch.launcher``: auto, torchrun, direct) and the supervisor runs its argv itself with
``direct_env``: the environment torchrun gives its one worker, with a free port picked on the
node at start time (the plan is pure, so it cannot pick one).

Not so a node the plan marks ``plain`` as well (a user's command under ``launcher: auto``): it
starts with the job's environment as it is, none of torchrun's variables added, as ``python
x.py`` typed on the host would. A framework that starts its own processes (Lightning's
``Trainer(devices=2)``, ``mp.spawn`` behind an ``if "LOCAL_RANK" in os.environ``, Hugging
Face's ``Trainer``) reads ``LOCAL_RANK`` & co as "torchrun started me, with the whole world"
and would wait forever for ranks nobody starts. The built-in trainer and ``launcher: direct``
keep ``direct_env``.
"""

from __future__ import annotations

import socket
from typing import Dict

AGENT_ONLY = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
              "TORCHELASTIC_SIGNALS_TO_HANDLE")


def free_port() -> int:
    """A TCP port free on this node now (torchrun's standalone rendezvous picks one the same way)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def direct_env(env: Dict[str, str], port: int) -> Dict[str, str]:
    """``env`` plus what torchrun (``--standalone``, one process) gives its worker, so
    ``init_process_group()`` (env://) and scripts reading RANK & co behave the same.

    Left out on purpose: what describes torchrun's agent, which a direct start has none of —
    ``TORCHELASTIC_RUN_ID`` (the built-in trainer then asks to die with its parent, the
    agent: here that would be the supervisor), ``TORCHELASTIC_USE_AGENT_STORE`` (rank 0 hosts
    the store itself), ``TORCHELASTIC_ERROR_FILE``, ``TORCHELASTIC_SIGNALS_TO_HANDLE``.
    """
    out = {k: v for k, v in env.items() if k not in AGENT_ONLY}
    out.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", GROUP_RANK="0", GROUP_WORLD_SIZE="1",
               ROLE_RANK="0", ROLE_NAME="default", ROLE_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="0")
    out.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    return out
