"""The trainer's fast path by default: logits only at labelled positions (`logits: labels`), fused
activations (`activations: fused`), freed CPU memory kept (`host`).

The narrowed head must give the loss and the gradients of the full logits for every fine-tuning
mode (full, LoRA, frozen layers) and batch layout (padded alpaca, packed rows), in-process on
the tiny model loaded with from_pretrained; under real torchrun (2 processes, gloo, DDP) a run
with it ends with the weights of a run with `logits: all`. A model whose head does not fit falls
back to the full logits and says so. The fused GELU gives the model's own logits and gradients
and leaves the state dict alone. The CPU allocator setting is checked by page faults counted, not
by time.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from remote_payload.contract.train_config import TrainConfig
from remote_payload.trainer import data, distributed
from remote_payload.trainer import model as modeling
from remote_payload.trainer import setup as trainsetup
from remote_payload.trainer.loop import loss_sum
from tests.support.trainer import REPO, base_config, metrics, run

CPU_ONE = distributed.DistInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
MODES = {
    "full": {"finetune": "full", "lora": None},
    "lora": {"lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["c_attn", "c_fc"]}},
    "frozen layers": {"finetune": "partial", "lora": None, "partial": {"trainable": ["transformer.h.1", "lm_head"]}},
}


def _setup(assets: Path, monkeypatch: pytest.MonkeyPatch, mode: str, **data_options: object):
    monkeypatch.chdir(assets)
    d = {"train": "data/train.jsonl", "max_length": 64, **data_options}
    cfg = TrainConfig.model_validate(base_config(model="tiny-gpt2-nodrop", **MODES[mode], data=d))
    model, tokenizer = trainsetup.load_model(cfg, CPU_ONE, None)
    head = trainsetup.output_head(cfg, model, CPU_ONE, _no_autocast)
    examples = data.load_examples("data/train.jsonl", "alpaca", tokenizer, 64)[:16]
    return model, head, examples, modeling.packing_mode(model)


def _no_autocast():
    return torch.autocast("cpu", enabled=False)


def _loss_and_grads(model: torch.nn.Module, batch: data.Batch, packing: str | None,
                    head: torch.nn.Module | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = loss_sum(model, batch, _no_autocast(), packing, head)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("packed", [False, True])
def test_labelled_logits_give_the_full_loss_and_gradients(assets: Path, monkeypatch: pytest.MonkeyPatch, mode: str,
                                                          packed: bool) -> None:
    model, head, examples, packing = _setup(assets, monkeypatch, mode)
    assert head is not None and head is model.get_output_embeddings()
    batch = data.collate_packed(data.pack(examples, 64, seed=1), 0) if packed else data.collate(examples, 0)
    # alpaca: prompts masked, rows padded; the loss needs far fewer positions than the batch holds
    assert batch.label_index is not None and 0 < batch.label_index.numel() == batch.n_label_tokens < batch.targets.numel() // 2
    full_loss, full_grads = _loss_and_grads(model, batch, packing if packed else None, None)
    loss, grads = _loss_and_grads(model, batch, packing if packed else None, head)
    torch.testing.assert_close(loss, full_loss, rtol=1e-6, atol=1e-5)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert grads.keys() == full_grads.keys() == trainable and grads
    for name, grad in full_grads.items():  # float error of a different summation order, relative to the gradient's size
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-5 * float(grad.abs().max()),
                                   msg=lambda m: f"{name}: {m}")
    assert not head._forward_pre_hooks  # the narrowing is gone after the forward


def test_label_index_lists_exactly_the_positions_with_a_target(assets: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, examples, _ = _setup(assets, monkeypatch, "full")
    for batch in (data.collate(examples, 0), data.collate_packed(data.pack(examples, 64, seed=1), 0)):
        flat = batch.targets.flatten()
        assert batch.label_index.tolist() == [i for i, t in enumerate(flat.tolist()) if t != data.IGNORE]


class _ReshapingLM(torch.nn.Module):
    """A causal LM whose forward reshapes the head's output to (batch, seq, vocab) itself, as some
    architectures post-process logits: narrowing its head cannot work."""

    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(vocab_size=11)
        self.embed, self.head = torch.nn.Embedding(11, 4), torch.nn.Linear(4, 11)

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False) -> SimpleNamespace:
        b, t = input_ids.shape
        return SimpleNamespace(logits=self.head(self.embed(input_ids)).reshape(b, t, -1))


class _NoHeadLM(_ReshapingLM):
    def get_output_embeddings(self) -> None:
        return None


@pytest.mark.parametrize(("model", "reason"), [(_ReshapingLM(), "a forward with the narrowed head failed"),
                                               (_NoHeadLM(), "names no output embeddings")])
def test_a_model_whose_head_does_not_fit_falls_back_and_says_so(assets: Path, caplog: pytest.LogCaptureFixture,
                                                                model: torch.nn.Module, reason: str) -> None:
    cfg = TrainConfig.model_validate(base_config())
    with caplog.at_level("WARNING"):
        assert trainsetup.output_head(cfg, model, CPU_ONE, _no_autocast) is None
    assert [r.getMessage() for r in caplog.records if "logits: labels does not fit" in r.getMessage()] and reason in caplog.text
    assert model.training  # the probe leaves the mode as it found it
    caplog.clear()
    assert trainsetup.output_head(TrainConfig.model_validate(base_config(logits="all")), model, CPU_ONE, _no_autocast) is None
    assert not caplog.records  # asked for: nothing to say


def test_ddp_run_with_labelled_logits_ends_with_the_full_logits_weights(assets: Path, tmp_path: Path) -> None:
    """Real torchrun, 2 processes, gloo: DDP's gradient sync goes through the narrowed forward."""
    outs = {}
    for logits in ("labels", "all"):
        outs[logits] = tmp_path / logits
        cfg = base_config(model="tiny-gpt2-nodrop", finetune="full", lora=None, max_steps=4, log_every=1, save_every=4,
                          eval_every=4, logits=logits)
        result = run(outs[logits], cfg, assets, nproc=2)
        assert result.returncode == 0, result.stdout
        assert "does not fit" not in result.stdout
    rows = {k: [m for m in metrics(out) if "loss" in m or "eval_loss" in m] for k, out in outs.items()}
    for narrowed, full in zip(rows["labels"], rows["all"], strict=True):
        for key in ("loss", "grad_norm", "eval_loss"):
            if key in full:
                assert narrowed[key] == pytest.approx(full[key], rel=1e-5), key
    weights = {k: load_file(out / "outputs" / "model.safetensors") for k, out in outs.items()}
    assert weights["labels"].keys() == weights["all"].keys()
    for name, tensor in weights["all"].items():
        torch.testing.assert_close(weights["labels"][name], tensor, rtol=1e-4, atol=1e-6, msg=name)


