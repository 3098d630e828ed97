"""Hostile strings in names, env, argv and file names run nothing: planted canaries prove it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.orch import Orch


def test_hostile_env_argv_and_file_names_arrive_verbatim(orch: Orch, host: str, tmp_path: Path) -> None:
    canaries = [tmp_path / f"canary{i}" for i in range(6)]
    evil_env = f"$(touch {canaries[0]}); rm -rf /nonexistent `touch {canaries[1]}`"
    evil_args = [f"$(touch {canaries[2]})", f"; touch {canaries[3]}", "--flag\nnew line", "'q\"uote\\", "ünï ☃", "-rf"]
    ws = orch.cwd / "ws"
    ws.mkdir()
    weird = "a file $(touch canary4); 'x'.txt"  # a file name cannot hold '/': look for it anywhere below
    (ws / weird).write_text("payload\n")
    (ws / "show.py").write_text(
        "import json, os, sys\n"
        "print('ENV=' + json.dumps(os.environ['EVIL']))\n"
        "print('ARGV=' + json.dumps(sys.argv[1:]))\n"
        "print('FILES=' + json.dumps(sorted(os.listdir('.'))))\n"
    )
    spec = orch.cwd / "evil.yaml"

    def write(env_value: str) -> None:
        spec.write_text(json.dumps({
            "name": "evil", "hosts": [host], "workspace": {"path": "ws"},
            "env": {"EVIL": env_value}, "launch": {"nproc_per_node": 1, "command": ["python", "show.py", *evil_args]},
            "setup": f"echo 'setup ran' > /dev/null  # {canaries[5]} is only named, never touched",
        }))

    write(evil_env)  # env values expand $NAME only: a `$(` is refused before anything runs
    refused = orch("submit", str(spec), check=2)
    assert "env.EVIL" in refused.stderr and "write $$ for a literal $" in refused.stderr
    write(evil_env.replace("$", "$$"))  # `$$` is one `$`: the text arrives as written
    done = orch("submit", str(spec), "--follow", "--json")
    assert json.loads(done.stdout)["state"] == "succeeded"
    lines = {l.split("=", 1)[0]: json.loads(l.split("=", 1)[1]) for l in done.stderr.splitlines()
             if l.startswith(("ENV=", "ARGV=", "FILES="))}
    assert lines["ENV"] == evil_env
    assert lines["ARGV"] == evil_args
    assert weird in lines["FILES"]
    assert not any(c.exists() for c in canaries)
    assert not list(tmp_path.rglob("canary4"))


def test_a_job_name_with_shell_text_is_refused(orch: Orch, tmp_path: Path) -> None:
    spec = orch.cwd / "j.yaml"
    spec.write_text(json.dumps({"name": f"x$(touch {tmp_path / 'c'})", "hosts": ["local"],
                                "launch": {"command": ["true"]}}))
    out = orch("check", str(spec), check=2)
    assert "name: must be lowercase letters" in out.stderr
    assert not (tmp_path / "c").exists()
