"""`data.neftune_alpha`: NEFTune noise on the input embeddings, in training forwards only.

Contract: `activate(model, alpha)` registers a forward hook on the model's input embedding module
(`get_input_embeddings()`, through a peft wrapper) that, while that module is in training mode,
returns `output + uniform(-m, m)` with m = alpha / sqrt(L x d), L = the batch's sequence length
(its second dimension, padding included) and d = the embedding width: the rule and the numbers
of transformers' `neftune_post_forward_hook` (transformers 5.x, as Trainer's `neftune_noise_alpha`
uses it). The noise comes from torch's global generator on the embedding's device, whose state
checkpoints save and restore per rank, so a resumed run draws the same noise. In eval mode
(evaluation, the start-up checks) the hook returns the output unchanged, and it never touches a
weight, so exported models carry no trace of it.
"""

from __future__ import annotations

import math

import torch
from torch.utils.hooks import RemovableHandle


def noisy(output: torch.Tensor, alpha: float) -> torch.Tensor:
    """`output` (batch, length, width) plus NEFTune's uniform noise of scale alpha / sqrt(length x width)."""
    scale = alpha / math.sqrt(output.size(1) * output.size(2))
    return output + torch.zeros_like(output).uniform_(-scale, scale)


def activate(model: torch.nn.Module, alpha: float) -> RemovableHandle:
    """Add the noise to `model`'s input embeddings in training mode (see the module contract)."""
    embeddings = model.get_input_embeddings()

    def hook(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return noisy(output, alpha) if module.training else output

    return embeddings.register_forward_hook(hook)
