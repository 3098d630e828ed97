"""Following a job to its end: its log streamed until the job is terminal, reconnecting like
``orch logs -f``, the end said once, and a new job's result completed with how it ended.

No terminal is assumed: text goes through the callbacks given (``write`` for log text, ``say``
for orch's own lines), and a progress display, when one is drawn, is passed in (the CLI's
``display/progress.py`` ``FollowBar``). Ctrl-C is not caught here: a ``KeyboardInterrupt``
leaves the job running and reaches the caller.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Callable

from orchestrator import trace
from orchestrator.termtext import EndLines, final_line, one_line

if TYPE_CHECKING:
    from orchestrator.display.progress import FollowBar
    from orchestrator.helper.remote import Remote
    from orchestrator.hosts.inventory import Inventory
    from orchestrator.state.registry import JobRecord, Registry


def follow_to_end(record: JobRecord, inventory: Inventory, registry: Registry, *, write: Callable[[str], None],
                  say: Callable[[str], None], node: int | None = None, tail: int | None = None,
                  remotes: dict[str, Remote] | None = None, bar: FollowBar | None = None,
                  log_beside_say: bool = True) -> dict[str, Any]:
    """Write the job's log through ``write`` until the job is terminal (dropped links are
    reconnected, ``jobs/logs.py``) and return its final status. ``bar``: a progress display
    fed the same text, running while the log streams. The end (``JOB STATE: reason``) goes to
    ``say`` once: not when the log already ended with the supervisor's line saying the same
    and ``log_beside_say`` (the log's text and ``say``'s lines reach one output), so a failure
    is read once. ``remotes``: connections the caller already holds, by host name."""
    from orchestrator.jobs.logs import stream_logs

    if trace.ON:
        write = first_line_marked(write)
    ends = EndLines()
    shown = ends.wrap(bar.wrap(write) if bar else write)
    with bar or nullcontext():
        status = stream_logs(record, inventory, registry, write=shown, say=say, node=node, follow=True, tail=tail,
                             remotes=remotes)
    say_end(record.job_id, status, ends, say, log_beside_say)
    return status


def say_end(job_id: str, status: dict[str, Any], ends: EndLines, say: Callable[[str], None],
            log_beside_say: bool) -> None:
    """The laptop's last line (``JOB STATE: reason``), unless the log the reader just saw on
    the same output (``log_beside_say``) already ended with the supervisor's line saying the
    same. Written elsewhere (``> log.txt``), the log's line is not where the reader looks, and
    the laptop's line is said."""
    if not (ends.said(status) and log_beside_say):
        say(final_line(job_id, status))  # one cleaned line: "JOB failed: rank 0 on node 0: ..."


def first_line_marked(write: Callable[[str], None]) -> Callable[[str], None]:
    """``write`` that marks the trace's ``first line`` phase once, as the log's first text comes."""
    seen = []

    def marked(text: str) -> None:
        if text and not seen:
            seen.append(True)
            trace.mark("first line", f"{len(text)} byte(s) of the log")
        write(text)

    return marked


def ended(result: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """A new job's result (submit, rerun: ``job_id``, ``state`` ...) with how the followed job
    ended: its ``state``, ``exit_code`` and ``reason`` (one line). ``result`` is not changed."""
    reason = one_line(status["reason"]) if status.get("reason") else status.get("reason")
    return {**result, "state": status["state"], "exit_code": status.get("exit_code"), "reason": reason}
