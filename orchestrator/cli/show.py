"""``orch show`` and ``orch rerun``: what a job ran with, and running it again."""

from __future__ import annotations

from datetime import datetime

import click

from orchestrator.access.connect import open_transport
from orchestrator.cli.app import App, notify_option, pass_app
from orchestrator.helper.remote import Remote
from orchestrator.jobs.submit import rerun
from orchestrator.state import fences
from orchestrator.state.registry import SweepEntry
from orchestrator.termtext import clean
from orchestrator.transport.base import never


@click.command("show")
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="Print the whole record as JSON.")
@click.option("--pip", is_flag=True, help="Also print the remote `pip freeze`.")
@pass_app
def show_cmd(app: App, job: str, as_json: bool, pip: bool) -> None:
    """What a job ran with: its spec as written, the git commit and diff of the workspace,
    the remote python / torch / CUDA / GPUs and pip freeze.

    \b
    Example:
      orch show gpt2-lora-20261129-101500-1a2b
    """
    record = app.registry.get(job)
    host = app.inventory.get(record.hosts[0])
    with open_transport(host, app.inventory, never) as transport:
        shown = Remote(host, transport).call("show", job=record.job_id)
    entry = app.registry.sweep_entries([record.job_id]).get(record.job_id)
    if as_json:
        app.json(dict(shown, sweep=sweep_json(entry)) if entry else shown)
        return
    env = shown.get("environment") if isinstance(shown.get("environment"), dict) else {}
    git = shown.get("git") if isinstance(shown.get("git"), dict) else None
    freeze = shown.get("pip_freeze") or ""
    status = shown.get("status") if isinstance(shown.get("status"), dict) else {}
    silent = " (not answering)" if isinstance(status.get("not_answering_s"), (int, float)) else ""
    lines = [
        f"job:      {record.job_id} ({status.get('state')}{silent}) on {', '.join(record.hosts)}",
        *supervisor_lines(status),
        *sweep_lines(entry),
        *ran_on(shown.get("moves")),
        *left_behind(fences.of_job(app.registry.path, record.job_id)),
        f"python:   {env.get('python', '?')} ({env.get('executable', '?')})",
        f"torch:    {env.get('torch', '?')}  cuda: {env.get('cuda')}  cuda available: {env.get('cuda_available')}",
        "gpus:     " + ("; ".join(env.get("gpus") or []) or "none"),
        f"packages: {len([l for l in freeze.splitlines() if l.strip()])} (orch show {record.job_id} --pip)",
        "git:      " + (f"{git.get('commit')} on {git.get('branch')}" + (f", {len(git.get('dirty') or [])} uncommitted file(s)"
                                                                      if git.get("dirty") else ", clean")
                        if git else "not a git repository"),
        *([f"secrets:  {', '.join(record.secret_env)} (sent from the laptop, never kept)"] if record.secret_env
          else []),
        *mix_lines(shown.get("mix")),
        "--- spec as written", (shown.get("spec_text") or "(not recorded)").rstrip(),
    ]
    if shown.get("git_diff"):
        lines += ["--- git diff HEAD", shown["git_diff"].rstrip()]
    if pip:
        lines += ["--- pip freeze", freeze.rstrip()]
    click.echo(clean("\n".join(lines)))


def supervisor_lines(status: dict[str, object]) -> list[str]:
    """The ``supervisor:`` line of an unfinished job (its first node's): pid, process state,
    heartbeat age; under it the reason when it is not answering (remote_payload/jobdir/answering.py)."""
    process = status.get("supervisor_process")
    if not isinstance(process, str):
        return []
    age = status.get("heartbeat_age_s")
    line = f"supervisor: pid {status.get('supervisor_pid')}, {process}"
    line += f", last heartbeat {int(age)} s ago" if isinstance(age, (int, float)) else ""
    if isinstance(status.get("not_answering_s"), (int, float)) and status.get("reason"):
        return [line, f"  {status['reason']}"]
    return [line]


