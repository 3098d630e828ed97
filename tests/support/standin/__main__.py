"""``python -m tests.support.standin autodl [--port 8765] [--instances 1] [--token T]``: serve a
stand-in, print one JSON line (its URL, the token it accepts, its instances), run until Ctrl-C.
Needs root: each instance is an sshd with its own login user, whose password changes on every
power-on."""

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

from tests.support.standin.autodl import AutoDLStandin


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.standin")
    parser.add_argument("provider", choices=["autodl"])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--token", default=None, help="the token it accepts (default: a random one)")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="orch-standin-"))
    standin = AutoDLStandin(workdir, args.token or secrets.token_hex(16), args.instances)
    url = standin.start(args.port)
    print(json.dumps({"url": url, "token": standin.token, "instances": standin.describe()}), flush=True)
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
