"""`orch` starts light (behaviour contracts, never timings; bench/cli_start.py measures):
the lazy group lists exactly the real commands with their real help, every command still
runs, `orch --help` and `orch status` of finished jobs load none of the heavy modules and
connect to no host — a finished job's row is recorded the first time it is seen terminal."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import click

import orchestrator.cli
from orchestrator.display.progress import JobProgress
from orchestrator.state.registry import FINAL_KEY, SUBMITTING, Registry
from tests.support.orch import Orch, write_job

# What a fast start must not load: pydantic and the modules built on it, rich's console,
# paramiko, yaml, and everything that connects to a host.
HEAVY = ("pydantic", "rich.console", "paramiko", "yaml", "orchestrator.hosts.inventory", "orchestrator.spec.model",
         "orchestrator.jobs.nodes", "orchestrator.access.connect", "orchestrator.helper.remote", "remote_payload.contract.train_config")

# The real CLI in a fresh interpreter (what the `orch` script runs), reporting which of HEAVY
# it loaded on its last stderr line.
PROBE = """\
import sys
from orchestrator.cli.main import main
code = 0
try:
    main(sys.argv[2:])
except SystemExit as exc:
    code = exc.code
heavy = sys.argv[1].split(",")
print("LOADED=" + ",".join(m for m in heavy if m in sys.modules), file=sys.stderr)
sys.exit(code)
"""


def run_probe(orch: Orch, *args: str,
              env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """``orch ARGS`` through ``main``; its result (stderr without the probe's line) and the
    heavy modules it loaded."""
    proc = subprocess.run([sys.executable, "-c", PROBE, ",".join(HEAVY), *args], cwd=orch.cwd,
                          env={**orch.env, **(env or {})}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    *rest, last = proc.stderr.splitlines()
    assert last.startswith("LOADED="), proc.stderr
    proc.stderr = "".join(line + "\n" for line in rest)
    return proc, [m for m in last[len("LOADED="):].split(",") if m]


def real_commands() -> dict[str, tuple[str, click.Command]]:
    """Every command the cli modules define (their ``COMMANDS``), by name: (module, command)."""
    found: dict[str, tuple[str, click.Command]] = {}
    for info in pkgutil.iter_modules(orchestrator.cli.__path__):
        module = importlib.import_module(f"orchestrator.cli.{info.name}")
        for command in getattr(module, "COMMANDS", []):
            assert command.name not in found, f"{command.name} is defined twice"
            found[command.name] = (info.name, command)
    return found


def finished_jobs(home: Path, hosts: list[str], count: int) -> list[str]:
    """``count`` jobs recorded as terminal through the registry's own API, as orch records
    them (reserved, launched, then the aggregated terminal status)."""
    home.mkdir(parents=True, exist_ok=True)
    registry = Registry(home)
    ids = []
    for i in range(count):
        job_id = f"tiny-20261129-1015{i:02d}-{i:04x}"
        state = ("succeeded", "failed", "cancelled")[i % 3]
        registry.add(job_id, "tiny", str(home / "gone.yaml"), hosts, f"/r/jobs/{job_id}", SUBMITTING)
        registry.update(job_id, "pending", {})
        registry.update(job_id, state, {
            "state": state, "started": 1000.0, "ended": 1000.0 + 90 * (i + 1), "exit_code": 0 if i % 3 == 0 else 1,
            "reason": None if i % 3 == 0 else f"rank 0 on node 0: ValueError: bad {i} (exit code 1)",
            "metrics": {"step": 10 * i, "total_steps": 300, "loss": 2.0 / (i + 1), "tokens_per_s": 1500.0 + i}})
        ids.append(job_id)
    return ids


def test_help_lists_exactly_the_real_commands_with_their_real_help() -> None:
    from orchestrator.cli.main import COMMAND_TABLE, cli

    real = real_commands()
    assert sorted(COMMAND_TABLE) == sorted(real)
    for name, (module, short) in COMMAND_TABLE.items():
        assert real[name][0] == module, name
        assert short == " ".join((real[name][1].help or "").partition("\n\n")[0].split()), name
    eager = click.Group("orch", commands=[command for _, command in real.values()], params=cli.params,
                        help=cli.help, epilog=cli.epilog, context_settings=cli.context_settings)
    for width in (50, 80, 120, 200):  # the one-line help is shortened to the width: same as the real one's
        lazy_help = cli.get_help(click.Context(cli, info_name="orch", terminal_width=width))
        assert lazy_help == eager.get_help(click.Context(eager, info_name="orch", terminal_width=width))


def test_orch_help_imports_no_command(orch: Orch) -> None:
    from orchestrator.cli.main import COMMAND_TABLE

    proc, loaded = run_probe(orch, "--help")
    listed = re.findall(r"^  (\S+)  ", proc.stdout.split("Commands:", 1)[1], flags=re.M)
    assert listed == sorted(COMMAND_TABLE) and "Examples:" in proc.stdout
    assert loaded == []
    version, loaded = run_probe(orch, "--version")
    assert version.stdout.startswith("orch, version ") and loaded == []


def test_every_command_help_still_works(orch: Orch) -> None:
    real = real_commands()
    for name, (_, command) in sorted(real.items()):
        proc = orch(name, "--help")
        assert proc.stdout.startswith(f"Usage: orch {name} "), proc.stdout
        for sub in getattr(command, "commands", {}):  # `orch hosts add`, ...
            assert orch(name, sub, "--help").stdout.startswith(f"Usage: orch {name} {sub} ")
    assert "No such command" in orch("nope", check=2).stderr


def test_status_of_finished_jobs_needs_no_host(orch: Orch) -> None:
    """The first `orch status` records each finished job's row (cost from the host's price);
    after the host is removed the same rows come from the record, with nothing heavy loaded
    and nothing connected (an unknown host would be a warning)."""
    orch("hosts", "add", "pricey", "--ssh", "ssh -p 9 root@127.0.0.1", "--price-per-hour", "3.6")
    ids = finished_jobs(orch.home, ["pricey"], 6)
    wide = {"COLUMNS": "250"}
    first, loaded = run_probe(orch, "status", env=wide)
    assert first.stderr == "" and not {"orchestrator.access.connect", "paramiko"} & set(loaded)
    lines = first.stdout.splitlines()
    assert {"JOB", "STATE", "STEP", "LOSS", "ELAPSED", "COST", "HOST", "REASON"} <= set(lines[0].split())
    assert [line.split()[1] for line in lines[1:]] == ["succeeded", "failed", "cancelled"] * 2
    assert " 10/300 " in lines[2] and " 0.09 " in lines[1] and "ValueError: bad 1" in lines[2]  # 90 s at 3.6/h
    as_json = json.loads(orch("status", "--json").stdout)

    orch("hosts", "rm", "pricey")
    again, loaded = run_probe(orch, "status", env=wide)
    assert again.stdout == first.stdout and again.stderr == "" and loaded == []
    assert json.loads(run_probe(orch, "status", "--json")[0].stdout) == as_json
    one, loaded = run_probe(orch, "status", ids[4][:24], "--json")
    assert json.loads(one.stdout) == as_json[4] and loaded == []
    listed, loaded = run_probe(orch, "ls")
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == ids and loaded == []


def test_a_finished_row_is_kept_until_the_state_changes(tmp_path: Path) -> None:
    registry = Registry(tmp_path)
    job_id = finished_jobs(tmp_path, ["local"], 1)[0]
    row = {"state": "succeeded", "cost": 1.5}
    assert registry.record_final(job_id, "succeeded", row)
    assert not registry.record_final(job_id, "failed", {"state": "failed"})  # not its state: ignored
    record = registry.get(job_id)
    assert record.final == row and FINAL_KEY not in record.detail
    registry.update(job_id, "succeeded", dict(record.detail, note="seen again"))  # `orch logs` re-records the end
    assert registry.get(job_id).final == row and registry.get(job_id).detail["note"] == "seen again"
    registry.update(job_id, "succeeded", {"state": "succeeded", FINAL_KEY: {"forged": 1}})  # a server cannot set it
    assert registry.get(job_id).final == row
    registry.update(job_id, "pending", {})  # resumed: the old row is gone
    assert registry.get(job_id).final is None
    registry.update(job_id, "succeeded", {"state": "succeeded"})
    assert registry.get(job_id).final is None  # until a status sees it terminal again


def test_a_recorded_row_that_is_not_one_is_made_again(orch: Orch) -> None:
    job_id = finished_jobs(orch.home, ["local"], 1)[0]
    fresh = orch("status", "--wide").stdout
    made = Registry(orch.home).get(job_id).final
    assert JobProgress.from_dict(made) is not None
    for damaged in ({"state": "succeeded"}, dict(made, nodes="1"), dict(made, elapsed_s=None), [1]):
        assert JobProgress.from_dict(damaged) is None
        Registry(orch.home).record_final(job_id, "succeeded", damaged)  # type: ignore[arg-type]
        assert orch("status", "--wide").stdout == fresh


METRICS = """import json, os
print("hello from the job", flush=True)
with open(os.environ["ORCH_METRICS"], "a") as f:
    f.write(json.dumps({"step": 4, "total_steps": 4, "loss": 0.75, "tokens_per_s": 321.0}) + "\\n")
