"""orch check --remote on a host with no GPU (this machine has none) says what a user's command
leaves to its framework that may need one, names the flag that settles it for the CPU, and never
says ok for what it did not read (issue 39 item 6). Through the CLI on local and the loopback sshd."""

from __future__ import annotations

from pathlib import Path

from tests.support.orch import Orch, write_job

TRL_SCRIPT = """from trl import ModelConfig, ScriptArguments, SFTConfig, SFTTrainer, TrlParser

parser = TrlParser((ScriptArguments, SFTConfig, ModelConfig))
script_args, training_args, model_args = parser.parse_args_and_config()
"""
LIGHTNING_SCRIPT = """import lightning as L

trainer = L.Trainer(accelerator="gpu", devices=2)
"""
TUNE_CONFIG = """output_dir: out
device: cuda
dtype: bf16
"""


CHECKS = ("TRL precision", "Trainer precision", "torchtune device", "accelerate config", "Lightning device",
          "script's own device", "GPUs")


def rows(out: str) -> dict[str, str]:
    """The table's rows by check name, each row's cells joined by single spaces (a note wrapped
    onto the lines below, which start blank, joined to its row)."""
    found: dict[str, str] = {}
    last = ""
    for line in out.splitlines():
        if line.startswith(" ") and last:
            found[last] += " " + " ".join(line.split())
            continue
        last = next((c for c in CHECKS if line.startswith(c)), "")
        if last:
            found[last] = " ".join(line.split())
    return found


def check(orch: Orch, spec: Path) -> dict[str, str]:
    out = orch("check", str(spec), "--remote", env={"COLUMNS": "600"})
    assert "Traceback" not in out.stderr and "FAIL" not in out.stdout
    found = rows(out.stdout)
    assert "none warn" in found["GPUs"]
    assert found["script's own device"].startswith("script's own device not checked warn"), found
    return found


def test_trl_bf16_default_is_named_with_its_flag_and_ok_once_the_command_sets_it(orch: Orch, host: str) -> None:
    spec = write_job(orch.cwd, "trl", host, ["torchrun", "--nproc_per_node", "2", "sft.py", "--output_dir", "out"])
    (orch.cwd / "ws" / "sft.py").write_text(TRL_SCRIPT)
    line = check(orch, spec)["TRL precision"]
    assert line.startswith("TRL precision bf16 on by default warn"), line
    assert "--use_cpu True" in line and "--bf16 False" in line and "SFTConfig" in line

    spec.write_text(spec.read_text().replace('"out"]', '"out", "--use_cpu", "True"]'))
    assert check(orch, spec)["TRL precision"].startswith("TRL precision --use_cpu on the command ok")


def test_torchtune_config_device_cuda_is_read_and_a_built_in_config_is_not_checked(orch: Orch, host: str) -> None:
    spec = write_job(orch.cwd, "tune", host, ["tune", "run", "lora_finetune_single_device", "--config", "tiny.yaml"])
    (orch.cwd / "ws" / "tiny.yaml").write_text(TUNE_CONFIG)
    line = check(orch, spec)["torchtune device"]
    assert line.startswith("torchtune device device: cuda, dtype: bf16 warn") and "device=cpu" in line, line

    spec.write_text(spec.read_text().replace('"tiny.yaml"]', '"tiny.yaml", "device=cpu"]'))
    assert check(orch, spec)["torchtune device"].startswith("torchtune device device: cpu, dtype: bf16 ok")

    spec.write_text(spec.read_text().replace('"tiny.yaml", "device=cpu"]', '"llama3_2/1B_lora_single_device"]'))
    line = check(orch, spec)["torchtune device"]
    assert line.startswith("torchtune device config llama3_2/1B_lora_single_device: not checked warn"), line
    assert "device: cuda" in line and "device=cpu" in line


def test_accelerate_host_config_and_lightning_gpu_accelerator_are_said(orch: Orch, host: str) -> None:
    spec = write_job(orch.cwd, "acc", host, ["accelerate", "launch", "--num_processes", "2", "train.py"])
    (orch.cwd / "ws" / "train.py").write_text(LIGHTNING_SCRIPT)
    found = check(orch, spec)
    assert found["accelerate config"].startswith("accelerate config host's default: not checked warn")
    assert "default_config.yaml" in found["accelerate config"] and "--mixed_precision no" in found["accelerate config"]
    assert found["Lightning device"].startswith("Lightning device accelerator=\"gpu\" (line 3) warn"), found

    spec.write_text(spec.read_text().replace('"2", "train.py"', '"2", "--config_file", "acc.yaml", "train.py"'))
    (orch.cwd / "ws" / "acc.yaml").write_text("distributed_type: MULTI_GPU\nmixed_precision: bf16\nnum_processes: 2\n")
    line = check(orch, spec)["accelerate config"]
    assert line.startswith("accelerate config acc.yaml: mixed_precision: bf16, distributed_type: MULTI_GPU warn")
    assert "MULTI_CPU" in line and "leaves DeepSpeed/FSDP out" in line, line

    # --cpu settles accelerate's device; Hugging Face's Trainer is named only where the script calls it
    spec.write_text(spec.read_text().replace('"--config_file", "acc.yaml", ', '"--cpu", '))
    (orch.cwd / "ws" / "train.py").write_text('"""Fine-tuning without Hugging Face Trainer."""\nimport transformers\n')
    found = check(orch, spec)
    assert "accelerate config" not in found and "Trainer precision" not in found, found
    (orch.cwd / "ws" / "train.py").write_text("from transformers import TrainingArguments\n"
                                              "args = TrainingArguments(output_dir='out', bf16=True)\n")
    line = check(orch, spec)["Trainer precision"]
    assert line.startswith("Trainer precision not checked warn") and "--use_cpu True" in line, line
