"""Find, load and prepare the model: where it comes from, which parameters train, which precision.

Contracts:
- `resolve_model_path` turns `train.model` into a local folder or raises `TrainSetupError` with a
  one-line reason; it never hangs on an unreachable hub (a 5 s connect probe first).
- `load_model_and_tokenizer` returns the model in fp32 on the CPU, and a tokenizer with a pad token.
- `apply_finetune` sets `requires_grad` (and wraps LoRA) before any DDP wrap, and raises
  `TrainSetupError` when a configured name matches nothing.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import getproxies, proxy_bypass

import torch

from remote_payload.config import TrainConfig, TrainSetupError

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


def load_model_and_tokenizer(path: Path) -> tuple[torch.nn.Module, object]:
    """The causal LM in fp32 (trainable weights stay fp32 under autocast) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
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


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for `precision` on `device`, None for fp32; raises if unsupported."""
    if device.type == "cuda":
        bf16_ok = torch.cuda.is_bf16_supported()
        if precision == "auto":
            return torch.bfloat16 if bf16_ok else torch.float16
        if precision == "bf16" and not bf16_ok:
            raise TrainSetupError(f"precision bf16 is not supported on {torch.cuda.get_device_name(device)}; use fp16 or auto")
    elif precision == "auto":
        return None  # bf16 autocast measured ~20x slower than fp32 on CPUs without AMX
    return {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]


def hub_env_summary() -> str:
    """HF_ENDPOINT / offline settings, for the startup log."""
    return f"HF_ENDPOINT={os.environ.get('HF_ENDPOINT', '(default)')} HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '0')}"
