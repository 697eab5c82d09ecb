"""omrl's built-in reward functions.

Each follows one calling convention, ``fn(episodes, **options) -> list[list[float]]``
(one float per turn of each episode; see :mod:`omrl.rewards`). Options come from
the config's ``plugins`` block, keyed by reward name (``plugins.rm.path=DIR``).
"""

from omrl.hookspecs import hookimpl
from omrl_plugins.rewards.answers import math_verify_reward, numeric_match_reward
from omrl_plugins.rewards.judge import check_judge_options, check_judge_reachable, judge_reward
from omrl_plugins.rewards.outcome import accuracy_reward, bleu_reward, exact_match_reward, goal_reward
from omrl_plugins.rewards.reward_model import check_rm_options, check_rm_tokenizer, rm_reward
from omrl_plugins.rewards.shaping import format_reward, length_penalty, process_reward, tag_count_reward

REWARDS = {
    "goal": goal_reward,
    "format": format_reward,
    "length_penalty": length_penalty,
    "tag_count": tag_count_reward,
    "exact_match": exact_match_reward,
    "accuracy": accuracy_reward,
    "numeric_match": numeric_match_reward,
    "math_verify": math_verify_reward,
    "bleu": bleu_reward,
    "process": process_reward,
    "rm": rm_reward,
    "judge": judge_reward,
}


@hookimpl
def register_rewards(register):
    traits = {  # what is checked before a run plays: options, and whether the policy's ids can be scored
        "judge": {"check_options": check_judge_options, "check_reachable": check_judge_reachable},
        "rm": {"check_options": check_rm_options, "check_tokenizer": check_rm_tokenizer},
    }
    for name, fn in REWARDS.items():
        register(name, fn, **traits.get(name, {}))
