"""What every recipe does the same way: seeding, and skipping updates that are not finite."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from omrl.errors import NonFiniteLossError


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA) from one number."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class SkippedUpdates:
    """Counts updates a recipe skipped (metric and checkpoint key ``skipped_updates``) and stops
    the run after ``max_nan_in_a_row`` non-finite ones in a row (``optim.max_nan_steps``)."""

    def __init__(self, max_nan_in_a_row: int) -> None:
        self.max_nan_in_a_row = max_nan_in_a_row
        self.count = 0  # updates skipped in the whole run
        self.nan_in_a_row = 0
        self.reasons: dict[str, int] = {}  # why, and how often (kept in checkpoints: a resumed run says them)

    def skip(self, why: str, logger: Any, step: int, nan: bool = False) -> dict[str, float]:
        """Record an update skipped in ``step`` (``nan``: because a loss or gradient was not finite),
        warn with ``why``, and return the metric to log."""
        self.count += 1
        self.reasons[why] = self.reasons.get(why, 0) + 1
        logger.warn(f"step {step}: skipped the update: {why} ({self.count} skipped so far)")
        if nan:
            self.nan_in_a_row += 1
            if self.nan_in_a_row >= self.max_nan_in_a_row:
                raise NonFiniteLossError(
                    f"{self.nan_in_a_row} updates in a row (up to step {step}) had a non-finite loss or gradient "
                    f"(optim.max_nan_steps={self.max_nan_in_a_row}); lower optim.learning_rate, use float32 "
                    "instead of bf16, or check the data and rewards"
                )
        return self.metrics()

    def applied(self) -> None:
        """An update went through: the run of non-finite ones is over."""
        self.nan_in_a_row = 0

    def metrics(self) -> dict[str, float]:
        return {"skipped_updates": float(self.count)}

    def state_dict(self) -> dict[str, Any]:
        return {"skipped_updates": self.count, "nan_in_a_row": self.nan_in_a_row, "skipped_reasons": dict(self.reasons)}

    def load_state_dict(self, extra: dict[str, Any]) -> None:
        """From a checkpoint's extra state (also the names omrl 0.1 saved: skipped_steps, nan_streak)."""
        self.count = int(extra.get("skipped_updates", extra.get("skipped_steps", 0)))
        self.nan_in_a_row = int(extra.get("nan_in_a_row", extra.get("nan_streak", 0)))
        self.reasons = {str(why): int(count) for why, count in (extra.get("skipped_reasons") or {}).items()}
