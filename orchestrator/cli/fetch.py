"""``orch fetch`` (and ``orch fetch --watch``, orchestrator/fetch/watch.py)."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli.app import App, notify_option, pass_app
from orchestrator.controller import laptop
from orchestrator.errors import HostError, UsageError
from orchestrator.home import orch_home
from orchestrator.fetch import links, trackers, unfetched
from orchestrator.fetch.download import fetch, nothing_selected, unwritable_error
from orchestrator.fetch import leftovers
from orchestrator.fetch import DEFAULT_INTERVAL_S


@click.command("fetch")
@click.argument("job")
@click.option("--dest", type=click.Path(path_type=Path), default=Path("runs"), show_default=True,
              help="Parent folder; files land in DEST/<job_id>/.")
@click.option("--checkpoints/--no-checkpoints", default=None,
              help="Also fetch checkpoints/ (default: no; with --watch: yes).")
@click.option("--include", "patterns", multiple=True, metavar="PATTERN",
              help="Also fetch what this gitignore-style pattern selects (repeatable).")
@click.option("--all", "everything", is_flag=True,
              help="Fetch every file of the job folder and every file the job wrote (not the synced code).")
@click.option("--follow-links-inside", "follow_links", is_flag=True,
              help="Fetch a copy of the target of each symlink that stays inside the job folder (never one "
                   "pointing outside it, dangling, or looping), under the link's own name.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: what was fetched, and what the job wrote that was not (not_fetched).")
@notify_option
@click.option("-w", "--watch", is_flag=True,
              help="Keep fetching while the job runs (new checkpoints whole), end with a final fetch when it "
                   "ends; exit 0 if it succeeded, 1 if not. Survives dropped links and laptop sleep.")
@click.option("--interval", type=click.FloatRange(min=0.05), default=DEFAULT_INTERVAL_S, show_default=True,
              metavar="SECONDS", help="With --watch: seconds between rounds.")
@click.option("--keep-checkpoints", is_flag=True,
              help="With --watch: keep every checkpoint fetched (default: remove local step-* folders the "
                   "server no longer keeps, as its keep_checkpoints does).")
@click.option("--wandb-sync", is_flag=True,
              help="Then run `wandb sync` on the fetched offline W&B runs (wandb/offline-run-*; outputs: must "
                   "select wandb/), with the laptop's wandb; exit 1 when it is not installed or the sync fails.")
@pass_app
def fetch_cmd(app: App, job: str, dest: Path, checkpoints: bool | None, patterns: tuple[str, ...],
              everything: bool, follow_links: bool, as_json: bool, watch: bool, interval: float,
              keep_checkpoints: bool, wandb_sync: bool) -> None:
    """Download what the job's `outputs` select, verified by sha256; idempotent.

    Patterns match both the job folder ($ORCH_JOB_DIR) and what the job wrote in its
    working directory, by the path it wrote: a script's `outputs/final` and
    `$ORCH_JOB_DIR/outputs/final` both land in DEST/<job_id>/outputs/final. A fetch that
    selects nothing says what the job folder holds, and exits 2 once the job has ended.
    Files the job wrote that no pattern selects (a model saved beside the script, say)
    are named, biggest first, with the --include that brings them.
    A checkpoint folder (checkpoints/step-N/) lands whole: it is fetched into a hidden
    .part-step-N/ and renamed once every file is verified; while the job runs, only once it
    holds COMPLETE.

    A managed job's box that does not answer: the copy its controller kept (outputs, logs,
    metrics, the latest checkpoint) is fetched from the controller instead.

    Tracker folders come like any other output: `outputs: [outputs/, runs/, wandb/]`
    brings TensorBoard's runs/ and W&B's wandb/; --wandb-sync then uploads the offline
    W&B runs with the laptop's `wandb sync`.

    Symlinks the job made are never followed on the server: each one the patterns select is
    named, with where it points and whether that is inside the job folder;
    --follow-links-inside fetches a copy of the file or folder of those that stay inside.

    With --watch the same fetch runs every --interval seconds until the job ends (a dropped
    link is retried, never fatal), checkpoints included, and local checkpoints the server
    has deleted are removed (--keep-checkpoints keeps them).

    \b
    Examples:
      orch fetch gpt2-lora-20261129-101500-1a2b
      orch fetch gpt2-lora --dest ~/runs --checkpoints
      orch fetch gpt2-lora --include 'results/' --include '*.pt'
      orch fetch gpt2-lora --watch --interval 60
      orch fetch gpt2-lora --wandb-sync
    """
    if (keep_checkpoints or interval != DEFAULT_INTERVAL_S) and not watch:
        raise UsageError("--interval and --keep-checkpoints go with --watch")
    if as_json and watch:
        raise UsageError("--json goes without --watch (a watch prints as it goes)")
    if follow_links and watch:
        raise UsageError("--follow-links-inside goes without --watch")
    if wandb_sync and watch:
        raise UsageError("--wandb-sync goes without --watch (an offline run is synced once it is finished)")
    record = app.registry.get(job)
    managed = bool(laptop.managed(orch_home(), [record.job_id]))
    if managed:  # where its controller runs it now
        laptop.refresh(app.inventory, app.registry, [record.job_id], app.say)
        record = app.registry.get(record.job_id)
    with_checkpoints = watch if checkpoints is None else checkpoints
    extra = (["checkpoints/"] if with_checkpoints else []) + list(patterns)
    if watch:
        status = app.watch(record, dest, extra, everything, interval, keep_checkpoints)
        if status.get("state") != "succeeded":
            raise SystemExit(1)
        return
    try:
        summary = fetch(record, app.inventory, dest, app.say, extra=extra, everything=everything,
                        follow_links=follow_links)
    except HostError:
        if not managed:
            raise
        folder, count = laptop.fetch_from_controller(app.inventory, record.job_id, dest, app.say)
        if as_json:
            app.json({"job_id": record.job_id, "dest": str(folder), "from_controller": True, "files": count})
        else:
            click.echo(f"{folder}: {count} file(s) from the controller's copy")
        return
    left = unfetched.unfetched(summary.unselected, summary.here)
    if as_json:
        app.json({"job_id": record.job_id, "dest": str(summary.dest), "fetched": summary.fetched,
                  "unchanged": summary.unchanged, "bytes": summary.bytes, "patterns": summary.patterns,
                  "ended": summary.ended, "not_fetched": unfetched.as_json(left), "unwritable": summary.unwritable,
                  "links": links.as_json(summary.links, follow_links)})
    else:
        for line in links.lines(summary.links, follow_links):
            app.say(line)
    if not summary.fetched and not summary.unchanged and not summary.unwritable:
        message = nothing_selected(summary, record.job_id)
        if summary.ended:
            raise UsageError(message)
        app.say(message)
    elif not as_json:
        for line in unfetched.lines(left, record.job_id):
            app.say(line)
        for line in leftovers.lines(leftovers.leftovers([*summary.fetched, *summary.unchanged])):
            app.say(line)  # Lightning's last.ckpt beside the last-v1.ckpt of a later run
    if not as_json:
        click.echo(f"{summary.dest}: {len(summary.fetched)} fetched ({summary.bytes / 2**20:.1f} MB), "
                   f"{len(summary.unchanged)} already there")
    if summary.unwritable:  # the rest is here; these names cannot be on this laptop
        raise unwritable_error(summary)
    if wandb_sync and trackers.sync(summary.dest, app.say) != 0:
        raise SystemExit(1)


COMMANDS = [fetch_cmd]
