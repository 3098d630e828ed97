"""Find, load and prepare the model: where it comes from, which parameters train, which precision.

Contracts:
- `resolve_model_path` turns `train.model` into a local folder or raises `TrainSetupError` with a
  one-line reason; it never hangs on an unreachable hub (a 5 s connect probe first).
- `load_model_and_tokenizer` returns the model in fp32 on the CPU (unless told a dtype or a k-bit
  quantization), and a tokenizer with a pad token.
- `apply_finetune` sets `requires_grad` (and wraps LoRA) before any DDP wrap, and raises
  `TrainSetupError` when a configured name matches nothing.
- `forward_inputs` gives the forward's keyword arguments and the matching targets for a batch;
  for packed rows (data.py) attention never crosses an example: flash-attention varlen through
  restarting `position_ids` on a flattened row, else an explicit block-diagonal causal mask.
- `labelled_logits` (with the head `label_head` found and checked) makes the model's forward compute
  logits only at a batch's labelled positions: the output head gets the final hidden states of
  those positions alone, so its matmul and the loss skip prompts, padding and last tokens. The loss
  and gradients are those of the full logits (the head is applied per position); the forward goes
  through every wrapper (DDP, FSDP, peft) as usual, only the head's input is narrowed.
- `fuse_activations` swaps parameter-free activation modules for torch's fused kernel of the same
  function; state dicts, checkpoints and exports are unchanged.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import socket
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import getproxies, proxy_bypass

import torch

from remote_payload.contract.train_config import TrainConfig, TrainSetupError
from remote_payload.trainer.data import Batch

log = logging.getLogger(__name__)

# Files a causal LM needs; other frameworks' weights (tf, flax, onnx, ...) are never downloaded.
_HUB_IGNORE = ["*.h5", "*.msgpack", "*.ot", "*.tflite", "*.onnx", "onnx/*", "coreml/*", "*.mlmodel", "*.bin"]


def resolve_model_path(name: str) -> Path:
    """A local folder for `name`: a folder that exists, a hub id, or `modelscope:ORG/NAME`."""
    if name.startswith("modelscope:"):
        return _from_modelscope(name.removeprefix("modelscope:"))
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or path.exists():
        raise TrainSetupError(f"model folder not found: {name} (relative paths resolve against {Path.cwd()})")
    return _from_hub(name)


def _from_hub(repo_id: str) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    def cached() -> Path | None:
        try:
            return Path(snapshot_download(repo_id, local_files_only=True, ignore_patterns=_HUB_IGNORE))
        except (LocalEntryNotFoundError, OSError):
            return None

    if constants.HF_HUB_OFFLINE:
        if (path := cached()) is None:
            raise TrainSetupError(f"model {repo_id} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set")
        return path
    endpoint = constants.ENDPOINT
    try:
        _probe(endpoint)
    except OSError as exc:
        if (path := cached()) is not None:
            log.warning("cannot reach %s (%s); using the cached copy of %s", endpoint, exc, repo_id)
            return path
        raise TrainSetupError(
            f"cannot reach the Hugging Face endpoint {endpoint} to download {repo_id} ({exc}); "
            "set HF_ENDPOINT (preset hf-mirror) or point train.model at a local folder"
        ) from None
    log.info("downloading %s from %s", repo_id, endpoint)
    try:
        path = Path(snapshot_download(repo_id, ignore_patterns=_HUB_IGNORE))
        if not any(path.glob("*.safetensors")):
            path = Path(snapshot_download(repo_id, allow_patterns=["*.bin", "*.json"]))
    except Exception as exc:  # huggingface_hub raises many types; the user needs the one line
        raise TrainSetupError(f"cannot download model {repo_id} from {endpoint}: {exc}") from None
    return path


def _probe(url: str, timeout: float = 5.0) -> None:
    """Open (and close) a TCP connection to `url`'s host, or to the proxy that would carry it
    (http(s)_proxy, e.g. AutoDL's network_turbo); raises OSError when it cannot."""
    target = urlparse(url)
    proxy = getproxies().get(target.scheme) if not proxy_bypass(target.hostname or "") else None
    hop = urlparse(proxy if "://" in (proxy or "://") else f"http://{proxy}") if proxy else target
    port = hop.port or (443 if hop.scheme == "https" else 80)
    socket.create_connection((hop.hostname or "", port), timeout=timeout).close()


def _from_modelscope(model_id: str) -> Path:
    try:
        from modelscope import snapshot_download
    except ImportError:
        raise TrainSetupError("train.model uses modelscope: but the modelscope package is not installed (pip install modelscope)") from None
    try:
        return Path(snapshot_download(model_id))
    except Exception as exc:
        raise TrainSetupError(f"cannot download modelscope:{model_id}: {exc}") from None


def load_model_and_tokenizer(path: Path, prefer_flash: bool = False, load_kwargs: dict | None = None) -> tuple[torch.nn.Module, object]:
    """The causal LM in fp32 on the CPU (trainable weights stay fp32 under autocast) and its tokenizer.

    `prefer_flash` (packing on a GPU under fp16/bf16 autocast): load with `flash_attention_2` when
    the `flash_attn` package is installed and the architecture supports it, else transformers'
    default attention (the packed rows then get a block-diagonal mask, see `forward_inputs`).
    `load_kwargs` override `from_pretrained`'s: `quantize.from_pretrained_kwargs` (a k-bit base on its
    GPU), or a `dtype` for a base that stays frozen (LoRA)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"dtype": torch.float32, **(load_kwargs or {})}
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = None
        if prefer_flash and importlib.util.find_spec("flash_attn") is not None:
            try:
                model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="flash_attention_2", **kwargs)
            except (ImportError, ValueError) as exc:
                log.info("flash_attention_2 unavailable (%s); packed rows use a block-diagonal mask", str(exc).splitlines()[0])
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as exc:
        raise TrainSetupError(f"cannot load a causal LM and tokenizer from {path}: {exc}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _matches(name: str, pattern: str) -> bool:
    return name == pattern or name.startswith(pattern + ".")


def apply_finetune(model: torch.nn.Module, cfg: TrainConfig) -> torch.nn.Module:
    """Mark the trainable parameters for `cfg.finetune`; for LoRA return the peft-wrapped model.

    partial: a parameter trains when its name, or a dotted prefix of it, is in
    `partial.trainable`. Names are taken with tied duplicates included, so GPT-2's `lm_head`
    (whose weight *is* `transformer.wte.weight`) can be named; training it trains the embedding.
    """
    if cfg.finetune == "full":
        model.requires_grad_(True)
        return model
    if cfg.finetune == "partial":
        assert cfg.partial is not None
        model.requires_grad_(False)
        params = list(model.named_parameters(remove_duplicate=False))
        unmatched = [p for p in cfg.partial.trainable if not any(_matches(n, p) for n, _ in params)]
        if unmatched:
            raise TrainSetupError(
                f"partial.trainable names match no parameter: {unmatched}; "
                f"top-level modules are {[n for n, _ in model.named_children()]}, e.g. {params[0][0]}"
            )
        for name, param in params:
            if any(_matches(name, p) for p in cfg.partial.trainable):
                param.requires_grad_(True)
        return model
    from peft import LoraConfig, get_peft_model

    assert cfg.lora is not None
    lora = LoraConfig(
        r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
        target_modules=cfg.lora.target_modules, task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, lora)
    except ValueError as exc:
        leaf_names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if not list(m.children())})
        raise TrainSetupError(f"lora.target_modules {cfg.lora.target_modules}: {str(exc).splitlines()[0]} (leaf module names: {leaf_names})") from None


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts; tied weights count once."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def hub_env_summary() -> str:
    """HF_ENDPOINT / offline settings, for the startup log."""
    return f"HF_ENDPOINT={os.environ.get('HF_ENDPOINT', '(default)')} HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '0')}"


def packing_mode(model: torch.nn.Module) -> str:
    """How packed rows keep examples apart, from the (unwrapped, possibly peft) model's attention:
    `varlen`: flash attention, rows flattened into one sequence whose restarting `position_ids`
    become the varlen kernel's cu_seqlens (as `DataCollatorWithFlattening`); `position_ids`:
    sliding-window models and other attention backends, where transformers derives the
    per-example mask from the restarts itself (`find_packed_sequence_indices`); `bool_mask`
    (sdpa) and `additive_mask` (eager): an explicit 4D block-diagonal causal mask."""
    config = model.config
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if "flash" in impl:
        return "varlen"
    if getattr(config, "sliding_window", None) or impl not in ("sdpa", "eager"):
        return "position_ids"
    return "bool_mask" if impl == "sdpa" else "additive_mask"


def forward_inputs(batch: Batch, mode: str | None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(keyword arguments for the model's forward, targets aligned with its logits).

    Unpacked batches (no `position_ids`): the input ids only; right padding under causal attention
    needs no mask. Packed: see `packing_mode`. No host sync here."""
    if batch.position_ids is None or batch.segment_ids is None:
        return {"input_ids": batch.input_ids}, batch.targets
    if mode == "varlen":  # (1, rows*width): padding runs are sequences of their own, without targets
        return {"input_ids": batch.input_ids.view(1, -1), "position_ids": batch.position_ids.view(1, -1)}, batch.targets.view(1, -1)
    inputs = {"input_ids": batch.input_ids, "position_ids": batch.position_ids}
    if mode in ("bool_mask", "additive_mask"):
        seg = batch.segment_ids
        width = seg.shape[1]
        causal = torch.ones(width, width, dtype=torch.bool, device=seg.device).tril()
        allowed = ((seg[:, :, None] == seg[:, None, :]) & causal).unsqueeze(1)  # (rows, 1, query, key)
        if mode == "additive_mask":
            dtype = torch.float32  # weights stay fp32; eager adds the mask to the scores
            allowed = torch.zeros(allowed.shape, dtype=dtype, device=seg.device).masked_fill_(~allowed, torch.finfo(dtype).min)
        inputs["attention_mask"] = allowed
    return inputs, batch.targets


@contextlib.contextmanager
def labelled_logits(head: torch.nn.Module | None, index: torch.Tensor | None):
    """While open, `head` (see `label_head`) sees only the hidden states at the flat positions
    `index` (`Batch.label_index`): the model's `logits` come out as (len(index), vocab), in the
    order of `index`. With `head` or `index` None the forward is untouched."""
    if head is None or index is None:
        yield
        return

    def narrow(module: torch.nn.Module, args: tuple) -> tuple:
        return (args[0].flatten(0, -2).index_select(0, index), *args[1:])

    handle = head.register_forward_pre_hook(narrow)
    try:
        yield
    finally:
        handle.remove()


def label_head(model: torch.nn.Module, device: torch.device,
               autocast: contextlib.AbstractContextManager) -> tuple[torch.nn.Module | None, str]:
    """(the module that turns the final hidden states into logits, "") when `labelled_logits` gives
    this model's own logits at the chosen positions, else (None, why not). Checked once on the
    unwrapped model, before any wrap: a no-grad forward in eval mode (no dropout, no random numbers
    drawn) of two short rows, full logits against the narrowed ones at three positions."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Module):
        return None, "the model names no output embeddings (get_output_embeddings)"
    vocab = getattr(model.config, "vocab_size", None) or 2
    ids = (torch.arange(8, device=device).view(2, 4) * 7 + 3) % vocab
    index = torch.tensor([1, 3, 6], device=device)  # positions in both rows, in the flattened order
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), autocast:
            full = model(input_ids=ids, use_cache=False).logits
            with labelled_logits(head, index):
                narrowed = model(input_ids=ids, use_cache=False).logits
    except Exception as exc:  # any failure of the narrowed forward means: not this model
        return None, f"a forward with the narrowed head failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    finally:
        model.train(was_training)
    expected = full.flatten(0, -2).index_select(0, index).float()
    if tuple(narrowed.shape) != tuple(expected.shape):
        return None, f"its logits came out {tuple(narrowed.shape)}, not {tuple(expected.shape)}"
    tol = 1e-4 if full.dtype == torch.float32 else 2e-2
    if not torch.allclose(narrowed.float(), expected, rtol=tol, atol=tol * float(expected.abs().max().clamp(min=1.0))):
        return None, "its logits at the chosen positions differ from the full forward's"
    return head, ""


class TanhGELU(torch.nn.Module):
    """GELU's tanh approximation, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), as torch's one fused
    kernel: the function transformers' `NewGELUActivation` (gelu_new) and `FastGELUActivation`
    (gelu_fast) compute in Python as some eight elementwise kernels forward and more backward, each
    a pass over the MLP's widest activation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x, approximate="tanh")


def fuse_activations(model: torch.nn.Module) -> int:
    """Replace every `NewGELUActivation` / `FastGELUActivation` module in `model` by `TanhGELU`
    (they hold no parameters or buffers); returns how many were replaced."""
    from transformers.activations import FastGELUActivation, NewGELUActivation

    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) in (NewGELUActivation, FastGELUActivation):
                setattr(parent, name, TanhGELU())
                replaced += 1
    return replaced
