"""An example omrl plugin, packaged on its own: `pip install ./examples/omrl-plugin-example`.

It adds the env ``guess_number`` and the reward ``brevity``; omrl finds both through
the ``omrl`` entry-point group with no change to omrl itself.
"""

from __future__ import annotations

import random

from omrl.envs import Env, EpisodeFinishedError, Observation, StepResult, check_task
from omrl.hookspecs import hookimpl

TRAIN, TEST = range(0, 1000), range(1000, 1100)


class GuessNumberEnv(Env):
    """Guess a secret number from 1 to `high`; the env answers higher or lower."""

    action_help = "Reply with one whole number, e.g. 7."
    max_turns = 8

    def __init__(self, high: int = 20):
        self.high = high
        self.secret = 0
        self.done = True
        self.low_bound, self.high_bound = 1, high

    def task_ids(self, split):
        return {"train": TRAIN, "test": TEST}[split]

    def reset(self, task_id):
        check_task(self, task_id, range(TRAIN.start, TEST.stop))
        self.secret = random.Random(task_id).randint(1, self.high)
        self.done = False
        self.low_bound, self.high_bound = 1, self.high
        return Observation(f"I picked a number from 1 to {self.high}.", "Guess my number.")

    def step(self, action):
        if self.done:
            raise EpisodeFinishedError("the number was already guessed; reset first")
        try:
            guess = int(action.strip())
        except ValueError:
            return StepResult(
                f"{action!r} is not a whole number.", 0.0, False, {"won": False, "score": 0.0, "invalid": True}
            )
        if guess == self.secret:
            self.done = True
            return StepResult("Correct!", 1.0, True, {"won": True, "score": 1.0})
        if guess < self.secret:
            self.low_bound = max(self.low_bound, guess + 1)
            return StepResult("Higher.", 0.0, False, {"won": False, "score": 0.0})
        self.high_bound = min(self.high_bound, guess - 1)
        return StepResult("Lower.", 0.0, False, {"won": False, "score": 0.0})

    def expert_action(self):
        return str((self.low_bound + self.high_bound) // 2)


def brevity(episodes, max_turns: int = 8):
    """1 minus the share of the turn budget used, on the last turn."""
    return [[0.0] * (len(ep.turns) - 1) + [1.0 - len(ep.turns) / max_turns] if ep.turns else [] for ep in episodes]


@hookimpl
def register_envs(register):
    register("guess_number", GuessNumberEnv)


@hookimpl
def register_rewards(register):
    register("brevity", brevity)
