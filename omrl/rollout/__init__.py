"""The batched, token-exact multi-turn rollout (the reference design's ``run_llm_loop``).

:mod:`.loop` is the loop (its replies from :mod:`.replies`: turn by turn, or as they come), :mod:`.live` an episode as it grows (shared with the search), :mod:`.pool`
the env instances, :mod:`.session` a run's envs (one, or a mixture's) built from a config, :mod:`.spec`
what a play is asked and gives back, :mod:`.progress` the hooks a rollout calls as it goes,
:mod:`.convert` episodes as readable records; :mod:`.seats` plays games of several agents, a chat per
seat, round by round (:mod:`.seat_rounds`), :mod:`.seating` says who plays each seat and :mod:`.outcomes`
how the policy's seats fared.

    with RolloutSession.from_config(cfg) as session:
        played = session.play(session.task_ids("train", 8), PlaySpec(split="train", group_size=4))
        played.episodes, played.rewards

:func:`collect` is the loop itself, for callers that hold their own pool,
template, tokenizer and backend.
"""

from omrl.rollout.convert import episode_record, token_exact, write_jsonl
from omrl.rollout.loop import collect
from omrl.rollout.pool import EnvPool
from omrl.rollout.progress import RolloutProgress
from omrl.rollout.session import RolloutSession, SessionEnv
from omrl.rollout.spec import Played, PlaySpec, RolloutLimits

__all__ = [
    "EnvPool",
    "PlaySpec",
    "Played",
    "RolloutLimits",
    "RolloutProgress",
    "RolloutSession",
    "SessionEnv",
    "collect",
    "episode_record",
    "token_exact",
    "write_jsonl",
]
