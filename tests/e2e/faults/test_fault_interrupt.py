"""Ctrl-C during a slow sync (issue 23, class 6): the first SIGINT stops `orch submit` within
seconds, one line says what the server kept, nothing stands half-written under its final
name, and the next submit sends only the rest — a large file continues from the bytes the
server kept, sha256-checked before it takes its name (a kept partial that does not match is
discarded and the file sent whole). The link is the fault proxy with a rate cap."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e.faults.test_fault_network import wait_until_receive_ended
from tests.support.orch import Orch, write_job
from tests.support.poll import wait_until
from tests.support.proxy import FaultProxy

RATE = 4e6  # bytes/s each way: a laptop on a slow uplink


def slow_workspace(orch: Orch, host: str, big_mb: int) -> tuple[Path, Path]:
    """Three small files (sent first, by name) and ``big.bin`` of ``big_mb`` MiB."""
    spec = write_job(orch.cwd, "slow", host, ["python", "-c", "print('ok')"])
    ws = orch.cwd / "ws"
    for i in range(3):
        (ws / f"a-{i}.txt").write_text(f"small {i}\n" * 100)
    (ws / "big.bin").write_bytes(os.urandom(big_mb << 20))
    return spec, ws


def partial_bytes(dest: Path) -> int:
    """The bytes of big.bin the server holds under its temporary name."""
    return max((p.stat().st_size for p in dest.glob(".orch-tmp-*") if p.is_file()), default=0)


def interrupt_sync_at(orch: Orch, spec: Path, dest: Path, nbytes: int) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``orch submit SPEC``, send it SIGINT once the server holds ``nbytes`` of big.bin;
    return its result and the seconds from the signal to its exit."""
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "submit", str(spec)], cwd=orch.cwd, env=orch.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: partial_bytes(dest) >= nbytes,
                   what=f"the server to hold {nbytes} bytes of big.bin", timeout=180)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - signalled
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), took


def test_ctrl_c_during_a_slow_sync_stops_at_once_says_what_was_kept_and_the_rerun_sends_the_rest(
        orch: Orch, flaky: str, proxy: FaultProxy) -> None:
    spec, ws = slow_workspace(orch, flaky, 96)  # 24 s at the capped rate
    total = (ws / "big.bin").stat().st_size
    dest = orch.server_workspace(ws)
    proxy.limit(RATE)
    out, took = interrupt_sync_at(orch, spec, dest, total // 2)
    assert out.returncode == 130, out.stderr
    assert took < 10, f"orch submit took {took:.1f} s to stop after Ctrl-C"  # the rest of the send: 12 s and more
    said = [line for line in out.stderr.splitlines() if line.startswith("interrupted")]
    assert len(said) == 1 and "flaky kept 3 file(s) and " in said[0] and " MB of big.bin" in said[0], out.stderr
    assert said[0].endswith("; submit again to send the rest")
    assert "Traceback" not in out.stderr and "Exception in thread" not in out.stderr
    told_mb = float(said[0].split(" and ")[1].split(" MB")[0])
    assert told_mb >= 0.4 * total / 2**20
    wait_until_receive_ended(orch.remote_root, dest.name)  # it writes what was in flight, then records it
    assert not (dest / "big.bin").exists()  # nothing half-written under its final name
    kept = partial_bytes(dest)
    assert kept >= told_mb * 2**20 - 0.1 * 2**20  # at least what the line said (rounded to 0.1 MB)

    proxy.limit(None)
    again = orch.json("submit", str(spec))
    assert again["sync"]["written"] == 1  # the small files were complete: only big.bin goes
    assert again["sync"]["bytes"] == total - kept  # from the kept bytes on: far fewer than the whole
    local = hashlib.sha256((ws / "big.bin").read_bytes()).hexdigest()
    assert hashlib.sha256((dest / "big.bin").read_bytes()).hexdigest() == local
    assert partial_bytes(dest) == 0
    assert orch.wait_state(again["job_id"], ("succeeded", "failed"))["state"] == "succeeded"


def test_a_kept_partial_that_does_not_match_is_discarded_and_the_file_sent_whole(
        orch: Orch, flaky: str, proxy: FaultProxy) -> None:
    spec, ws = slow_workspace(orch, flaky, 24)
    total = (ws / "big.bin").stat().st_size
    dest = orch.server_workspace(ws)
    proxy.limit(RATE)
    out, _ = interrupt_sync_at(orch, spec, dest, 4 << 20)
    assert out.returncode == 130, out.stderr
    wait_until_receive_ended(orch.remote_root, dest.name)
    part = next(p for p in dest.glob(".orch-tmp-*"))
    with open(part, "r+b") as f:  # damaged on the server: its bytes no longer hash as recorded
        f.write(b"\0" * 16)
    proxy.limit(None)
    again = orch.json("submit", str(spec))
    assert again["sync"]["bytes"] >= total  # the damaged partial was not used: big.bin went whole
    assert (dest / "big.bin").read_bytes() == (ws / "big.bin").read_bytes()
    assert partial_bytes(dest) == 0
    record = json.loads((orch.remote_root / "state" / f"sync-{dest.name}.json").read_text())
    assert record["files"]["big.bin"]["sha256"] == hashlib.sha256((ws / "big.bin").read_bytes()).hexdigest()
