"""``python -m tests.support.standin autodl|vast|runpod [--port 8765] [--instances 1] [--token T]``:
serve a stand-in, print one JSON line (its URL, the token it accepts, its instances, and for
vast and RunPod the offers it rents), run until Ctrl-C. Needs root: each instance is an sshd
with its own login user (AutoDL: a password that changes on every power-on; vast, RunPod: the
key given at creation)."""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from tests.support.standin.autodl import AutoDLStandin
from tests.support.standin.boxes import StandinServer
from tests.support.standin.runpod import GPU_TYPES, RunPodStandin
from tests.support.standin.vast import OFFERS, VastStandin


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.standin")
    parser.add_argument("provider", choices=["autodl", "vast", "runpod"])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--instances", type=int, default=1, help="AutoDL: instances to hold (powered off)")
    parser.add_argument("--token", default=None, help="the token it accepts (default: a random one)")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="orch-standin-"))
    workdir.chmod(0o755)
    token = args.token or secrets.token_hex(16)
    standin: StandinServer
    extra: dict[str, Any] = {}
    if args.provider == "autodl":
        standin = AutoDLStandin(workdir, token, args.instances)
    elif args.provider == "vast":
        standin = VastStandin(workdir, token)
        extra["offers"] = [{k: o[k] for k in ("id", "gpu_name", "num_gpus", "dph_total")} for o in OFFERS]
    else:
        standin = RunPodStandin(workdir, token)
        extra["gpu_types"] = [{"id": g["id"], "price": g["price"]} for g in GPU_TYPES]
    url = standin.start(args.port)
    print(json.dumps({"url": url, "token": standin.token, "instances": standin.describe(), **extra}), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop its sshd instances on a plain kill too
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        standin.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
