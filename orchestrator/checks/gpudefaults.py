"""What a user's command leaves to its framework on a host without a GPU (``orch check --remote``).

A framework picks some settings by itself when the command line does not name them, and a few of
those need a GPU: TRL's configs turn bf16 on unless ``--fp16`` is given, Hugging Face's
``TrainingArguments`` take ``bf16=True`` written in the script, ``accelerate launch`` reads the
host's own ``default_config.yaml``, torchtune's shipped configs say ``device: cuda`` and
``dtype: bf16``, Lightning's ``Trainer(accelerator=...)`` is set in the script. orch reads the
command line and the workspace's files on the laptop; what it cannot read it says it did not
check. ``rows`` gives those lines for a host with no GPU (``preflight._gpu_rows`` shows them
there), each naming the framework, the default and the flags that set it for the CPU: none is
``ok`` unless the command itself settles it.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from orchestrator.checks.verdict import OK, WARN, Row
from orchestrator.plan import hidden, launchers
from orchestrator.spec import commandform
from orchestrator.spec.model import JobSpec

MAX_READ = 1 << 20  # bytes of one workspace file read
IMPORT = re.compile(r"^\s*(?:from|import)\s+(trl|transformers|accelerate|lightning|pytorch_lightning|torchtune)\b",
                    re.MULTILINE)
HF_TRAINER = re.compile(r"\b(?:Trainer|TrainingArguments|HfArgumentParser|Seq2SeqTrainer)\s*\(")  # a call, not prose
LIGHTNING_GPU = re.compile(r"""accelerator\s*=\s*["'](gpu|cuda)["']""")
TRUE = ("", "1", "true", "yes", "y", "t", "on")
ACCELERATE_DEFAULT = "~/.cache/huggingface/accelerate/default_config.yaml"
TUNE_GPU = {"device": "cuda", "dtype": "bf16"}


def rows(spec: JobSpec, workspace: Path) -> tuple[Row, ...]:
    """The lines for a host with no GPU about what ``spec``'s command leaves to its framework;
    empty for the built-in trainer (orch knows its precision: ``Needs``)."""
    if spec.launch.command is None:
        return ()
    form = commandform.read(list(spec.launch.command))
    cwd = form.cwd or ""
    words = list(form.argv)
    shell = _read(workspace, cwd, hidden.script_path(words)) if hidden.script_path(words) else None
    if shell is not None:
        words += _words(shell)
    env = {**{k: str(v) for k, v in spec.env.items()}, **dict(form.env)}
    texts = [t for t in (_read(workspace, cwd, w) for w in words if w.endswith(".py")) if t is not None]
    found = {m.group(1) for t in texts for m in IMPORT.finditer(t)}
    module = _module(words)
    out: list[Row] = []
    if "trl" in found or module.startswith("trl") or any(posixpath.basename(w) == "trl" for w in words[:1]):
        out.append(_trl(words))
    elif "transformers" in found and any(HF_TRAINER.search(t) for t in texts):
        out.append(_hf_trainer(words))
    cmd = launchers.written_launcher(words)
    if cmd is not None and cmd[0] == "accelerate":
        out += _accelerate(words, workspace, cwd, env)
    if "lightning" in found or "pytorch_lightning" in found:
        out.append(_lightning(texts))
    if posixpath.basename(words[0]) == "tune" and words[1:2] == ["run"]:
        out.append(_torchtune(words, workspace, cwd))
    out.append(Row("script's own device", "not checked", WARN,
                   "orch reads the command line and the workspace's files only: a GPU that the script or its framework "
                   "asks for by itself (.cuda(), fp16/bf16 set in code or in a config file on the host) shows only "
                   "when the job runs"))
    return tuple(out)


def _read(workspace: Path, cwd: str, name: str | None) -> str | None:
    if not name or name.startswith(("/", "~", "$")):
        return None
    path = workspace / cwd / name
    try:
        if not path.is_file() or path.stat().st_size > MAX_READ:
            return None
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _words(text: str) -> list[str]:
    out: list[str] = []
    for line in text.splitlines():
        try:
            out += shlex.split(line, comments=True)
        except ValueError:
            out += line.split()
    return out


def _module(words: list[str]) -> str:
    target = commandform.python_target(words) if words and launchers.is_python(words[0]) else None
    return target[1] if target is not None and target[0] == "module" else ""


def flag(words: list[str], name: str, switch: bool = False) -> str | None:
    """The value of ``--name`` (or ``--name-with-dashes``) in ``words``: its ``=value`` or next
    word (for a ``switch``, only a true/false word), ``""`` when there is none; None when absent."""
    names = {f"--{name}", f"--{name.replace('_', '-')}"}
    for i, word in enumerate(words):
        head, eq, value = word.partition("=")
        if head in names:
            if eq:
                return value
            nxt = words[i + 1] if i + 1 < len(words) else ""
            boolean = nxt.lower() in (*TRUE, "false", "0", "no", "n", "f", "off")
            return "" if nxt.startswith("-") or not nxt or (switch and not boolean) else nxt
    return None


def _on(words: list[str], name: str) -> bool:
    value = flag(words, name, switch=True)
    return value is not None and value.lower() in TRUE


def _off(words: list[str], name: str) -> bool:
    value = flag(words, name, switch=True)
    return value is not None and value.lower() not in TRUE


def _trl(words: list[str]) -> Row:
    if _on(words, "use_cpu"):
        return Row("TRL precision", "--use_cpu on the command", OK, "TRL's bf16 default runs on the CPU")
    if _off(words, "bf16") or _on(words, "fp16"):
        return Row("TRL precision", "bf16 off on the command", OK, "")
    return Row("TRL precision", "bf16 on by default", WARN,
               "TRL's configs (SFTConfig, DPOConfig, GRPOConfig, ...) turn bf16 on when the command gives no --fp16; "
               "with no GPU, transformers' TrainingArguments stops ('Your setup doesn't support bf16/gpu'): add "
               "--use_cpu True (or --bf16 False) to the command")


def _hf_trainer(words: list[str]) -> Row:
    if _on(words, "use_cpu"):
        return Row("Trainer precision", "--use_cpu on the command", OK, "")
    if _on(words, "bf16") or _on(words, "fp16"):
        return Row("Trainer precision", "--bf16/--fp16 on the command", WARN,
                   "with no GPU, transformers' TrainingArguments stops on bf16 ('Your setup doesn't support "
                   "bf16/gpu'): add --use_cpu True or drop the flag")
    return Row("Trainer precision", "not checked", WARN,
               "Hugging Face's Trainer takes bf16/fp16 from the command (none given) and from TrainingArguments(...) "
               "in the script, which orch does not read: a bf16=True there stops with no GPU unless the command "
               "adds --use_cpu True")


def _accelerate(words: list[str], workspace: Path, cwd: str, env: dict[str, str]) -> list[Row]:
    precision = flag(words, "mixed_precision")
    config = flag(words, "config_file")
    if config:
        text = _read(workspace, cwd, config)
        data = _yaml(text) if text is not None else None
        if data is None:
            return [Row("accelerate config", f"{config}: not checked", WARN,
                        f"{config} is not in the workspace (or not a YAML mapping): its mixed_precision, "
                        "distributed_type and gpu_ids apply on the host unchecked; --cpu and --mixed_precision no on "
                        "the command win over them")]
        said = {k: data.get(k) for k in ("mixed_precision", "distributed_type", "use_cpu") if data.get(k) is not None}
        gpu = str(said.get("distributed_type", "")) in ("MULTI_GPU", "DEEPSPEED", "FSDP") and not said.get("use_cpu") \
            and not _on(words, "cpu")
        value = ", ".join(f"{k}: {v}" for k, v in said.items()) or "no precision or device set"
        return [Row("accelerate config", f"{config}: {value}", WARN if gpu else OK,
                    f"{said.get('distributed_type')} asks for GPUs: here accelerate runs the processes as MULTI_CPU on "
                    "gloo (orch sets ACCELERATE_USE_CPU=true for more than one; add --cpu for one) and leaves "
                    "DeepSpeed/FSDP out, so a CPU run checks the script, not that plugin" if gpu else "")]
    if precision is not None or "ACCELERATE_MIXED_PRECISION" in env or _on(words, "cpu"):
        return []  # --cpu: the device is settled, and accelerate runs fp16/bf16 on the CPU
    return [Row("accelerate config", "host's default: not checked", WARN,
                f"with no --config_file, accelerate launch reads the host's own {ACCELERATE_DEFAULT} (written by "
                "`accelerate config`), which orch cannot read: its mixed_precision and GPU settings apply unless the "
                "command says --cpu and --mixed_precision no")]


def _yaml(text: str) -> dict[str, Any] | None:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    return data if isinstance(data, dict) else None


def _lightning(texts: list[str]) -> Row:
    for text in texts:
        found = LIGHTNING_GPU.search(text)
        if found:
            line = text.count("\n", 0, found.start()) + 1
            return Row("Lightning device", f"{found.group(0)} (line {line})", WARN,
                       "Lightning's Trainer stops with no GPU: accelerator='auto' (its default) or 'cpu' runs here")
    return Row("Lightning device", "not checked", WARN,
               "Lightning's Trainer(accelerator=, devices=, precision=) is set in the script: its default "
               "accelerator='auto' runs on the CPU, while 'gpu'/'cuda' or '16-mixed' set in code or by a CLI flag "
               "orch did not read stop with no GPU")


def _torchtune(words: list[str], workspace: Path, cwd: str) -> Row:
    overrides = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))
    config = flag(words, "config")
    text = _read(workspace, cwd, config) if config else None
    data = _yaml(text) if text is not None else None
    fix = "add device=cpu dtype=fp32 to the command (bf16 runs on the CPU, but at a fraction of fp32's speed)"
    if data is None:
        wanted = {k: overrides[k] for k in TUNE_GPU if k in overrides}
        if wanted.get("device") == "cpu":
            return Row("torchtune device", "device=cpu on the command", OK, "")
        return Row("torchtune device", f"config {config or '?'}: not checked", WARN,
                   "torchtune's shipped configs set device: cuda and dtype: bf16, and orch cannot read this one: "
                   + fix)
    said = {k: str(overrides.get(k, data.get(k))) for k in TUNE_GPU}
    value = f"device: {said['device']}, dtype: {said['dtype']}"
    if said["device"] != "cpu":
        return Row("torchtune device", value, WARN, f"from {config} and the command; with no GPU: {fix}")
    return Row("torchtune device", value, OK, "")
