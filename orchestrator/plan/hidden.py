"""Pure: a launcher that ``launch.command`` starts where orch cannot run it itself, and what orch
does then, so that one job is always one world (docs/own-script.md, "A launcher orch cannot
run itself").

Where one hides (``find``):

- in a shell's command string: ``bash -c 'torchrun ...'``, ``sh -lc '...'``;
- in a workspace script the command runs (``bash run.sh``, ``sh -l run.sh``, ``./run.sh``),
  whose text the caller read from the laptop's workspace (``jobs/launchconfig.py``);
- after a program orch does not know that runs the rest: ``time torchrun ...``,
  ``nice -n 5 torchrun ...``, ``uv run torchrun ...``.

A launcher counts where a shell would start it: the first word of a command (after ``;``,
``&&``, ``|``, ``(``, ``then``, ``do``, ``NAME=value``, ``env``, ``exec``, ``nohup``, ``time``),
by any of the spellings ``launchers.written_launcher`` knows; ``echo torchrun`` or a comment is
not one.

What orch does with one (``refusal``, ``warning``): it never puts the command under its own
torchrun (that would start the inner launcher once per process: a world per process). On one
node it runs the command once, as written, and the inner launcher's own flags decide its
processes; ``orch check`` says so and names the form orch runs itself. It refuses (exit 2) what
cannot be one world or would silently differ from job.yaml: several nodes (orch cannot hand its
rendezvous to a launcher it does not start), ``launch.launcher`` torchrun/accelerate/deepspeed
(a launcher around a launcher), and a ``launch.nproc_per_node`` the inner launcher's own count
contradicts.
"""

from __future__ import annotations

import dataclasses
import posixpath
import shlex
from dataclasses import dataclass

from orchestrator.errors import UsageError
from orchestrator.plan import launchers
from orchestrator.spec import commandform
from orchestrator.spec.model import JobSpec

SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh"})
_SHELL_VALUED = frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})  # a shell's options with a value
_BREAKS = frozenset({";", ";;", "&&", "||", "|", "|&", "&", "(", ")", "{", "}", "!", "then", "do", "else", "elif",
                     "if", "while", "until", "time", "exec", "nohup", "command", "<", ">", ">>", "<<", ">&", "<&"})
MAX_SCRIPT = 1 << 20  # a bigger script is not read (orch cannot see inside it)


@dataclass(frozen=True)
class Hidden:
    """``launcher`` (torchrun, accelerate, deepspeed) started inside ``where`` (`` `bash -c` ``,
    ``run.sh``, `` `time` ``); ``words``: that command as the shell would run it."""

    launcher: str  # its name for a message: torchrun, torch.distributed.launch, accelerate, deepspeed
    where: str
    words: tuple[str, ...]
    form: str = ""  # the command orch would run itself, when the shell's string reads as one (`cd x && torchrun`)

    def asked(self) -> int | None:
        """The processes per node its own flags ask for (None: its default, or unreadable)."""
        try:
            cmd = launchers.parse(list(self.words), "auto")
        except UsageError:
            return None
        return launchers.asked_per_node(cmd) if cmd is not None else None


class Refused(UsageError):
    """A hidden launcher orch cannot run as one world (``refusal``); exit 2, and job.yaml's
    loader places it at ``launch.command``."""


def for_spec(spec: JobSpec, script: str | None, nnodes: int) -> Hidden | None:
    """The launcher hidden in ``launch.command`` (``find``), or None; ``Refused`` when orch
    cannot run it as one world on ``nnodes`` nodes (``refusal``)."""
    if spec.launch.command is None:
        return None
    found = find(list(commandform.read(list(spec.launch.command)).argv), script)
    why = refusal(found, spec.launch.launcher, spec.launch.nproc_per_node, nnodes) if found is not None else None
    if why:
        raise Refused(why)
    return found


