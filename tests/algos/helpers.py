"""What the tests of the masked policy losses share: a mask of three rows with gaps, a float64 batch, and
the checks every such loss must pass whatever its maths."""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest
import torch

from omrl.algos import AlgoConfig, PolicyLossInput
from omrl.errors import ConfigError

# row 0: two turns with env tokens between and after them; row 1: one turn; row 2: no model token
MASK = [[1, 1, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]]
MASKS = pytest.mark.parametrize("mask", [MASK, [[0] * 7] * 3], ids=["gaps", "no-token"])
"""The masks whose off-mask garbage a loss must never read: MASK's gaps, and no token at all."""


def loss_input(log_probs, old_log_probs, advantages, mask=MASK) -> PolicyLossInput:
    """float64 inputs; log_probs a leaf that takes gradients."""
    return PolicyLossInput(
        log_probs=torch.tensor(log_probs, dtype=torch.float64, requires_grad=True),
        old_log_probs=torch.tensor(old_log_probs, dtype=torch.float64),
        advantages=torch.tensor(advantages, dtype=torch.float64),
        loss_mask=torch.tensor(mask),
    )


def check_garbage_off_the_mask_is_unread(loss_fn: Callable, data: PolicyLossInput, config: AlgoConfig) -> None:
    """``loss_fn`` on ``data``, whose log-probs, old log-probs and advantages off its mask are NaN or
    infinite: the loss, its gradient and every metric are finite, and no token off the mask gets a gradient."""
    loss, metrics = loss_fn(data, config)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(data.log_probs.grad).all()
    assert (data.log_probs.grad[~data.loss_mask.bool()] == 0).all()
    assert all(math.isfinite(v) for v in metrics.values())


def check_config_refused(loss_fn: Callable, fields: dict[str, Any], message: str) -> None:
    """``loss_fn`` refuses a config of ``fields`` with a ConfigError matching ``message`` (on a batch of one token)."""
    with pytest.raises(ConfigError, match=message):
        loss_fn(loss_input([[0.0]], [[0.0]], [[1.0]], mask=[[1]]), AlgoConfig(**fields))