def test_fused_activations_compute_the_models_own_function(assets: Path) -> None:
    from transformers import AutoModelForCausalLM
    from transformers.activations import NewGELUActivation

    models = [AutoModelForCausalLM.from_pretrained(assets / "tiny-gpt2-nodrop", dtype=torch.float32) for _ in range(2)]
    plain, fused = models
    keys = list(fused.state_dict())
    assert modeling.fuse_activations(fused) == fused.config.n_layer == 2  # one per MLP
    assert not any(isinstance(m, NewGELUActivation) for m in fused.modules())
    assert sum(isinstance(m, NewGELUActivation) for m in plain.modules()) == 2  # the control: gelu_new as loaded
    assert list(fused.state_dict()) == keys  # nothing saved differently
    ids = torch.arange(40).view(2, 20) * 11 % fused.config.vocab_size
    outs = []
    for model in models:
        logits = model(input_ids=ids, use_cache=False).logits
        logits.square().mean().backward()
        outs.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-5, atol=1e-6)
    for name, grad in outs[0][1].items():
        torch.testing.assert_close(outs[1][1][name], grad, rtol=1e-4, atol=1e-5 * float(grad.abs().max()))


def test_activations_model_keeps_the_models_modules(assets: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.activations import NewGELUActivation

    monkeypatch.chdir(assets)
    for activations, expected in (("model", 2), ("fused", 0)):
        cfg = TrainConfig.model_validate(base_config(activations=activations))
        model, _ = trainsetup.load_model(cfg, CPU_ONE, None)
        assert sum(isinstance(m, NewGELUActivation) for m in model.modules()) == expected


# Real training steps (GPT-2 shape, autograd, AdamW) of varying lengths, as a trainer's batches
# are: glibc's own adaptive thresholds settle on no steady state for this pattern (a step of
# the same size as one before can fault again). A fixed list of equal-size blocks is no test:
# glibc adapts to it within two steps and then faults no more than the kept heap.
_FAULTS = """
import resource, sys, torch
from remote_payload.trainer import host
if sys.argv[1] == "keep":
    assert host.keep_freed_memory()
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
torch.set_num_threads(1)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=512, n_positions=256))
optimizer = torch.optim.AdamW(model.parameters())
def step(length):
    ids = torch.randint(0, 512, (8, length))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()
for length in (256, 200, 256, 160):  # the busiest step first: what the kept heap holds
    step(length)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(16):
    step(160 + (i * 37) % 97)  # 160-256 tokens
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_kept_freed_memory_spares_the_page_faults_of_every_step() -> None:
    runs = {
        how: subprocess.Popen([sys.executable, "-c", _FAULTS, how], cwd=REPO, stdout=subprocess.PIPE, text=True)
        for how in ("default", "keep")
    }
    printed = {how: proc.communicate()[0] for how, proc in runs.items()}
    assert all(proc.returncode == 0 for proc in runs.values()), printed
    faults = {how: int(out) for how, out in printed.items()}
    # measured over 16 runs here, 8 at once: default glibc 48,000-107,000 faults (pages mapped
    # and zeroed anew); kept 9-3,900 (the heap grows now and then for a new layout of sizes)
    assert faults["keep"] * 5 < faults["default"], faults
