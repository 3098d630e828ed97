"""``orch resume``."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli.app import App, notify_option, pass_app


@click.command("resume")
@click.argument("job")
@click.option("--on", "on", multiple=True, metavar="HOST",
              help="Continue on this inventory host instead (once per node); the job keeps its id.")
@click.option("--from", "runs", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="With --on: the folder holding the job's copy (DIR/JOB/.orch-job), used when its hosts are "
                   "gone. Default: where orch fetch --watch recorded it, then ./runs.")
@click.option("--force", is_flag=True,
              help="With --on: move away from hosts that do not answer before they count as lost "
                   "(ORCH_LOST_AFTER_S). Risk: if such a host is only cut off, the job runs on both hosts until orch "
                   "reaches it again and stops the old attempt.")
@click.option("--direct/--through-laptop", "direct", default=None,
              help="With --on: let the new host copy from the old one itself over SSH (a temporary key of its own "
                   "goes into the old host's authorized_keys and is removed after), or never. Default: ask at a "
                   "terminal when it can, else through this laptop.")
@click.option("-f", "--follow", is_flag=True, help="Stream the log; exit 0 if the job succeeds, 1 if not.")
@notify_option
@pass_app
def resume_cmd(app: App, job: str, on: tuple[str, ...], runs: Path | None, direct: bool | None, force: bool,
               follow: bool) -> None:
    """Relaunch a failed, lost or cancelled job (--on HOST: on another host); the built-in
    trainer continues from its latest complete checkpoint.

    With --on, the job moves first, under its own id: its code, spec, latest checkpoint,
    metrics and logs are copied there (through this laptop, sha256-checked; from the
    laptop's watched copy when its server is gone). A host that does not answer
    is left only once it has failed for ORCH_LOST_AFTER_S (orch status shows the
    job lost), or now with --force. The attempt left behind is superseded: orch
    stops it and sets its folder aside at once, or at its first contact with
    that host. docs/moving.md.

    A job with secret_env reads those variables from this laptop's
    environment again: a new attempt needs their values.

    \b
    Examples:
      orch resume gpt2-lora-20261129-101500-1a2b --follow
      orch resume gpt2-lora --on box2 --follow
    """
    record = app.registry.get(job)
    if on:
        from orchestrator.access.connect import ask_on_tty
        from orchestrator.move.resume_on import move

        move(record, list(on), app.inventory, app.registry, runs=runs, say=app.say, trust=ask_on_tty, direct=direct,
             force=force)
        record = app.registry.get(record.job_id)
    else:
        from orchestrator.errors import HostError, UsageError

        if force or runs is not None:
            raise UsageError("--force and --from go with --on HOST (a move)")
        from orchestrator.jobs.nodes import resume

        try:
            notes = resume(record, app.inventory, app.registry)
        except HostError as exc:
            raise HostError(f"{exc}\nIf that server is gone for good: orch resume {record.job_id} --on OTHER_HOST "
                            "continues the job elsewhere (docs/moving.md)") from None
        app.say(f"resumed {record.job_id}")
        for note in notes:  # launch.resume_args: the checkpoint found, or that the script starts over
            app.say(note)
    if follow and app.follow(record)["state"] != "succeeded":
        raise SystemExit(1)


COMMANDS = [resume_cmd]
