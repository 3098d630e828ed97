"""What orch keeps on a server, reclaimed through the CLI on `local` and the loopback sshd
(issue 42 item 2): `orch gc` removes exactly what its dry run listed, with the sizes it said,
and never a running or a queued job's folder or workspace (their runs end as they would have);
a fetched, then collected job is still shown from its local record; `orch rm`; `orch hosts
check` shows orch's disk use; a host's `gc_keep_days` collects at the end of a submit."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from tests.support.gpuqueue import Gate, submit
from tests.support.orch import Orch, write_job
from tests.support.poll import wait_until
from tests.support.serverhooks import host_root
from tests.support.sshd import SSHServer

# a finished job with an output worth fetching (300 kB of random bytes: nothing shares them)
QUICK = ["python", "-c", "import os; os.makedirs('outputs', exist_ok=True); "
                         "open('outputs/model.bin', 'wb').write(os.urandom(300000))"]
OLD_PAYLOAD = "0123456789abcdef"  # what an older orch version left: no process on the host names it
ENDED = ("succeeded", "failed", "cancelled", "lost")


def leftovers(root: Path) -> list[str]:
    """An older orch's payload, staged code no launch took (two days old), an interrupted
    launch's temporary (two hours old) and a moved job's superseded attempt, as earlier orch
    runs leave them."""
    payload = root / "payload" / OLD_PAYLOAD / "remote_payload"
    payload.mkdir(parents=True)
    (payload / "__init__.py").write_text("# an older orch\n" * 100)
    staged = root / "staged" / "a-token-of-yesterday"
    staged.mkdir(parents=True)
    (staged / "train.py").write_text("print('never launched')\n")
    temp = root / "jobs" / ".tmp-gone-123"
    temp.mkdir(parents=True)
    (temp / "job.json").write_text("{}")
    aside = root / "jobs" / ".superseded" / "moved-20261201-000000-abcd-20261201-120000"  # move/job.py set_aside's
    aside.mkdir(parents=True)
    (aside / "superseded.json").write_text('{"moved_to": "other"}')
    for path, age in ((staged, 2 * 86400), (temp, 2 * 3600)):
        os.utime(path, (time.time() - age, time.time() - age))
    return [f"payload/{OLD_PAYLOAD}", "staged/a-token-of-yesterday", "jobs/.tmp-gone-123",
            f"jobs/.superseded/{aside.name}"]


def test_gc_frees_what_it_listed_and_leaves_running_and_queued_jobs_alone(orch: Orch, host: str,
                                                                           tmp_path: Path) -> None:
    root = host_root(orch, host)
    folder = orch.cwd / "done"
    folder.mkdir()
    spec = write_job(folder, "done", host, QUICK, "outputs: [outputs/]\n")
    fetched, unfetched = (orch.json("submit", str(spec))["job_id"] for _ in range(2))
    for job in (fetched, unfetched):
        assert orch.wait_state(job, ENDED)["state"] == "succeeded"
    orch("fetch", fetched)
    assert (orch.cwd / "runs" / fetched / "outputs" / "model.bin").stat().st_size == 300000
    done_ws = Path("workspace") / orch.server_workspace(folder / "ws", root).name
    expected = {f"jobs/{fetched}", done_ws.as_posix()}

    gate = Gate(tmp_path / "gate")
    gate.path.mkdir()
    gate.path.chmod(0o777)
    running = submit(orch, gate, host, "running", gpus=1)
    gate.wait_started("running")
    queued = submit(orch, gate, host, "queued", gpus=1)
    assert orch.wait_state(queued, ("queued",) + ENDED)["state"] == "queued"
    busy = {f"jobs/{running}", f"jobs/{queued}",
            *(f"workspace/{orch.server_workspace(orch.cwd / n / 'ws', root).name}" for n in ("running", "queued"))}
    expected.update(leftovers(root))  # after the submits: a submit's staging removes day-old staged trees itself

    rule = ("--keep-days", "0", "--keep", "0")
    listed = wait_until(lambda: (lambda got: got if "finishing" not in got["kept"] else None)(
        orch.json("gc", host, "--dry-run", *rule)), what="the ended jobs' supervisors to finish their records",
        timeout=180, interval=0.5)  # a folder its supervisor still writes in stays
    assert {item["name"] for item in listed["items"]} == expected, listed["kept"]
    assert listed["kept"]["not fetched"] == 1 and listed["kept"]["unfinished"] == 2, listed["kept"]
    assert all((root / name).exists() for name in expected)  # a dry run removes nothing
    inside = dataclasses.replace(orch, cwd=folder / "ws")  # orch gc run inside the checkout keeps its workspace
    assert done_ws.as_posix() not in {item["name"] for item in inside.json("gc", host, "--dry-run", *rule)["items"]}
    assert orch("gc", host, *rule, check=2).stderr.count("--yes")  # no terminal to ask at: nothing removed
    assert all((root / name).exists() for name in expected)
    orch("rm", running, check=2)  # a running job's folder is refused by name too

    removed = orch.json("gc", host, "--yes", *rule)
    assert [(i["name"], i["bytes"]) for i in removed["items"]] == [(i["name"], i["bytes"]) for i in listed["items"]]
    assert removed["removed"] and removed["bytes"] == listed["bytes"] == sum(i["bytes"] for i in listed["items"])
    sizes = {item["name"]: item["bytes"] for item in removed["items"]}
    assert sizes[f"jobs/{fetched}"] >= 300000  # its output, which no other folder shares
    assert not any((root / name).exists() for name in expected)
    assert not [p for p in root.rglob(".gc-*")]  # no trash left behind
    assert all((root / name).is_dir() for name in busy)
    assert (root / "jobs" / unfetched).is_dir()

    gate.release("running")
    assert orch.wait_state(running, ENDED)["state"] == "succeeded"
    gate.wait_started("queued")
    gate.release("queued")
    assert orch.wait_state(queued, ENDED)["state"] == "succeeded"
    listed_now = {row["job_id"]: row["state"] for row in orch.json("ls")}  # from the laptop's records
    assert listed_now[fetched] == "succeeded" and orch.json("status", fetched)["state"] == "succeeded"

    orch("rm", unfetched)
    assert not (root / "jobs" / unfetched).exists()
    assert "removed already" in orch("rm", unfetched, "--local").stderr
    orch("status", unfetched, check=2)

    shown = orch("hosts", "check", host).stdout
    assert "orch's disk use" in shown and "finished job" in shown and "data disk use" in shown


def test_a_host_with_gc_keep_days_collects_at_the_end_of_each_submit(orch: Orch, sshd: SSHServer) -> None:
    orch("hosts", "add", "box", "--ssh", f"ssh -p {sshd.port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(orch.remote_root), "--python", sys.executable, "--trust", "--gc-keep-days", "0")
    gone = leftovers(orch.remote_root)
    folder = orch.cwd / "job"
    folder.mkdir()
    proc = orch("submit", str(write_job(folder, "quick", "box", QUICK)), "--json")
    assert "box: gc freed" in proc.stderr and "1 payload " in proc.stderr, proc.stderr
    assert not any((orch.remote_root / name).exists() for name in gone)
    assert orch.wait_state(json.loads(proc.stdout)["job_id"], ENDED)["state"] == "succeeded"
