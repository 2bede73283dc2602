"""forward_backward hands the step's losses over as soon as they are known (after the last forward, before its
backward), so the loop's loss and stop-flag reduction overlaps the backward; the gradients and losses are those of
a call without the hook."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from flywheel.layout.shape import ModelShape
from flywheel.trainer.models.registry import build_model
from flywheel.trainer.step import forward_backward

SHAPE = ModelShape(layers=1, dim=32, heads=2, vocab=64, seq_len=16, architecture="llama", kv_heads=1, ffn=64,
                   max_positions=16, activation="silu")


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    return [(torch.randint(0, SHAPE.vocab, (2, SHAPE.seq_len), generator=gen),
             torch.randint(0, SHAPE.vocab, (2, SHAPE.seq_len), generator=gen)) for _ in range(n)]


def test_losses_are_handed_over_before_the_last_backward() -> None:
    model = build_model(SHAPE, seed=0)
    weight = model.head.weight
    seen: list[tuple[float, float, torch.Tensor | None]] = []

    def ready(loss: torch.Tensor, aux: torch.Tensor) -> None:
        grad = weight.grad
        seen.append((loss.item(), aux.item(), None if grad is None else grad.clone()))

    loss, aux = forward_backward(model, _batches(3), torch.device("cpu"), nullcontext(), losses_ready=ready)
    assert len(seen) == 1
    handed_loss, handed_aux, grad_then = seen[0]
    assert handed_loss == loss.item() and handed_aux == aux.item() == 0.0
    # Two of the three micro batches' gradients were accumulated then; the last backward had not run yet.
    assert grad_then is not None and weight.grad is not None and not torch.equal(grad_then, weight.grad)


def test_the_hook_changes_no_gradient_or_loss() -> None:
    with_hook, without = build_model(SHAPE, seed=0), build_model(SHAPE, seed=0)
    a = forward_backward(with_hook, _batches(2), torch.device("cpu"), nullcontext(), losses_ready=lambda *_: None)
    b = forward_backward(without, _batches(2), torch.device("cpu"), nullcontext())
    assert torch.equal(a[0], b[0])
    for (name, p), q in zip(with_hook.named_parameters(), without.parameters()):
        assert p.grad is not None and torch.equal(p.grad, q.grad), name
