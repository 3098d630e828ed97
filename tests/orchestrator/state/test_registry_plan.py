"""The registry under concurrent writers, and the pure plan compared exactly."""

from __future__ import annotations

import multiprocessing
from datetime import datetime
from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import Host
from orchestrator.plan.build import HostFacts, build_plan, make_job_id
from orchestrator.spec.model import JobSpec
from orchestrator.state.registry import Registry


def _writer(home: str, worker: int) -> None:
    registry = Registry(Path(home))
    for i in range(40):
        job = f"w{worker}-{i}"
        registry.add(job, "n", "spec.yaml", ["local"], f"/jobs/{job}", "pending")
        registry.update(job, "running", {"step": i})


def test_registry_is_consistent_with_concurrent_writers(tmp_path: Path) -> None:
    procs = [multiprocessing.get_context("spawn").Process(target=_writer, args=(str(tmp_path), w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    records = Registry(tmp_path).all()
    assert len(records) == 160 and {r.state for r in records} == {"running"}
    assert Registry(tmp_path).get("w3-39").detail == {"step": 39}


def test_registry_lookup_by_unique_prefix(tmp_path: Path) -> None:
    registry = Registry(tmp_path)
    registry.add("gpt2-20261129-101500-1a2b", "gpt2", "s", ["local"], "/j", "pending")
    registry.add("gpt2-20261129-101600-3c4d", "gpt2", "s", ["local"], "/j", "pending")
    assert registry.get("gpt2-20261129-1015").job_id == "gpt2-20261129-101500-1a2b"
    with pytest.raises(UsageError, match="matches several"):
        registry.get("gpt2-")
    with pytest.raises(UsageError, match="no job"):
        registry.get("nope")


def test_job_ids_are_name_time_and_4_hex() -> None:
    job_id = make_job_id("gpt2-lora", datetime(2026, 11, 29, 10, 15, 0), b"x")
    assert job_id.startswith("gpt2-lora-20261129-101500-") and len(job_id.rsplit("-", 1)[1]) == 4


def test_plan_is_exact_for_the_built_in_trainer_with_presets() -> None:
    spec = JobSpec.model_validate({
        "name": "t", "hosts": ["box"], "presets": ["hf-mirror"], "env": {"HF_ENDPOINT": "https://mine"},
        "setup": "pip install -r requirements.txt",
        "train": {"model": "m", "finetune": "full", "data": {"train": "d.jsonl"}},
    })
    host = Host(name="box", address="h", presets=["autodl", "autodl-network-turbo"], root="/root/autodl-tmp/orch")
    facts = HostFacts(python="/root/miniconda3/bin/python", root="/root/autodl-tmp/orch", gpus=4)
    plan = build_plan(spec, "text", "/laptop/proj", "proj", [host], [facts], "t-20261129-101500-abcd")
    job_dir = "/root/autodl-tmp/orch/jobs/t-20261129-101500-abcd"
    assert plan.nodes[0].argv == [
        "/root/miniconda3/bin/python", "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc_per_node", "4", "--max_restarts", "0",
        "-m", "remote_payload.train", "--config", f"{job_dir}/train.json", "--out", job_dir,
    ]
    assert plan.env == {"HF_HOME": "/root/autodl-tmp/hf", "HF_ENDPOINT": "https://mine", "HF_HUB_DISABLE_XET": "1"}
    assert plan.setup == "source /etc/network_turbo\npip install -r requirements.txt"
    assert plan.workspace_dir == "/root/autodl-tmp/orch/workspace/proj"
    assert plan.train is not None and plan.train["finetune"] == "full"
    assert "train" not in plan.job_json()


def test_a_runpod_host_powers_itself_off_through_runpodctl_and_the_job_may_name_the_preset() -> None:
    spec = JobSpec.model_validate({"name": "t", "hosts": ["pod"], "presets": ["runpod"],
                                   "launch": {"command": ["python", "x.py"]}, "on_finish": {"power_off": True}})
    host = Host(name="pod", address="h", presets=["runpod"], root="/workspace/orch", idle_shutdown_minutes=20)
    facts = HostFacts(python="python3", root="/workspace/orch", gpus=1)
    plan = build_plan(spec, "text", "/laptop/proj", "proj", [host], [facts], "t-20261129-101500-abcd")
    assert plan.on_finish["shutdown_command"] == ["sh", "-c", 'runpodctl stop pod "$RUNPOD_POD_ID"']
    assert plan.on_finish["shutdown"] is True and plan.on_finish["idle_shutdown_minutes"] == 20
    assert plan.workspace_dir == "/workspace/orch/workspace/proj"
