"""The smallest orch job: prints from every torchrun process and writes an output file.

orch runs it as `torchrun ... hello.py`; RANK/WORLD_SIZE come from torchrun, ORCH_JOB_DIR
from orch's supervisor. Files under $ORCH_JOB_DIR/outputs/ come back with `orch fetch`.
"""

import os
import pathlib
import socket
import time

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
for step in range(5):
    print(f"[rank {rank}/{world}] hello from {socket.gethostname()}, step {step}", flush=True)
    time.sleep(0.5)
if rank == 0:
    out = pathlib.Path(os.environ["ORCH_JOB_DIR"]) / "outputs"
    out.mkdir(exist_ok=True)
    (out / "hello.txt").write_text(f"{world} process(es) said hello from {socket.gethostname()}\n")
