"""What every recipe does the same way: seeding, and skipping updates that are not finite."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from omrl.errors import NonFiniteLossError, NothingLearned


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA) from one number."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


#: the words of the reasons to skip an update that are no failure: the step's groups held no signal (every
#: sample of a task earned the same reward, so no advantage, no group dynamic sampling keeps, no DPO pair)
NO_SIGNAL = ("advantage is 0", "no trainable episode", "no preference pair")


class SkippedUpdates:
    """Counts updates a recipe skipped (metric and checkpoint key ``skipped_updates``) and stops
    the run after ``max_nan_in_a_row`` non-finite ones in a row (``optim.max_nan_steps``)."""

    def __init__(self, max_nan_in_a_row: int) -> None:
        self.max_nan_in_a_row = max_nan_in_a_row
        self.count = 0  # updates skipped in the whole run
        self.applied_count: int | None = 0  # optimizer steps applied (None: a checkpoint from before they were kept)
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
        self.applied_count = (self.applied_count or 0) + 1

    def metrics(self) -> dict[str, float]:
        return {"skipped_updates": float(self.count)}

    def state_dict(self) -> dict[str, Any]:
        kept = {"skipped_updates": self.count, "nan_in_a_row": self.nan_in_a_row, "skipped_reasons": dict(self.reasons)}
        return {**kept, "applied_updates": self.applied_count}

    def load_state_dict(self, extra: dict[str, Any]) -> None:
        """From a checkpoint's extra state (also the names omrl 0.1 saved: skipped_steps, nan_streak)."""
        self.count = int(extra.get("skipped_updates", extra.get("skipped_steps", 0)))
        self.nan_in_a_row = int(extra.get("nan_in_a_row", extra.get("nan_streak", 0)))
        self.reasons = {str(why): int(count) for why, count in (extra.get("skipped_reasons") or {}).items()}
        applied = extra.get("applied_updates")
        self.applied_count = int(applied) if applied is not None else None

    def check_learned(self, updates: int, output_dir: Any, logger: Any) -> None:
        """At a run's end, after its model is saved: when each of its ``updates`` was skipped, say why most
        often and what would change it. A run that could not update (a loss not finite, every token dropped)
        raises :class:`NothingLearned`, so it does not exit 0; one whose every sample of a task earned the
        same reward made no mistake (GRPO has nothing to learn from such groups): a warning."""
        if not updates or self.applied_count or (self.applied_count is None and self.count < updates):
            return  # an update went through (with mini-batches, a step may apply some and skip others)
        why = max(self.reasons, key=self.reasons.get) if self.reasons else "see the warnings above"  # type: ignore[arg-type]
        said = f"every one of this run's {updates} updates was skipped, so the model in {output_dir} is the model it started from; the most common reason: {why}"
        if all(any(words in reason for words in NO_SIGNAL) for reason in self.reasons):
            logger.warn(
                f"{said}; every sample of a task earned the same reward, most often none: start from a model that "
                "sometimes succeeds (more SFT epochs, a higher optim.learning_rate for a small model), or raise "
                "group_size or generation.temperature so samples differ"
            )
            return
        raise NothingLearned(said)
