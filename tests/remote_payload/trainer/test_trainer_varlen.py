"""The flash-attention varlen path of packed rows (model.py `packing_mode` "varlen"), on a CPU.

flash_attn needs a GPU, so the kernel is replaced by a CPU reference registered with transformers'
`AttentionInterface`: it derives cu_seqlens from the position ids the model passes down with
transformers' own `prepare_fa_kwargs_from_position_ids` (what `_flash_attention_forward` calls on a
GPU for a padding-free batch) and runs causal attention inside each sequence, as
`flash_attn_varlen_func` does. What is pinned: `forward_inputs(batch, "varlen")` flattens the rows
into one sequence whose position ids restart exactly at the examples' (and padding's) starts, the
cu_seqlens derived from them equal the segment boundaries, and the per-token losses equal the
block-diagonal masked path's (sdpa) on GPT-2 (learned positions) and a Llama-style model (RoPE).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

from remote_payload.trainer import data
from remote_payload.trainer import model as modeling

REFERENCE = "orch_varlen_reference"
SEEN: list[torch.Tensor] = []  # the cu_seqlens of every call of the reference kernel


def _varlen_reference(module, query, key, value, attention_mask, scaling=None, dropout=0.0, position_ids=None, **kw):
    """flash_attn_varlen_func's semantics from position ids: (batch 1, heads, tokens, dim) in,
    (1, tokens, heads, dim) out, as the flash integration returns it."""
    assert attention_mask is None and query.shape[0] == 1 and position_ids is not None
    (cu_q, _), _ = prepare_fa_kwargs_from_position_ids(position_ids)
    SEEN.append(cu_q)
    bounds = cu_q.tolist()
    groups = query.shape[1] // key.shape[1]  # grouped-query attention (Llama-style configs)
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = torch.cat([
        F.scaled_dot_product_attention(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=True, scale=scaling)
        for a, b in zip(bounds, bounds[1:])], dim=2)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(REFERENCE, _varlen_reference)


@pytest.fixture(scope="module")
def packed(assets: Path) -> data.Batch:
    tok = AutoTokenizer.from_pretrained(assets / "tiny-gpt2-nodrop")
    examples = data.load_examples(assets / "data" / "train.jsonl", "alpaca", tok, 64)[:24]
    rows = data.pack(examples, 64, seed=3)
    assert max(len(r.examples) for r in rows) >= 2 and min(map(len, rows)) < max(map(len, rows))  # padding too
    return data.collate_packed(rows, pad_id=0)


def _llama(vocab: int) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, attention_dropout=0.0)
    return LlamaForCausalLM(cfg)


def _losses(model: torch.nn.Module, batch: data.Batch, mode: str) -> torch.Tensor:
    inputs, targets = modeling.forward_inputs(batch, mode)
    with torch.no_grad():
        logits = model(**inputs, use_cache=False).logits
    flat = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=data.IGNORE, reduction="none")
    return flat.view(batch.targets.shape)


def test_a_flash_attention_model_packs_varlen() -> None:
    for impl in ("flash_attention_2", "flash_attention_3"):
        assert modeling.packing_mode(SimpleNamespace(config=SimpleNamespace(_attn_implementation=impl))) == "varlen"


def test_varlen_inputs_restart_positions_at_every_segment_and_cu_seqlens_match(packed: data.Batch) -> None:
    inputs, targets = modeling.forward_inputs(packed, "varlen")
    rows, width = packed.input_ids.shape
    assert set(inputs) == {"input_ids", "position_ids"}  # no mask: the kernel gets the boundaries from positions
    assert inputs["input_ids"].shape == inputs["position_ids"].shape == targets.shape == (1, rows * width)
    # The boundaries as data.py laid them out: a new segment (example or padding run) or a new row.
    seg = packed.segment_ids.reshape(-1)
    starts = [i for i in range(rows * width) if i % width == 0 or seg[i] != seg[i - 1]]
    (cu_q, cu_k), (max_q, _) = prepare_fa_kwargs_from_position_ids(inputs["position_ids"])
    assert cu_q.tolist() == cu_k.tolist() == [*starts, rows * width]
    assert int(max_q) == max(b - a for a, b in zip(cu_q.tolist(), cu_q.tolist()[1:]))
    # Targets never point across a boundary: the last token of every sequence has none.
    assert all(targets[0, b - 1] == data.IGNORE for b in cu_q.tolist()[1:])


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_varlen_losses_equal_the_masked_path(assets: Path, packed: data.Batch, arch: str) -> None:
    if arch == "gpt2":
        model = AutoModelForCausalLM.from_pretrained(assets / "tiny-gpt2-nodrop", dtype=torch.float32).eval()
    else:
        model = _llama(int(packed.input_ids.max()) + 1).eval()
    model.set_attn_implementation("sdpa")
    masked = _losses(model, packed, "bool_mask")
    model.set_attn_implementation(REFERENCE)
    SEEN.clear()
    varlen = _losses(model, packed, "varlen")
    assert len(SEEN) == model.config.num_hidden_layers and SEEN[0].numel() > packed.input_ids.shape[0] + 1
    torch.testing.assert_close(varlen, masked, atol=2e-5, rtol=1e-5)
    label = packed.targets != data.IGNORE
    assert varlen[label].mean().item() == pytest.approx(masked[label].mean().item(), rel=1e-6)
    # The control: positions that restart only at each row's start (examples see each other) change the losses.
    rows, width = packed.input_ids.shape
    joined = data.Batch(packed.input_ids, packed.attention_mask, packed.targets, packed.n_tokens, packed.n_label_tokens,
                        torch.arange(width).repeat(rows, 1), packed.segment_ids)
    assert (_losses(model, joined, "varlen") - masked)[label].abs().max() > 1e-2


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_varlen_with_logits_at_labels_only_gives_the_masked_paths_loss_and_gradients(assets: Path, packed: data.Batch,
                                                                                      arch: str) -> None:
    """The default `logits: labels` on the flattened varlen row (1, rows x width): the batch's
    label positions index that row as they index the (rows, width) targets."""
    from remote_payload.trainer.loop import loss_sum

    if arch == "gpt2":
        model = AutoModelForCausalLM.from_pretrained(assets / "tiny-gpt2-nodrop", dtype=torch.float32)
    else:
        model = _llama(int(packed.input_ids.max()) + 1)
    head, why_not = modeling.label_head(model, torch.device("cpu"), contextlib.nullcontext())
    assert head is not None, why_not

    def loss_and_grads(mode: str, head: torch.nn.Module | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.set_attn_implementation("sdpa" if mode == "bool_mask" else REFERENCE)
        model.zero_grad(set_to_none=True)
        loss = loss_sum(model, packed, contextlib.nullcontext(), mode, head)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    masked_loss, masked_grads = loss_and_grads("bool_mask", None)
    loss, grads = loss_and_grads("varlen", head)
    torch.testing.assert_close(loss, masked_loss, rtol=1e-5, atol=1e-4)
    for name, grad in masked_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-4 * float(grad.abs().max()), msg=name)