def check_warnings(spec: JobSpec, script: str | None, nnodes: int, nproc: int | None = None) -> list[str]:
    """What ``orch check`` (and ``orch submit``, with the plan's ``nproc`` per node) says of a
    launcher orch cannot run itself (``warning``), or of a shell script it could not read that
    runs under its own launcher (``unseen_warning``); ``Refused`` as ``for_spec``."""
    found = for_spec(spec, script, nnodes)
    if found is not None:
        return [warning(found)]
    if spec.launch.command is None or spec.launch.launcher == "direct":
        return []
    path = unseen(list(commandform.read(list(spec.launch.command)).argv), script)
    outer = spec.launch.launcher if spec.launch.launcher in launchers.LAUNCHERS else "torchrun"
    count = nproc if nproc is not None else launchers.wanted_nproc(spec)
    said = unseen_warning(path, outer, count, nnodes) if path is not None else None
    return [said] if said else []


def shell_parts(argv: list[str]) -> tuple[str | None, str | None]:
    """For ``bash|sh [options] -c STRING`` the string; for ``bash|sh [options] FILE`` the file;
    (None, None) for anything else."""
    string, script, _ = _shell(argv)
    return string, script


def _shell(argv: list[str]) -> tuple[str | None, str | None, int]:
    """``shell_parts`` and the index of the string or file."""
    if posixpath.basename(argv[0]) not in SHELLS:
        return None, None, 0
    string, i = False, 1
    while i < len(argv):
        word = argv[i]
        if word == "--":
            i += 1
            break
        if word in _SHELL_VALUED:
            i += 2
            continue
        if not word[:1] in ("-", "+") or word in ("-", "+"):
            break
        if not word.startswith("--") and "c" in word[1:]:
            string = True
        i += 1
    if i >= len(argv):
        return None, None, i
    return (argv[i], None, i) if string else (None, argv[i], i)


def script_path(argv: list[str]) -> str | None:
    """The workspace file the command runs as a shell script: ``bash|sh [options] FILE`` or a
    relative program (``./run.sh``, ``tools/run.sh``); None for anything else (an absolute or
    ``~``/``$`` path lives only on the server)."""
    _, script = shell_parts(argv)
    if script is None and "/" in argv[0] and posixpath.basename(argv[0]) not in SHELLS:
        script = argv[0]
    if script is None or script.startswith(("/", "~")) or "$" in script:
        return None
    return posixpath.normpath(script)


def find(argv: list[str], script: str | None) -> Hidden | None:
    """The launcher ``argv`` (a command less its leading forms: spec/commandform.py) starts
    where orch cannot run it itself, or None. ``script``: the text of ``script_path(argv)``
    when the workspace has it."""
    if launchers.written_launcher(argv) is not None:
        return None  # orch runs it itself
    string, _, at = _shell(argv)
    if string is not None:
        found = _in_text(string, f"`{' '.join([posixpath.basename(argv[0]), *argv[1:at]])}`")
        return dataclasses.replace(found, form=_as_command(string)) if found is not None else None
    path = script_path(argv)
    if path is not None:
        return _in_text(script, path) if script is not None else None
    if launchers.is_python(argv[0]):
        return None  # python's arguments are the script's: `--backend deepspeed` is a value
    for at in range(1, len(argv)):
        if not argv[at - 1].startswith("-") and launchers.written_launcher(argv[at:]) is not None:
            return Hidden(_name(argv[at:]), f"`{' '.join(argv[:at])}`", tuple(argv[at:]))
    return None


def unseen(argv: list[str], script: str | None) -> str | None:
    """The script a shell command runs that orch could not read (not in the workspace), or None."""
    _, path = shell_parts(argv)
    if path is None and "/" in argv[0] and posixpath.basename(argv[0]) not in SHELLS and argv[0].endswith(".sh"):
        path = argv[0]
    return path if path is not None and script is None else None


def _name(words: list[str]) -> str:
    """The launcher's name for a message (torch.distributed.launch by its own)."""
    found = launchers.written_launcher(words)
    assert found is not None
    return launchers.TORCH_LAUNCH if found[2] == launchers.TORCH_LAUNCH else found[0]


