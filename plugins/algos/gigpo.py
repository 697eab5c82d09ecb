"""GiGPO: episode-level plus step-level group-relative advantages for multi-turn agents.

Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training"
(arXiv:2505.10978). Trajectories of one task often pass through the same
observation (an *anchor state*: the start page, a room seen again). The turns that
answered the same anchor state are compared with each other, which gives each
turn its own credit without a critic.
"""

from __future__ import annotations

import torch

from omrl.algos import AdvantageInput, AlgoConfig, require_range
from omrl_plugins.algos.advantages import (
    broadcast_to_tokens,
    check_advantage_input,
    check_turn_input,
    episode_scores,
    group_normalize,
    reverse_discounted_sum,
    turns_to_tokens,
)


def step_advantages(
    turn_rewards: torch.Tensor,
    turn_state_ids: torch.Tensor,
    group_ids: torch.Tensor,
    gamma: float,
    use_std: bool,
    eps: float,
) -> torch.Tensor:
    """Step-level advantage of every turn. [bs, K], [bs, K], [bs] -> [bs, K] float32.

    A turn's return is its discounted reward-to-go over the row's later turns
    (gamma per turn). Turns with equal (group id, state id) form a step group; each
    return is normalised within its step group like GRPO. Turns in a step group of
    one, and padding turns (state id -1), get 0.
    """
    valid = turn_state_ids >= 0
    returns = reverse_discounted_sum(turn_rewards.float(), valid, gamma)
    keys = torch.stack([group_ids.long()[:, None].expand_as(turn_state_ids), turn_state_ids.long()], dim=-1)
    advantages = torch.zeros_like(returns)
    advantages[valid] = group_normalize(returns[valid], keys[valid], use_std, eps)
    return advantages


@torch.no_grad()
def gigpo(data: AdvantageInput, cfg: AlgoConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-in-Group Policy Optimization (Feng et al. 2025, arXiv:2505.10978).

    Reads token_rewards, loss_mask, turn_index [bs, T]; group_ids [bs];
    turn_rewards, turn_state_ids [bs, K]; cfg.gamma, cfg.gigpo_step_weight,
    cfg.norm_adv_by_std, cfg.eps.

    - Episode level: the GRPO advantage of the row's summed token rewards.
    - Step level: turns of the same group that answered the same observation
      (equal turn_state_ids, the anchor states) form step groups; each turn's
      discounted return from that turn on (cfg.gamma over turn_rewards) is
      normalised within its step group (divided by the std when
      cfg.norm_adv_by_std). Singleton step groups get 0.

    A token of turn k (``turn_index == k``) gets
    episode_adv + cfg.gigpo_step_weight * step_adv[k]. Returns (advantages,
    advantages), float32 [bs, T], 0 off the mask.
    """
    rewards, mask = check_advantage_input("gigpo", data)
    turn_index = check_turn_input("gigpo", data, turn_rewards=data.turn_rewards, turn_state_ids=data.turn_state_ids)
    gamma = require_range(cfg, "gamma", 0.0, 1.0)
    weight = require_range(cfg, "gigpo_step_weight", 0.0)

    episode = group_normalize(episode_scores(rewards, mask), data.group_ids, cfg.norm_adv_by_std, cfg.eps)
    per_turn = step_advantages(
        data.turn_rewards, data.turn_state_ids, data.group_ids, gamma, cfg.norm_adv_by_std, cfg.eps
    )
    advantages = broadcast_to_tokens(episode, mask) + weight * turns_to_tokens(per_turn, turn_index, mask)
    return advantages, advantages
