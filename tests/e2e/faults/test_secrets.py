"""Secrets on a shared server (issue 23, class 5): ``secret_env`` values reach the job on every
attempt and nowhere else; everything orch keeps on the server is its owner's only.

Against the loopback sshd with a plain (non-root) login user, whose root is ``~/orch``;
another plain user plays the other people on the box.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

from tests.support.orch import Orch, write_job
from tests.support.sshd import SSHServer, ensure_user
from tests.support.webhooks import Hook, hook  # noqa: F401 - the fixture

USER, PEER = "orchsecret", "orchpeer"
ROOT = Path(f"/home/{USER}/orch")

# Prints digests of what it was given (never the value), leaves an output, and fails its first
# attempt after a few seconds (time to look at `ps`), so `orch resume` must deliver it again.
CHECK = """\
import hashlib, os, pathlib, sys, time
token = os.environ.get("HF_TOKEN", "")
print("token digest", hashlib.sha256(token.encode()).hexdigest()[:16], "attempt", os.environ["ORCH_ATTEMPT"],
      flush=True)
pathlib.Path("../outputs").mkdir(exist_ok=True)
pathlib.Path("../outputs/done.txt").write_text("attempt %s\\n" % os.environ["ORCH_ATTEMPT"])
time.sleep(4)
sys.exit(3 if os.environ["ORCH_ATTEMPT"] == "1" else 0)
"""


def plain_host(orch: Orch, sshd: SSHServer) -> str:
    """Host ``plain``: ``USER`` on the loopback sshd, root ``~/orch`` made afresh."""
    for name in (USER, PEER):
        ensure_user(name)
    ssh = Path(f"/home/{USER}/.ssh")
    ssh.mkdir(mode=0o700, exist_ok=True)
    (ssh / "authorized_keys").write_text(Path(str(sshd.client_key) + ".pub").read_text())
    subprocess.run(["chown", "-R", f"{USER}:{USER}", str(ssh)], check=True)
    shutil.rmtree(ROOT, ignore_errors=True)
    orch("hosts", "add", "plain", "--ssh", f"ssh -p {sshd.port} {USER}@127.0.0.1", "--identity",
         str(sshd.client_key), "--python", "/usr/bin/python3", "--trust")
    return "plain"


def texts_under(root: Path) -> dict[Path, str]:
    return {p: p.read_bytes().decode("latin-1") for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


def test_a_secret_reaches_the_job_on_every_attempt_and_nothing_orch_wrote_holds_it(
        orch: Orch, sshd: SSHServer, hook: Hook) -> None:  # noqa: F811 - the fixture
    host = plain_host(orch, sshd)
    token = "hf_" + os.urandom(12).hex()
    hook_url = hook.url("/hook/T" + os.urandom(8).hex())  # a webhook whose URL is a secret too (url_env)
    digest = hashlib.sha256(token.encode()).hexdigest()[:16]
    spec = write_job(orch.cwd, "sec", host, ["python3", "check.py"],
                     "secret_env: [HF_TOKEN, HOOK_URL]\nenv: {PUBLIC: visible}\n"
                     "setup: echo \"setup sees $(printf %s \"$HF_TOKEN\" | sha256sum | cut -c1-16)\"\n"
                     "on_finish: {notify: {url_env: HOOK_URL, format: json}}\n")
    (orch.cwd / "ws" / "check.py").write_text(CHECK)
    secrets = {"HF_TOKEN": token, "HOOK_URL": hook_url}
    said: list[str] = []

    missing = orch("submit", str(spec), env={"HOOK_URL": hook_url}, check=2)
    assert "secret_env: HF_TOKEN is not set in this laptop's environment" in missing.stderr
    assert "Traceback" not in missing.stderr and not (ROOT / "jobs").exists()  # nothing connected or launched

    dry = orch("submit", str(spec), "--dry-run", "--json", env=secrets)
    assert json.loads(dry.stdout)["plan"]["secret_env"] == ["HF_TOKEN", "HOOK_URL"]
    said += [dry.stdout, dry.stderr, orch("submit", str(spec), "--dry-run", env=secrets).stdout]

    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "submit", str(spec), "--json"], cwd=orch.cwd,
                            env={**orch.env, **secrets}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    job = json.loads(out)["job_id"]
    said += [out, err]
    ps = ""
    deadline = time.time() + 120
    while orch.json("status", job)["state"] not in ("failed", "succeeded") and time.time() < deadline:
        ps += subprocess.run(["ps", "-eww", "-o", "user:20,args"], capture_output=True, text=True).stdout
        time.sleep(0.3)
    # the job's processes were seen while they ran (this user's: other test processes run beside)
    assert any(line.startswith(f"{USER} ") and "--secrets-on-stdin" in line for line in ps.splitlines())

    job_dir = ROOT / "jobs" / job
    peer = subprocess.run(["runuser", "-u", PEER, "--", "cat", str(job_dir / "job.json")], capture_output=True,
                          text=True)
    assert peer.returncode != 0 and "Permission denied" in peer.stderr  # other users of the box read nothing
    peer = subprocess.run(["runuser", "-u", PEER, "--", "ls", str(ROOT)], capture_output=True, text=True)
    assert peer.returncode != 0 and "Permission denied" in peer.stderr

    again = orch("resume", job, check=2)  # the values are needed again, and this laptop lacks them
    assert "secret_env: HF_TOKEN, HOOK_URL are not set" in again.stderr and f"orch resume {job}" in again.stderr
    resumed = orch("resume", job, "--follow", env=secrets, timeout=240)
    said += [resumed.stdout, resumed.stderr]
    for command in (["status", job, "--json"], ["logs", job], ["show", job], ["show", job, "--json"],
                    ["status"]):
        shown = orch(*command)
        said += [shown.stdout, shown.stderr]

    assert "secrets:  HF_TOKEN, HOOK_URL (sent from the laptop, never kept)" in orch("show", job).stdout
    log = (job_dir / "logs" / "node0.log").read_text()
    assert log.count(f"token digest {digest}") == 2  # attempt 1 and the resumed attempt 2 both had it
    assert f"setup sees {digest}" in log
    assert any(r["path"] == hook_url.split(":" + str(hook.port))[1] for r in hook.requests)  # url_env from the laptop
    everything = [*said, ps, *texts_under(orch.home).values(), *texts_under(ROOT).values()]
    for value in secrets.values():
        assert all(value not in text for text in everything)
    assert all(token not in t for t in texts_under(orch.cwd / "ws").values())

    for path in [ROOT, *ROOT.rglob("*")]:  # owner only: 0700 folders, 0600 (0700) files
        if not path.is_symlink():
            assert stat.S_IMODE(path.lstat().st_mode) & 0o077 == 0, (path, oct(path.lstat().st_mode))
    code = job_dir / "code" / "check.py"  # the snapshot's hard link: one inode with the workspace file
    assert code.stat().st_nlink >= 2 and stat.S_IMODE(code.stat().st_mode) == 0o600


def test_a_root_an_earlier_orch_left_open_turns_private(orch: Orch, sshd: SSHServer) -> None:
    host = plain_host(orch, sshd)
    for folder in (ROOT, ROOT / "jobs" / "old-job"):
        folder.mkdir(parents=True, exist_ok=True)
    (ROOT / "jobs" / "old-job" / "job.json").write_text('{"env": {"HF_TOKEN": "left-by-an-old-orch"}}')
    subprocess.run(["chown", "-R", f"{USER}:{USER}", str(ROOT)], check=True)
    for path in (ROOT, ROOT / "jobs", ROOT / "jobs" / "old-job"):
        path.chmod(0o755)
    orch("hosts", "check", host)
    assert stat.S_IMODE(ROOT.stat().st_mode) == 0o700 and stat.S_IMODE((ROOT / "jobs").stat().st_mode) == 0o700
    peer = subprocess.run(["runuser", "-u", PEER, "--", "cat", str(ROOT / "jobs" / "old-job" / "job.json")],
                          capture_output=True, text=True)
    assert peer.returncode != 0 and "Permission denied" in peer.stderr


def test_a_move_and_a_rerun_send_the_secret_again_and_only_names_this_laptop_recorded(
        orch: Orch, box: str, sshd: SSHServer) -> None:
    other = orch.remote_root.parent / "remote2"
    orch("hosts", "add", "box2", "--ssh", f"ssh -p {sshd.port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(other), "--python", sys.executable, "--trust")
    spec = write_job(orch.cwd, "mv", box, ["python", "check.py"], "secret_env: [HF_TOKEN]\n")
    (orch.cwd / "ws" / "check.py").write_text(CHECK)
    token = "hf_" + os.urandom(12).hex()
    digest = hashlib.sha256(token.encode()).hexdigest()[:16]
    first = json.loads(orch("submit", str(spec), "--follow", "--json", env={"HF_TOKEN": token}, check=1).stdout)
    job = first["job_id"]

    assert "secret_env: HF_TOKEN is not set" in orch("rerun", job, check=2).stderr
    again = json.loads(orch("rerun", job, "--json", env={"HF_TOKEN": token}).stdout)["job_id"]
    assert orch.wait_state(again, ("failed", "succeeded"))["state"] == "failed"  # its attempt 1 fails on purpose
    assert f"token digest {digest} attempt 1" in (orch.remote_root / "jobs" / again / "logs" / "node0.log").read_text()

    assert "secret_env: HF_TOKEN is not set" in orch("resume", job, "--on", "box2", check=2).stderr
    orch("resume", job, "--on", "box2", "--follow", env={"HF_TOKEN": token}, timeout=240)  # attempt 2 succeeds
    assert orch.json("status", job)["state"] == "succeeded"
    moved_log = (other / "jobs" / job / "logs" / "node0.log").read_text()
    assert moved_log.count(f"token digest {digest} attempt 2") == 1

    recorded = other / "jobs" / job / "repro" / "spec.yaml"  # a server that asks for another laptop variable
    recorded.write_text(recorded.read_text().replace("[HF_TOKEN]", "[HF_TOKEN, AWS_SECRET_ACCESS_KEY]"))
    refused = orch("rerun", job, env={"HF_TOKEN": token, "AWS_SECRET_ACCESS_KEY": "aws-" + token}, check=4)
    assert "asks for secret_env AWS_SECRET_ACCESS_KEY, which its submit from this laptop did not" in refused.stderr
    for root in (orch.home, orch.remote_root, other):
        assert all(token not in text for text in texts_under(root).values())