def _in_text(text: str, where: str) -> Hidden | None:
    """The first launcher a shell would start reading ``text``."""
    for line in text.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            words = list(lexer)
        except ValueError:  # a quote that goes on over lines: that line says nothing here
            continue
        for command in _commands(words):
            if launchers.written_launcher(command) is not None:
                return Hidden(_name(command), where, tuple(command))
    return None


def _commands(words: list[str]) -> list[list[str]]:
    """The simple commands of one line: split at operators and keywords, each less its leading
    ``NAME=value`` and ``env NAME=value``."""
    out: list[list[str]] = []
    current: list[str] = []
    for word in [*words, ";"]:
        if word in _BREAKS:
            if current:
                out.append(current)
            current = []
        elif current or not (commandform.ASSIGNMENT.match(word) or word == "env"):
            current.append(word)
    return out


def refusal(hidden: Hidden, launcher: str, nproc: int | str, nnodes: int) -> str | None:
    """Why orch cannot run ``hidden``'s command as one world (exit 2), or None: ``launcher`` is
    job.yaml's ``launch.launcher``, ``nproc`` its ``nproc_per_node``, ``nnodes`` the job's nodes."""
    runs = f"launch.command starts {hidden.launcher} inside {hidden.where}"
    fix = f"put the launcher first in launch.command ({_form(hidden)}): orch then runs it with the job's topology"
    if launcher in launchers.LAUNCHERS:
        return (f"{runs}, and launch.launcher `{launcher}` would start that command under {launcher} as well: a "
                f"world inside each process. Leave launch.launcher at `auto` (orch then runs the command once), or "
                f"{fix}")
    if nnodes > 1:
        return (f"{runs} on {nnodes} nodes: orch cannot give that {hidden.launcher} the job's rendezvous, so each "
                f"node would start a world of its own. {fix[0].upper()}{fix[1:]}")
    asked = hidden.asked()
    if isinstance(nproc, int) and asked is not None and asked != nproc:
        return (f"{runs}, whose own flags ask for {asked} process(es) per node, but launch.nproc_per_node is {nproc}: "
                f"orch cannot change what {hidden.where} starts. Make the two agree, or {fix}")
    return None


def warning(hidden: Hidden) -> str:
    """What ``orch check`` says of a launcher orch runs as part of the command (``refusal`` was None)."""
    asked = hidden.asked()
    count = f"its own flags decide the processes ({asked} per node)" if asked is not None else \
        "its own flags decide the processes"
    return (f"launch.command starts {hidden.launcher} inside {hidden.where}: orch runs the command once, as written, "
            f"not under a torchrun of its own (so {hidden.launcher} starts the one world), and {count}; "
            f"launch.nproc_per_node does not reach it. For orch to run {hidden.launcher} with the job's processes, "
            f"nodes and rendezvous, write it first in launch.command: {_form(hidden)}")


def unseen_warning(path: str, outer: str, nproc: int | str, nnodes: int) -> str | None:
    """What ``orch check`` says of a shell script orch could not read that it runs under its own
    ``outer`` launcher with more than one process (``auto``: not known before the submit), or
    on several nodes; None otherwise."""
    if not (isinstance(nproc, int) and nproc > 1) and nnodes == 1:
        return None
    count = f"{nproc} process(es) per node" if isinstance(nproc, int) else "a process per GPU"
    return (f"launch.command runs {path}, which orch cannot read: orch runs it under its own {outer}, {count} on "
            f"{nnodes} node(s), each with its RANK. If {path} starts torchrun, accelerate launch or deepspeed itself, "
            f"each process would start a world of its own: write that launcher first in launch.command instead")


def _as_command(string: str) -> str:
    """``string`` when launch.command can say it as it is and orch would run its launcher (a
    shell's ``cd x && A=1 torchrun ...``), else ""."""
    try:
        form = commandform.read(shlex.split(string))
    except ValueError:
        return ""
    return string.strip() if launchers.written_launcher(list(form.argv)) is not None else ""


def _form(hidden: Hidden) -> str:
    return f"`{hidden.form or shlex.join(hidden.words)}`"