print("bye", flush=True)
"""


def test_logs_and_status_of_a_finished_local_job(orch: Orch) -> None:
    spec = write_job(orch.cwd, "quick", "local", ["python", "m.py"])
    (orch.cwd / "ws" / "m.py").write_text(METRICS)
    job = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)["job_id"]
    first, _ = run_probe(orch, "status", "--wide")
    row = first.stdout.splitlines()[1].split()
    assert row[:2] == [job, "succeeded"] and "4/4" in row and "0.7500" in row
    assert Registry(orch.home).get(job).final is not None  # recorded the first time status saw it
    again, loaded = run_probe(orch, "status", "--wide")
    assert again.stdout == first.stdout and loaded == []
    logs = orch("logs", job).stdout
    assert "\nhello from the job\nbye\n" in logs and logs.endswith("job succeeded\n")
    assert orch("logs", job, "--tail", "2").stdout.endswith("bye\n[orch] job succeeded\n")
    assert run_probe(orch, "status", "--wide")[0].stdout == first.stdout  # logs kept the recorded row
    kept, loaded = run_probe(orch, "logs", job)  # the whole log of an ended job: kept on the laptop
    assert kept.stdout == logs and loaded == []


def test_the_inventory_names_hosts_as_the_job_file_does() -> None:
    from orchestrator.hosts import inventory as hosts
    from orchestrator.spec import model as spec

    assert hosts.NAME_RE == spec.NAME_RE  # repeated in hosts.py to keep spec out of its imports
