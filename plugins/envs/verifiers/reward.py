"""The ``verifiers_rubric`` reward: a verifiers rubric's reward of the episode, or one of its functions' values,
read from the last turn's ``verifiers_reward`` and ``verifiers_metrics`` (which the ``verifiers`` env writes)."""

from __future__ import annotations

from omrl.data.trajectory import Episode
from omrl.rewards import RewardError, episode_reward

REWARD = "verifiers_rubric"  # not the env's name: the reward reads its options under its own name


@episode_reward
def verifiers_reward(episode: Episode, metric: str = "") -> float:
    """The verifiers rubric's reward of the episode (its weighted sum of reward functions), on the last turn;
    with ``metric``, that function's or metric's value (``plugins.verifiers_rubric.metric=correct_answer``).

    An episode that omrl cut short (``max_turns``, ``max_context``, an empty reply) was never scored by the
    rubric: it gets 0. An episode of another env is an error.
    """
    info = episode.turns[-1].info
    if "verifiers_reward" not in info:
        if episode.end_reason != "done":
            return 0.0
        raise RewardError(
            f"reward {REWARD!r}: episode of env {episode.env!r} (task {episode.task_id}) has no verifiers score; "
            "it scores the episodes of verifiers environments"
        )
    if not metric:
        return float(info["verifiers_reward"])
    metrics = info.get("verifiers_metrics") or {}
    if metric not in metrics:
        raise RewardError(
            f"reward {REWARD!r}: env {episode.env!r} has no metric {metric!r}; its metrics: "
            f"{', '.join(sorted(metrics)) or '(none)'}"
        )
    return float(metrics[metric])
