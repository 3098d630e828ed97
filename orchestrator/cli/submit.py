"""``orch submit``."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import click

from orchestrator.access.power import PoweredHere, power_on_first
from orchestrator.ask import confirm
from orchestrator.cli.app import App, notify_option, pass_app
from orchestrator.controller import handover
from orchestrator.errors import OrchError, RemoteError, SweepIncomplete, UsageError
from orchestrator.fetch import DEFAULT_INTERVAL_S
from orchestrator.jobs.submit import checked_submit
from orchestrator.plan.build import plan_text
from orchestrator.spec.load import LoadedSpec, load_spec
from orchestrator.sweep.expand import Axis, axes_of, expand


@click.command("submit")
@click.argument("spec_file", type=click.Path(path_type=Path))
@click.option("-f", "--follow", is_flag=True, help="Stream the log; exit 0 if the job succeeds, 1 if not.")
@notify_option
@click.option("--dry-run", is_flag=True, help="Print the plan (job.json) and start nothing.")
@click.option("--force", is_flag=True, help="Overwrite files that were edited on the server.")
@click.option("--pull-remote-edits", is_flag=True,
              help="Copy files edited on the server (VSCode Remote) back into the local workspace first.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object with job_id (with --dry-run: the plan and what would be synced).")
@click.option("-w", "--watch", is_flag=True,
              help="Also keep runs/<job_id>/ current while the job runs (orch fetch JOB --watch: outputs, "
                   "metrics, logs, each new complete checkpoint); with --follow, while the log streams.")
@click.option("--watch-interval", type=click.FloatRange(min=0.05), default=DEFAULT_INTERVAL_S, show_default=True,
              metavar="SECONDS", help="With --watch: seconds between fetch rounds.")
@click.option("--keep-checkpoints", is_flag=True,
              help="With --watch: keep every checkpoint fetched (default: as many as the server keeps).")
@click.option("--sweep", "sweeps", multiple=True, metavar="KEY=V1,V2,...",
              help="Vary KEY, a dotted path into the job file (train.lr, train.lora.r, env.LR), over these values "
                   "(YAML scalars): one job per combination of every --sweep and the file's sweep: block, spread "
                   "round-robin over its hosts; replaces the block's values of the same KEY (docs/sweeps.md).")
@click.option("--sweep-name", metavar="NAME", default=None,
              help="The sweep's name (default <job name>-sweep-<yyyymmdd-hhmmss>); the same name again submits only "
                   "the combinations not launched yet.")
@click.option("--only", "only_text", metavar="N,N-M", default=None,
              help="With a sweep: submit only these combinations (numbers from 1, as orch status --sweep shows "
                   "them); those already started are skipped all the same.")
@click.option("--hosts", "hosts_text", metavar="H1,H2", default=None,
              help="With a sweep: spread the combinations submitted round-robin over these hosts instead of the "
                   "job file's hosts: (a submit that left combinations out prints this command for them).")
@click.option("--priority", type=int, default=None, metavar="N",
              help="Set launch.priority to N for this submit (every job of a sweep).")
@click.option("--managed", is_flag=True,
              help="Hand the job to the controller (orch controller up) even without a recovery: section: it is "
                   "watched, its checkpoint kept off the box, and restarted where it ran when lost (docs/managed.md).")
@click.option("-y", "--yes", is_flag=True,
              help="Power on a provider host that is off without asking (and back off without asking when the "
                   "submit then fails before its job started there).")
@pass_app
def submit_cmd(app: App, spec_file: Path, follow: bool, dry_run: bool, force: bool, pull_remote_edits: bool,
               as_json: bool, watch: bool, watch_interval: float, keep_checkpoints: bool, sweeps: tuple[str, ...],
               sweep_name: str | None, only_text: str | None, hosts_text: str | None, priority: int | None,
               yes: bool, managed: bool) -> None:
    """Validate, sync the workspace, set up and launch a job.

    \b
    Examples:
      orch submit jobs/tiny-lora-local.yaml --follow
      orch submit job.yaml --follow --watch      # stream the log, fetch checkpoints as they come
      orch submit job.yaml --dry-run
      orch submit job.yaml --pull-remote-edits   # after editing on the server in VSCode
      orch submit job.yaml --sweep train.lr=1e-4,3e-4 --sweep train.lora.r=8,16   # 4 jobs
      orch submit job.yaml --sweep env.LR=1e-4,3e-4 --sweep-name lr-try
      orch submit job.yaml --sweep env.LR=1e-4,3e-4 --only 2 --hosts box2

    \b
    A sweep submits each combination on its own: one that cannot start
    (its host unreachable, a launch refused, Ctrl-C) never stops the
    others; those left out are named with the command that submits
    exactly them, and the exit code is not 0 (130 interrupted, 3 a host
    unreachable, else that of the first left out; docs/sweeps.md).
    """
    loaded = load_spec(spec_file)
    recovery = handover.recovery_of(loaded.spec, managed)
    if recovery is not None and not dry_run:
        handover.check(loaded.spec, app.inventory, recovery)  # before anything starts
    if force and pull_remote_edits:
        raise UsageError("--force overwrites the server's edits, --pull-remote-edits keeps them: choose one")
    if (keep_checkpoints or watch_interval != DEFAULT_INTERVAL_S) and not watch:
        raise UsageError("--watch-interval and --keep-checkpoints go with --watch")
    overrides = [Axis("launch.priority", ((priority, str(priority)),), "--priority")] if priority is not None else []
    # provider hosts this submit powers on go back off when it fails before a job started there
    here = PoweredHere(app.registry, say=app.say,
                       ask=(lambda _: None) if yes else (lambda question: confirm(question, default=True)))
    with here:
        powered = power_on_first(app.inventory, loaded, spec_file, yes=yes, dry_run=dry_run, say=app.say,
                                 confirm=lambda question: confirm(question, default=False), powered=here)
        if not powered.go_on:  # a dry run stops at what it would power on
            if as_json:
                app.json({"dry_run": True, "power_on": list(powered.would_power_on)})
            return
        axes = axes_of(loaded, sweeps)
        if axes:
            if follow or watch:
                raise UsageError("--follow and --watch follow one job and a sweep starts several: "
                                 "orch status --sweep NAME -w, or orch logs JOB -f for one of them")
            given = [str(spec_file), *(w for flag in sweeps for w in ("--sweep", flag)),
                     *(["--priority", str(priority)] if priority is not None else [])]
            submit_a_sweep(app, loaded, axes, overrides, SweepChoice(sweep_name, only_text, hosts_text, given),
                           dry_run, force, pull_remote_edits, as_json)
            here.finish()  # its combinations may all have gone to other hosts (--hosts)
            return
        for flag, value, what in (("--sweep-name", sweep_name, "names a sweep"), ("--only", only_text, "chooses "
                                  "combinations of a sweep"), ("--hosts", hosts_text, "is the host pool of a sweep")):
            if value is not None:
                raise UsageError(f"{flag} {what}: give --sweep KEY=V1,V2 or a sweep: block in the job file")
        if overrides:
            loaded = expand(loaded, [], overrides, None)[0].loaded
    with ExitStack() as connections:  # kept open for --follow: it reads the log on the same ones
        with here:
            done = checked_submit(loaded, app.inventory, app.registry, say=app.say, dry_run=dry_run, force=force,
                                  pull_remote_edits=pull_remote_edits, keep=connections if follow else None)
        plan = done.plan
        if dry_run and as_json:  # the plan with what would be synced and what the ignore rules leave out
            app.json({"dry_run": True, "plan": plan.model_dump(mode="json"), "selection": done.selection})
            return
        if dry_run:
            click.echo(plan_text(plan))
            if plan.slurm is not None:  # the exact script sbatch gets, after the plan
                click.echo(f"# {plan.job_dir}/slurm.sh, submitted with sbatch on {plan.nodes[0].host}:")
                click.echo(plan.slurm["script"], nl=False)
            return
        result = done.as_json()
        if recovery is not None:
            try:
                handover.hand_over(plan.job_id, loaded.spec, recovery, app.inventory, app.registry, app.say)
            except OrchError as exc:
                raise RemoteError(f"{exc}\n{plan.job_id} runs, but unmanaged: the controller did not take it") from None

        def report(following: bool) -> None:
            app.report_new_job(plan.job_id, result, following, as_json, done.remotes)

        if not watch:
            report(follow)
            return
        from orchestrator.fetch.watch import StoppedWatching, watch_new_job  # a plain submit starts without it

        try:
            status = watch_new_job(plan.job_id, loaded, app.inventory, app.registry, Path("runs"), follow=follow,
                                   report=report, say=app.say, echo=click.echo, interval=watch_interval,
                                   keep_checkpoints=keep_checkpoints, ended=app.job_ended)
        except StoppedWatching as stopped:
            app.stopped_watching(stopped.job_id)
    if status is not None and status.get("state") != "succeeded":  # None: followed, report said how it ended
        raise SystemExit(1)


@dataclass(frozen=True)
class SweepChoice:
    """What the command line says of the sweep: ``--sweep-name``, ``--only``, ``--hosts`` as
    given, and the submit's own words (the job file, each ``--sweep`` and ``--priority``)
    that the command for combinations left out repeats."""

    name: str | None
    only: str | None
    hosts: str | None
    given: list[str]


def submit_a_sweep(app: App, loaded: LoadedSpec, axes: list[Axis], overrides: list[Axis], choice: SweepChoice,
                   dry_run: bool, force: bool, pull_remote_edits: bool, as_json: bool) -> None:
    """Every combination validated and checked before connecting, then submitted on shared
    connections; one stdout line per job started (``JOB_ID  HOST  values``) or, with
    ``--json``, a list (the combinations left out too); ``SweepIncomplete`` when some did
    not start."""
    from orchestrator.sweep.launch import json_rows, missed_report, prepare, submit_sweep

    ready = prepare(loaded, axes, overrides, app.inventory, app.registry, name=choice.name, only=choice.only,
                    hosts=choice.hosts, say=app.say)
    name, pool = ready.name, ready.pool
    done = submit_sweep(name, ready.combos, app.inventory, app.registry, say=app.say, only=ready.only,
                        dry_run=dry_run, force=force, pull_remote_edits=pull_remote_edits)
    jobs = done.jobs
    if dry_run:
        for job in jobs:
            click.echo(f"# combination {job.combo.index}/{job.combo.total} ({job.combo.label}) on {job.combo.host}")
            click.echo(plan_text(job.plan) if job.plan else f"# launched already: {job.job_id}")
    elif as_json:
        app.json(json_rows(done))
    else:
        for job in jobs:
            click.echo(f"{job.job_id}  {job.combo.host}  {job.combo.short_label()}")
    if not dry_run and jobs:
        app.say(f"sweep {name}: {len(jobs)} job(s) — orch status --sweep {name}; orch plot --sweep {name}")
    if done.missed:
        raise SweepIncomplete(missed_report(done, ["orch", "submit", *choice.given, "--sweep-name", name], pool),
                              done.exit_code())


COMMANDS = [submit_cmd]
