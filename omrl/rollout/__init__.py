"""The batched, token-exact multi-turn rollout (the reference design's ``run_llm_loop``).

:mod:`.loop` is the loop, :mod:`.live` an episode as it grows (shared with the search), :mod:`.pool`
the env instances, :mod:`.session` one env's session built from a config and :mod:`.mixed` a mixture's,
:mod:`.progress` the hooks a rollout calls as it goes, :mod:`.convert` episodes as readable records.

    with RolloutSession.from_config(cfg) as session:
        episodes = session.play(session.task_ids("train", 8), split="train", group_size=4, seed=0)

:func:`collect` is the loop itself, for callers that hold their own pool,
template, tokenizer and backend.
"""

from omrl.rollout.convert import episode_record, token_exact, write_jsonl
from omrl.rollout.loop import RolloutLimits, collect
from omrl.rollout.pool import EnvPool
from omrl.rollout.progress import RolloutProgress
from omrl.rollout.session import RolloutSession

__all__ = [
    "EnvPool",
    "RolloutLimits",
    "RolloutProgress",
    "RolloutSession",
    "collect",
    "episode_record",
    "token_exact",
    "write_jsonl",
]
