"""``ORCH_`` names are orch's own: a job file's ``env:``, ``secret_env:`` and sweep values may not
set them (remote_payload/contract/envvars.py ``reserved``), so no job file reaches a setting orch
reads on the server or a test hook (remote_payload/contract/testhooks.py). Exit 2, file:line,
through the real CLI; ``ORCH_METRICS_FROM_LOG``, documented for jobs, stays allowed."""

from __future__ import annotations

import pytest

from tests.support.orch import Orch

HEAD = "name: ok\nhosts: [local]\nlaunch: {command: [python, -c, 'pass']}\n"
RULE = "ORCH_ variables are orch's own (a job may set only ORCH_METRICS_FROM_LOG)"


def job_file(orch: Orch, text: str) -> str:
    path = orch.cwd / "job.yaml"
    path.write_text(HEAD + text)
    return str(path)


@pytest.mark.parametrize("command", ["check", "submit"])
def test_a_test_hook_in_env_is_refused_naming_the_key_and_its_line(orch: Orch, command: str) -> None:
    spec = job_file(orch, 'env:\n  HF_HOME: /data/hf\n  ORCH_TEST_GPUS: "8"\n')
    out = orch(command, spec, check=2)
    assert f"job.yaml:6:19: env.ORCH_TEST_GPUS: ORCH_TEST_GPUS: {RULE}" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert not (orch.home / "local" / "jobs").exists()  # nothing was submitted


@pytest.mark.parametrize("key", ["ORCH_JOB_DIR", "ORCH_ATTEMPT", "ORCH_TEST_STEP_DELAY_S", "ORCH_LEASE_STALL_S"])
def test_every_orch_name_orch_sets_or_reads_is_refused_in_env(orch: Orch, key: str) -> None:
    out = orch("check", job_file(orch, f"env: {{{key}: '1'}}\n"), check=2)
    assert f"env.{key}: {key}: {RULE}" in out.stderr, out.stderr


def test_a_secret_with_an_orch_name_is_refused(orch: Orch) -> None:
    out = orch("check", job_file(orch, "secret_env: [HF_TOKEN, ORCH_TEST_GPUS]\n"), check=2)
    assert f"job.yaml:4:13: secret_env: ORCH_TEST_GPUS: {RULE}" in out.stderr, out.stderr


def test_a_sweep_of_an_orch_name_is_refused_in_the_file_and_on_the_command_line(orch: Orch) -> None:
    block = orch("check", job_file(orch, 'sweep:\n  env.ORCH_TEST_GPUS: ["8", "4"]\n'), check=2)
    assert f"job.yaml:5:23: sweep.env.ORCH_TEST_GPUS: env.ORCH_TEST_GPUS: {RULE}" in block.stderr, block.stderr
    flag = orch("submit", job_file(orch, ""), "--sweep", "env.ORCH_TEST_GPUS=8,4", check=2)
    assert f"--sweep env.ORCH_TEST_GPUS=8,4: env.ORCH_TEST_GPUS: {RULE}" in flag.stderr, flag.stderr
    assert "Traceback" not in block.stderr + flag.stderr
    assert not (orch.home / "local" / "jobs").exists()


def test_the_name_documented_for_jobs_and_other_names_are_allowed(orch: Orch) -> None:
    spec = job_file(orch, 'env: {ORCH_METRICS_FROM_LOG: "0", ORCHARD: x, MY_ORCH_TEST_GPUS: "8"}\n')
    assert "ok" in orch("check", spec).stdout