def sweep_lines(entry: SweepEntry | None) -> list[str]:
    """``sweep:`` and ``values:`` lines for a job of a sweep (from the laptop's registry)."""
    if entry is None:
        return []
    return [f"sweep:    {entry.sweep}, combination {entry.combination} of {entry.combinations}",
            "values:   " + ", ".join(f"{k}={text}" for k, text in entry.pairs())]


def sweep_json(entry: SweepEntry) -> dict[str, object]:
    return {"name": entry.sweep, "combination": entry.combination, "combinations": entry.combinations,
            "values": {str(v[0]): v[1] for v in entry.values if isinstance(v, list) and len(v) == 3}}


def mix_lines(mix: object) -> list[str]:
    """``data mix:`` lines of a built-in trainer job with ``data.mix`` (its mix.json; untrusted server text):
    per source its weight's share, the examples drawn per epoch of those it has, and those trained on so far."""
    if not isinstance(mix, dict) or not isinstance(mix.get("sources"), list):
        return []
    sources = [s for s in mix["sources"] if isinstance(s, dict)]
    trained = sum(s["trained"] for s in sources if isinstance(s.get("trained"), int))
    lines = [f"data mix: {mix.get('strategy')}, {trained} examples trained on by step {mix.get('step')}"]
    for s in sources:
        share = s.get("share") if isinstance(s.get("share"), (int, float)) else 0.0
        done = s.get("trained") if isinstance(s.get("trained"), int) else 0
        lines.append(f"  {s.get('train')} ({s.get('format')}): weight {s.get('weight')} ({100 * share:.1f}%), "
                     f"{s.get('drawn')} of {s.get('examples')} drawn per epoch, trained on {done}"
                     + (f" ({100 * done / trained:.1f}%)" if trained else ""))
    return lines


def ran_on(moves: object) -> list[str]:
    """``hosts:`` lines from the job's moves (``orch resume --on``; untrusted server text)."""
    if not isinstance(moves, list) or not moves:
        return []
    steps = [m for m in moves if isinstance(m, dict)][-20:]
    hosts = [str(steps[0].get("from", "?"))] + [str(m.get("to", "?")) for m in steps]
    lines = ["hosts:    " + " → ".join(hosts)]
    for m in steps:
        when = datetime.fromtimestamp(m["at"]).strftime("%Y-%m-%d %H:%M") if isinstance(m.get("at"), (int, float)) else "?"
        lines.append(f"  moved {when}: {m.get('from')} → {m.get('to')} from {m.get('checkpoint') or 'no checkpoint'} "
                     f"(via {m.get('via')})" + (f": {m['why']}" if m.get("why") else ""))
    return lines


def left_behind(fenced: list[fences.Fence]) -> list[str]:
    """One line per attempt the job left on a host it moved away from: what orch did there,
    or that it has yet to (``state/fences.py``)."""
    return [f"  left on {f.host}: " + (f.outcome.partition(": ")[2] if f.settled is not None else
                                       "superseded; not stopped yet (orch stops it at its first contact)")
            for f in fenced]


@click.command("rerun")
@click.argument("job")
@click.option("-f", "--follow", is_flag=True, help="Stream the log; exit 0 if the new job succeeds, 1 if not.")
@notify_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the new job_id.")
@pass_app
def rerun_cmd(app: App, job: str, follow: bool, as_json: bool) -> None:
    """Run a job again as a new job: the same recorded spec and the same code snapshot.

    \b
    Example:
      orch rerun gpt2-lora-20261129-101500-1a2b --follow
    """
    plan = rerun(app.registry.get(job), app.inventory, app.registry, say=app.say)
    app.report_new_job(plan.job_id, {"job_id": plan.job_id, "rerun_of": job, "state": "pending"}, follow, as_json)


COMMANDS = [show_cmd, rerun_cmd]
