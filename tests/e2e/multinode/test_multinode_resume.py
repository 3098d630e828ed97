"""Multi-node resume without a shared filesystem (issue 14): a 2-node job of the built-in trainer,
SIGKILLed on the node that writes checkpoints, resumed with `orch resume`: the other node's job
folder gets the checkpoint (fanned out by the trainer, remote_payload/trainer/fanout.py), and the run
ends bit-identical to an uninterrupted one. The two nodes are network namespaces with job
folders of their own (tests/support/netns.py); real torchrun, c10d and gloo."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.e2e.multinode.test_multinode import _node_status, train_spec, two_nodes  # noqa: F401 (a fixture)
from tests.support.orch import Orch
from tests.support.serverhooks import set_host_hooks

STEPS = 12
SLOW_S = 0.5  # the trainer's step_delay_s (tests/support/serverhooks.py): time to kill mid-run, same numbers


def resume_spec(orch: Orch, assets: Path, hosts: list[str], nproc: int, finetune: str, name: str,
                slow: bool = True) -> Path:
    """test_multinode's job with a checkpoint every 2 steps, all of them kept, and (``slow``)
    slow steps from now on on every node: a run to kill; the run it is compared with, submitted
    first, need not wait."""
    spec = train_spec(orch, assets, hosts, nproc, STEPS, name)
    job = json.loads(spec.read_text())
    job["train"].update(save_every=2, keep_checkpoints=100)
    if finetune == "full":
        job["train"].update(finetune="full", lora=None)
    if slow:
        for host in hosts:
            set_host_hooks(orch, host, step_delay_s=SLOW_S)
    spec.write_text(json.dumps(job))
    return spec


def job_folder(orch: Orch, node: str, job: str) -> Path:
    return orch.remote_root / node / "jobs" / job


def complete_steps(folder: Path) -> list[int]:
    return sorted(int(p.parent.name[5:]) for p in (folder / "checkpoints").glob("step-*/COMPLETE"))


def final_weights(orch: Orch, job: str) -> dict[str, torch.Tensor]:
    orch("fetch", job)
    out: dict[str, torch.Tensor] = {}
    for f in sorted((orch.cwd / "runs" / job / "outputs").glob("*.safetensors")):
        out.update(load_file(f))
    return out


def kill_after_a_checkpoint(orch: Orch, job: str, nodes: list[str]) -> str:
    """SIGKILL the node where the first checkpoint appears (rank 0's), before the run can end;
    wait until the job is failed or lost. Returns that node's name."""
    deadline = time.time() + 300
    status = _node_status(orch, job)
    while [n["state"] for n in status] != ["running"] * len(nodes):
        assert time.time() < deadline, status
        time.sleep(0.3)
        status = _node_status(orch, job)
    while not (writers := [n for n in nodes if complete_steps(job_folder(orch, n, job))]):
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    (writer,) = writers
    victim = status[nodes.index(writer)]  # pids known before: kill at once
    os.kill(victim["supervisor_pid"], signal.SIGKILL)
    os.killpg(victim["pgid"], signal.SIGKILL)
    status = orch.wait_state(job, ("failed", "lost", "cancelled", "succeeded"), timeout=120)
    assert status["state"] in ("failed", "lost"), status
    assert not any((job_folder(orch, n, job) / "outputs").exists() for n in nodes), "the run ended before the kill"
    return writer


@pytest.mark.parametrize(("finetune", "nproc"), [("lora", 2), ("full", 2)])
def test_a_killed_two_node_job_resumes_bit_identical_without_a_shared_disk(
        orch: Orch, two_nodes: list[str], tiny_assets: Path, finetune: str, nproc: int) -> None:  # noqa: F811
    spec = resume_spec(orch, tiny_assets, two_nodes, nproc, finetune, "straight", slow=False)
    straight = json.loads(orch("submit", str(spec), "--follow", "--json", timeout=600).stdout)
    assert straight["state"] == "succeeded", straight

    job = orch.json("submit", str(resume_spec(orch, tiny_assets, two_nodes, nproc, finetune, "killed")))["job_id"]
    writer = kill_after_a_checkpoint(orch, job, two_nodes)
    (other,) = [n for n in two_nodes if n != writer]
    assert complete_steps(job_folder(orch, other, job)) == []  # no shared disk: only rank 0's node has it
    step = complete_steps(job_folder(orch, writer, job))[-1]
    assert 2 <= step < STEPS

    orch("resume", job, "--follow", timeout=600)
    assert orch.json("status", job)["state"] == "succeeded"
    log = orch("logs", job).stdout
    assert f"fanned out checkpoint step-{step} from rank " in log and "sizes and sha256 verified" in log
    assert f"step-{step}: step {step} of {STEPS}" in log  # "resuming from …/step-N: step N of T"
    sent, received = (job_folder(orch, n, job) / "checkpoints" / f"step-{step}" for n in (writer, other))
    assert (received / "COMPLETE").is_file()
    files = sorted(p.relative_to(sent) for p in sent.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(received) for p in received.rglob("*") if p.is_file())
    assert all((sent / f).read_bytes() == (received / f).read_bytes() for f in files)
    assert not list((job_folder(orch, other, job) / "checkpoints").glob("tmp-*"))

    a, b = final_weights(orch, straight["job_id"]), final_weights(orch, job)
    assert a.keys() == b.keys() and a
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
