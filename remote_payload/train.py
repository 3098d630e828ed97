"""The built-in trainer's entry point: ``python -m remote_payload.train --config JOB_DIR/train.json --out JOB_DIR``.

A stable name that job argv and users' command lines carry; the trainer itself is the
``remote_payload.trainer`` package (``trainer/loop.py`` reads top to bottom).
"""

from __future__ import annotations

import logging
import os
import sys

from remote_payload.trainer.loop import main

if __name__ == "__main__":
    # Everything the run wrote is closed (and checkpoints fsynced) when main returns, and the
    # process group is destroyed. Leave without interpreter finalization: a C++ worker thread
    # destroyed there (gloo, FSDP2) can abort a finished run after "done" (seen once in CI as
    # "terminate called without an active exception"), which torchrun would report as a failure.
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
