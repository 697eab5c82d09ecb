"""Lockstep micro-batches for sharded strategies (FSDP, ZeRO-3).

Sharded weights are gathered in every forward and their gradients reduce-scattered in every
backward: each process must run the same modules the same number of times. A process with
fewer micro-batches than another in a step therefore runs *idle passes* after its real ones:
the same forward on a dummy row, then a zero loss backward, so it joins every collective and
changes no gradient.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, TypeVar

import torch

T = TypeVar("T")


def idle_batch(device: torch.device) -> dict[str, torch.Tensor]:
    """The dummy row of an idle pass: two tokens, the second one trained on (RL reads ``loss_mask``;
    SFT reads ``labels``, shifted: position 0 predicts token 1, -100 where nothing is trained)."""
    ids = torch.zeros((1, 2), dtype=torch.long, device=device)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "position_ids": torch.arange(2)[None].to(ids),
        "loss_mask": torch.tensor([[0, 1]]).to(ids),
        "labels": torch.tensor([[0, -100]]).to(ids),
    }


def lockstep(
    items: Iterable[T],
    idle: Callable[[dict[str, torch.Tensor]], Any] | None,
    backward: bool,
    device: torch.device,
    run_backward: Callable[[torch.Tensor], None],
) -> Iterator[T]:
    """Yield ``items``, then run as many idle passes as another process has more micro-batches.
    ``idle(batch)`` runs what a real micro-batch runs; ``run_backward`` is the strategy's backward."""
    items = list(items)
    most = torch.tensor([len(items)], device=device)
    torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX)
    yield from items
    for _ in range(int(most) - len(items)):
        if idle is None:
            raise RuntimeError("a sharded step needs an idle forward: pass idle= to micro_batches")
        with torch.set_grad_enabled(backward):
            loss = _zero_loss(idle(idle_batch(device)))
        if backward:
            run_backward(loss)


def _zero_loss(out: Any) -> torch.Tensor:
    """0 x the sum of every floating tensor in ``out`` (a tensor, or dicts and sequences of them):
    a loss whose backward reaches every module the forward ran and adds nothing."""
    if torch.is_tensor(out):
        return out.float().sum() * 0.0 if out.is_floating_point() else torch.zeros(())
    parts = out.values() if isinstance(out, dict) else out if isinstance(out, (list, tuple)) else []
    return sum((_zero_loss(part) for part in parts), torch.zeros(()))
