"""bench/gpu_check.py on a machine without a GPU: it compiles, `--dry-run` prints every step it
would take (installs from the registry only, models built from configs, the trainer runs with
their configs and `nproc_per_node` from nvidia-smi's count, the anchors, the file it writes) and
does none of them; a real run without a GPU stops with one line before installing anything; the
table replaces its own block in RESULTS.md. bench/gpu.sh and bench/trainer.py are checked for syntax."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_check.py"


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _run(args: list[str], path_dirs: list[Path], tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": os.pathsep.join([*map(str, path_dirs), os.environ["PATH"]])}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60, cwd=tmp)


@pytest.fixture(scope="module")
def two_gpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stand-in `nvidia-smi` whose `-L` lists two GPUs."""
    folder = tmp_path_factory.mktemp("smi")
    smi = folder / "nvidia-smi"
    smi.write_text('#!/bin/sh\n[ "$1" = -L ] || exit 2\necho "GPU 0: NVIDIA H200 (UUID: GPU-aaa)"\n'
                   'echo "GPU 1: NVIDIA H200 (UUID: GPU-bbb)"\n')
    smi.chmod(0o755)
    return folder


def test_the_bench_scripts_parse() -> None:
    for script in ("gpu_check.py", "trainer.py", "alpaca_data.py"):
        path = REPO / "bench" / script
        compile(path.read_text(), str(path), "exec")  # a SyntaxError fails the test
    done = subprocess.run(["bash", "-n", str(REPO / "bench" / "gpu.sh")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_dry_run_prints_every_step_and_does_nothing(tmp_path: Path, two_gpus: Path) -> None:
    work, results = tmp_path / "work", tmp_path / "RESULTS.md"
    done = _run(["--dry-run", "--work", str(work), "--results", str(results)], [two_gpus], tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    out = done.stdout
    assert not work.exists() and not results.exists()  # nothing built, run or written
    assert not any(tmp_path.glob("*.tmp"))

    installs = [ln for ln in out.splitlines() if ln.startswith("[install]")]
    for package in ("torch", "transformers", "peft", "bitsandbytes", "flash-attn", "trl==1.16.0", "datasets", "deepspeed"):
        assert any(ln.endswith(f" {package}") for ln in installs), package
    # The registry only, wheels only (flash-attn's sdist would download or compile), torch held; deepspeed, published
    # as source only, without build isolation (against the installed torch), no op compiled.
    wheels = [ln for ln in installs if not ln.endswith(" deepspeed")]
    assert all("-m pip install --only-binary=:all:" in ln and f"-c {work}/constraints.txt" in ln for ln in wheels)
    assert all("-m pip install --no-build-isolation" in ln and f"-c {work}/constraints.txt" in ln
               for ln in installs if ln.endswith(" deepspeed"))

    runs = [ln for ln in out.splitlines() if ln.startswith("[run] ") and "remote_payload.train" in ln]
    configs = [json.loads(ln.split("train.json ", 1)[1]) for ln in out.splitlines() if ln.startswith("[run]   train.json")]
    assert len(runs) == len(configs) == 10
    assert all("torch.distributed.run --standalone --nproc_per_node 2 " in ln for ln in runs)  # auto = nvidia-smi's 2
    by_check = {ln.split("[run] ", 1)[1].split(" (")[0]: cfg for ln, cfg in zip(runs, configs)}
    assert by_check["GPT-2 124M bf16"]["precision"] == "bf16" and by_check["GPT-2 124M bf16"]["model"] == "gpt2-124m"
    assert by_check["grad checkpointing"]["memory"]["gradient_checkpointing"] is True
    assert by_check["fp16 + GradScaler"]["precision"] == "fp16"
    assert (by_check["alpaca padded"]["data"]["packing"], by_check["alpaca packed"]["data"]["packing"]) == (False, True)
    qlora = by_check["Llama 1.1B QLoRA"]
    assert qlora["memory"]["quantize"] == "4bit" and qlora["export"]["merge_lora"] and qlora["finetune"] == "lora"
    # DDP against ZeRO-2/3 with offload: the same full fine-tune, only the strategy differs.
    ddp, zero2, zero3 = by_check["1.1B full, DDP"], by_check["DeepSpeed ZeRO-2"], by_check["DeepSpeed ZeRO-3"]
    assert ddp["finetune"] == "full" and "strategy" not in ddp and ddp["max_steps"] <= 8
    assert zero2["deepspeed"] == {"zero_stage": 2, "offload_optimizer": True}
    assert zero3["deepspeed"] == {"zero_stage": 3, "offload_optimizer": True, "offload_params": True}
    assert {k: v for k, v in zero3.items() if k not in ("strategy", "deepspeed")} == ddp
    # Every model is a folder the script builds from a config under WORK: no hub id anywhere.
    assert {cfg["model"] for cfg in configs} == {"gpt2-124m", "llama-1.1b"}
    assert f"-> {work}/gpt2-124m" in out and f"-> {work}/llama-1.1b" in out and "random init, no hub" in out
    assert not re.search(r"https?://|huggingface\.co|hf\.co/", out)

    anchors = next(ln for ln in out.splitlines() if ln.startswith("[run] anchors"))
    assert "bench/trainer.py --device cuda --model gpt2-124m" in anchors and "--layouts 2x4" in anchors
    assert "--impls ours,hf,hf-group,hf-flat,trl" in anchors
    assert "nproc_per_node auto" in out and "GPU queue" in out and "nvidia-smi -L here: 2 GPU(s)" in out
    assert f"to {results} between <!-- gpu-check --> and <!-- /gpu-check -->" in out


def test_without_a_gpu_a_real_run_stops_with_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "smi"  # an nvidia-smi that lists nothing, as on a machine without a driver's GPUs
    empty.mkdir()
    (empty / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    (empty / "nvidia-smi").chmod(0o755)
    done = _run(["--work", str(tmp_path / "work"), "--results", str(tmp_path / "R.md")], [empty], tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == "cannot run: nvidia-smi -L lists no GPU"
    assert not (tmp_path / "work").exists() and not (tmp_path / "R.md").exists()  # nothing installed or written
    bad = _run(["--dry-run", "--steps", "2"], [], tmp_path)
    assert bad.returncode == 2 and "--steps must be at least 5" in bad.stderr


def test_the_table_replaces_its_own_block_in_results(tmp_path: Path) -> None:
    gc = _gpu_check()
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\nkept above\n")
    gc.write_results("first table", results)
    assert results.read_text() == ("# Results\n\nkept above\n\n## GPU check (bench/gpu_check.py)\n\n"
                                   "<!-- gpu-check -->\nfirst table\n<!-- /gpu-check -->\n")
    results.write_text(results.read_text() + "\nkept below\n")
    gc.write_results("second table", results)
    text = results.read_text()
    assert "first table" not in text and text.count("<!-- gpu-check -->") == 1
    assert text.startswith("# Results\n\nkept above\n") and text.endswith("second table\n<!-- /gpu-check -->\n\nkept below\n")
    assert gc.table([("a", "b", "1", "2%", "3", "ok")]).splitlines() == [
        "| check | setup | tok/s | MFU | peak MiB | result |", "|---|---|---|---|---|---|", "| a | b | 1 | 2% | 3 | ok |"]


def test_rows_read_each_run_against_its_reference() -> None:
    """The result cells from run summaries (the shape `summarize` reads from metrics.jsonl)."""
    gc = _gpu_check()
    ctx = gc.Ctx(work=Path("/w"), steps=20, nproc=1, python=sys.executable, dry=False)
    runs = gc.plan_runs(ctx)

    def summary(tok_s: float, peak: float, **kw: object) -> dict:
        return {"tok_s": tok_s, "mfu": kw.get("mfu"), "peak": peak, "scales": kw.get("scales", [None] * 20),
                "losses": kw.get("losses", [2.0] * 20), "steps": 20, "packing": kw.get("packing"),
                "merged_mib": kw.get("merged_mib")}

    ctx.runs = {"bf16": summary(100_000, 20_000, mfu=0.41), "ckpt": summary(75_000, 5_000),
                "fp16": summary(90_000, 19_000, scales=[65536.0] * 3 + [16384.0] * 17),
                "padded": summary(50_000, 9_000), "packed": summary(80_000, 9_500, packing="bool_mask"),
                "lora-1b": summary(30_000, 12_000), "qlora-1b": summary(20_000, 4_800, merged_mib=4196.0)}
    gc.trainer_rows(ctx, runs, {"flash_attn": "not installed (pip found nothing)"})
    rows = {r[0]: r for r in ctx.rows}
    assert rows["GPT-2 124M bf16"][2:5] == ("100,000", "41.0%", "20,000")
    assert rows["grad checkpointing"][5] == "memory -75%, speed x0.75"
    assert rows["fp16 + GradScaler"][5] == "2 of 20 steps skipped, scale 16384, loss finite"
    assert rows["alpaca packed"][5] == "bool_mask (flash_attn not installed), x1.60 padded"
    assert rows["Llama 1.1B QLoRA"][5] == "memory -60% vs LoRA, merged 4,196 MiB"

    ctx.rows = []
    ctx.runs = {"bf16": {"error": "CUDA out of memory"}, "qlora-1b": {"error": "memory.quantize 4bit needs bitsandbytes"},
                "fp16": summary(90_000, 19_000, scales=[65536.0] * 20, losses=[float("nan")] * 20)}
    gc.trainer_rows(ctx, runs, {})
    rows = {r[0]: r for r in ctx.rows}
    assert rows["GPT-2 124M bf16"][2:] == ("", "", "", "CUDA out of memory")
    assert rows["grad checkpointing"][5] == "did not run" and rows["alpaca padded"][5] == "did not run"
    assert rows["fp16 + GradScaler"][5] == "0 of 20 steps skipped, scale 65536, loss NOT finite"
    assert rows["Llama 1.1B QLoRA"][5] == "memory.quantize 4bit needs bitsandbytes"
