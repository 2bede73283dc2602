"""The language-model loss from the last hidden states: the LM head, then the mean token cross-entropy in fp32.

Two ways to the same quantity (`training.chunkedLoss`):
- full (the default): the head's logits for every token of the micro batch, then `F.cross_entropy` on their fp32
  copy. For a 128k vocabulary these are the largest tensors of a step (4 x 2048 tokens: 4.2 GB of fp32 logits,
  held again by the log-softmax autograd keeps for backward).
- chunked: torch's `F.linear_cross_entropy` with `LinearCrossEntropyOptions`, which runs head and loss over chunks
  of tokens (recomputing each chunk's logits in backward), so no (tokens x vocab) tensor exists for the whole
  batch. The sums are grouped by chunk, so the loss and gradients differ from the full path's within float
  rounding; the run is still bitwise repeatable and resumes bitwise.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

# torch picks the chunk size and accumulation precision per device and dtype (fp32 accumulation for bf16).
CHUNKED = nn.LinearCrossEntropyOptions()


def lm_loss(hidden: torch.Tensor, head: nn.Linear, targets: torch.Tensor, *, chunked: bool = False) -> torch.Tensor:
    """Mean cross-entropy of `head(hidden)` (batch, seq, vocab) against `targets` (batch, seq)."""
    if not chunked:
        logits = head(hidden)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    weight: torch.Tensor = head.weight
    bias: torch.Tensor | None = head.bias
    device = hidden.device.type
    if torch.is_autocast_enabled(device):  # the head's matmul in the autocast dtype, as nn.Linear would run it
        dtype = torch.get_autocast_dtype(device)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    # Per-token losses, averaged here in fp32: the op's own mean of bf16 inputs is summed in bf16 (measured: 25.9
    # for a true 26.25 over 256 tokens). With reduction "none" its backward recomputes each chunk's gradients.
    per_token = F.linear_cross_entropy(hidden.flatten(0, 1), weight, targets.flatten(), linear_bias=bias,
                                       reduction="none", options=CHUNKED)
    return per_token.float().mean()


def head_output(hidden: torch.Tensor, head: nn.Linear, loss_fn: Callable[..., torch.Tensor],
                targets: torch.Tensor | None) -> torch.Tensor:
    """A decoder's last step, from its final normed hidden states: the logits, or with `targets` the mean loss
    through `loss_fn` (the model's own: parallelize.py may chunk or compile it)."""
    if targets is None:
        logits: torch.Tensor = head(hidden)
        return logits
    return loss_fn(hidden, head, targets)
