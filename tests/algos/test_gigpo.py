"""GiGPO: episode-level plus anchor-state step-level advantages, worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from omrl.algos import AdvantageInput, AlgoConfig
from omrl.errors import OmrlError
from omrl_plugins.algos.gigpo import gigpo, step_advantages

S = math.sqrt(0.5)  # 0.70711: GRPO advantage of [1, 0] (see test_grpo_two_groups_of_two)

# token layout of every row: [prompt, turn 0, turn 0, observation, turn 1, turn 1]
MASK = [0, 1, 1, 0, 1, 1]
TURN_INDEX = [-1, 0, 0, -1, 1, 1]


def two_trajectories(group_ids=(0, 0), b_state_ids=(10, 12)) -> AdvantageInput:
    """Trajectory A: states [10, 11], turn rewards [0, 1]. Trajectory B: states b_state_ids, rewards [0, 0].

    Both answered observation 10 at turn 0 (the anchor state); A won (reward 1 on its last token).
    """
    token_rewards = torch.zeros(2, 6)
    token_rewards[0, 5] = 1.0
    return AdvantageInput(
        token_rewards=token_rewards,
        loss_mask=torch.tensor([MASK, MASK]),
        group_ids=torch.tensor(group_ids),
        turn_index=torch.tensor([TURN_INDEX, TURN_INDEX]),
        turn_rewards=torch.tensor([[0.0, 1.0], [0.0, 0.0]]),
        turn_state_ids=torch.tensor([[10, 11], list(b_state_ids)]),
    )


def on_tokens(turn0: float, turn1: float) -> list[float]:
    return [0.0, turn0, turn0, 0.0, turn1, turn1]


def test_gigpo_shared_anchor_state():
    # Episode level (GRPO): scores A=1, B=0 -> A +0.70711, B -0.70711.
    # Turn returns with gamma 0.5: A turn 0 = 0 + 0.5 * 1 = 0.5, A turn 1 = 1; B: 0, 0.
    # Step groups: state 10 = {A turn 0 (0.5), B turn 0 (0)}: mean 0.25, unbiased std 0.35355
    #   -> A +0.70711, B -0.70711. States 11 and 12 are singletons -> 0.
    # Tokens (weight 1): A turn 0: 0.70711 + 0.70711 = 1.41421, A turn 1: 0.70711 + 0
    #                    B turn 0: -1.41421,                   B turn 1: -0.70711
    advantages, returns = gigpo(two_trajectories(), AlgoConfig(gamma=0.5))
    expected = torch.tensor([on_tokens(2 * S, S), on_tokens(-2 * S, -S)])
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(returns, advantages)


def test_gigpo_step_weight_scales_the_step_term():
    # A turn 0: 0.70711 + 0.5 * 0.70711 = 1.06066; the singleton turns are unchanged
    advantages, _ = gigpo(two_trajectories(), AlgoConfig(gamma=0.5, gigpo_step_weight=0.5))
    expected = torch.tensor([on_tokens(1.5 * S, S), on_tokens(-1.5 * S, -S)])
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=0)


def test_gigpo_without_std_uses_mean_centred_returns():
    # episode: 1 - 0.5 = +0.5, 0 - 0.5 = -0.5; step (state 10): 0.5 - 0.25 = +0.25, 0 - 0.25 = -0.25
    advantages, _ = gigpo(two_trajectories(), AlgoConfig(gamma=0.5, norm_adv_by_std=False))
    expected = torch.tensor([on_tokens(0.75, 0.5), on_tokens(-0.75, -0.5)])
    torch.testing.assert_close(advantages, expected)


def test_same_state_in_different_task_groups_is_not_a_step_group():
    # The trajectories are now samples of two tasks: each is a singleton at both levels.
    advantages, _ = gigpo(two_trajectories(group_ids=(0, 1)), AlgoConfig(gamma=0.5))
    assert torch.equal(advantages, torch.zeros(2, 6))


def test_step_advantages_skip_padding_turns():
    # Row 1 has one real turn (state 10) and a padding turn (-1) that must stay 0
    # and must not join a step group with other padding turns.
    # Returns (gamma 1): row 0 [0 + 1, 1] = [1, 1]; row 1 [2, -]; row 2 [0, -]
    # state 10 group: {1, 2, 0}: mean 1, no std -> [0, 1, -1]; state 11 singleton -> 0
    turn_rewards = torch.tensor([[0.0, 1.0], [2.0, 7.0], [0.0, 3.0]])
    state_ids = torch.tensor([[10, 11], [10, -1], [10, -1]])
    step = step_advantages(turn_rewards, state_ids, torch.zeros(3, dtype=torch.long), 1.0, False, 1e-6)
    torch.testing.assert_close(step, torch.tensor([[0.0, 0.0], [1.0, 0.0], [-1.0, 0.0]]))


def test_gigpo_needs_turn_fields():
    data = AdvantageInput(torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1, dtype=torch.long))
    with pytest.raises(OmrlError, match="gigpo needs AdvantageInput.turn_index, turn_rewards, turn_state_ids"):
        gigpo(data, AlgoConfig())


def test_gigpo_rejects_turn_index_past_the_turns():
    data = two_trajectories()
    data.turn_index = torch.tensor([TURN_INDEX, [-1, 0, 0, -1, 2, 2]])
    with pytest.raises(OmrlError, match=r"turn_index reaches 2 but turn_rewards has only K=2"):
        gigpo(data, AlgoConfig())
