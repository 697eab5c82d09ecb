"""Advantage estimators: ``fn(data: AdvantageInput, cfg: AlgoConfig) -> (advantages, returns)``.

Both outputs are float32 [bs, T] and exactly 0 where ``loss_mask`` is 0.
Rewards are read on response tokens only (the reward allocation puts them
there). Critic-free estimators return their advantages as ``returns`` too: with
no critic there is no value target.

Group estimators compare rows with equal ``group_ids`` (the G samples of one
task). A group of one has no baseline to compare with, so its rows get advantage
0. Grouping is vectorised (``torch.unique`` + ``index_add``), never a Python loop
over rows or tokens.
"""

from __future__ import annotations

import torch

from omrl.algos import AdvantageInput, AlgoConfig, masked_mean, require_present, require_range, require_same_shape
from omrl.errors import OmrlError

# -- shared helpers ----------------------------------------------------------


def check_advantage_input(fn_name: str, data: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
    """Check the inputs every estimator reads; returns (token_rewards float32, loss_mask bool)."""
    require_same_shape(fn_name, 2, token_rewards=data.token_rewards, loss_mask=data.loss_mask)
    bs = data.token_rewards.shape[0]
    if data.group_ids.shape != (bs,):
        raise OmrlError(f"{fn_name}: group_ids has shape {tuple(data.group_ids.shape)}; it must be [bs] = ({bs},)")
    return data.token_rewards.float(), data.loss_mask.bool()


def episode_scores(token_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One score per row: the sum of its response tokens' rewards. [bs, T] -> [bs]."""
    return torch.where(mask, token_rewards, 0.0).sum(-1)


def group_normalize(scores: torch.Tensor, keys: torch.Tensor, use_std: bool, eps: float) -> torch.Tensor:
    """Each score minus its group's mean, divided by (group std + eps) when ``use_std``.

    scores [N] float; keys [N] or [N, k]: elements with equal keys (rows) form a group.
    The std is the unbiased sample std (``torch.std``, as verl and TRL use). Elements
    in a group of one get 0.
    """
    _, inverse, counts = torch.unique(keys, dim=0, return_inverse=True, return_counts=True)
    sizes = counts.to(scores.dtype)
    mean = scores.new_zeros(len(counts)).index_add_(0, inverse, scores) / sizes
    centred = scores - mean[inverse]
    if use_std:
        var = scores.new_zeros(len(counts)).index_add_(0, inverse, centred**2) / (sizes - 1).clamp(min=1)
        centred = centred / (var.sqrt()[inverse] + eps)
    return torch.where(counts[inverse] > 1, centred, 0.0)


def reverse_discounted_sum(x: torch.Tensor, mask: torch.Tensor, discount: float) -> torch.Tensor:
    """out_t = x_t + discount * out_next over masked-in positions, 0 elsewhere.

    x [bs, L] float, mask [bs, L] bool. ``next`` is the next masked-in position of
    the row, so masked-out positions (env tokens between turns, padding) are
    skipped rather than treated as episode ends. The recurrence is sequential:
    one reverse pass over L, vectorised over rows.
    """
    out = torch.zeros_like(x)
    running = x.new_zeros(x.shape[0])
    for t in range(x.shape[1] - 1, -1, -1):
        running = torch.where(mask[:, t], x[:, t] + discount * running, running)
        out[:, t] = running
    return torch.where(mask, out, 0.0)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float) -> torch.Tensor:
    """(x - mean) / (std + eps) over the masked-in entries of the whole batch; 0 elsewhere.

    The std is the unbiased sample std; with a single entry it is 0 and the result is 0.
    """
    count = mask.sum()
    mean = masked_mean(x, mask)
    centred = torch.where(mask, x - mean, 0.0)
    var = (centred**2).sum() / (count - 1).clamp(min=1)
    return centred / (var.sqrt() + eps)


def broadcast_to_tokens(per_row: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A [bs] value on every response token of its row: [bs] -> [bs, T], 0 off the mask."""
    return torch.where(mask, per_row[:, None], 0.0)


def check_turn_input(fn_name: str, data: AdvantageInput, **per_turn: torch.Tensor | None) -> torch.Tensor:
    """Check ``data.turn_index`` [bs, T] and the ``per_turn`` inputs [bs, K] (named as in ``data``; the
    first one's shape counts); returns turn_index as int64, each entry -1 or in [0, K)."""
    require_present(fn_name, turn_index=data.turn_index, **per_turn)
    require_same_shape(fn_name, 2, token_rewards=data.token_rewards, turn_index=data.turn_index)
    require_same_shape(fn_name, 2, **per_turn)
    name, first = next(iter(per_turn.items()))
    bs, num_turns = first.shape
    if bs != data.token_rewards.shape[0]:
        raise OmrlError(
            f"{fn_name}: {name} has {bs} rows but token_rewards has {data.token_rewards.shape[0]}; they must match"
        )
    turn_index = data.turn_index.long()
    if turn_index.numel() and int(turn_index.max()) >= num_turns:
        raise OmrlError(
            f"{fn_name}: turn_index reaches {int(turn_index.max())} but {name} has only "
            f"K={num_turns} turns per row; turn_index must be -1 or in [0, K)"
        )
    return turn_index


def turns_to_tokens(per_turn: torch.Tensor, turn_index: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A [bs, K] value of each turn on the response tokens of that turn: [bs, K] -> [bs, T]; 0 off the
    mask and on tokens outside any turn (turn_index -1)."""
    # column 0 holds 0 for tokens outside any turn
    per_turn = torch.cat([per_turn.new_zeros(len(per_turn), 1), per_turn], dim=1)
    return torch.where(mask, per_turn.gather(1, (turn_index + 1).clamp(min=0)), 0.0)


def next_response_values(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """For each position, the value of the next response token after it in the row (0 if none).

    values, mask [bs, T]. Vectorised: a reverse running minimum finds the index
    of the next masked-in position; index T points at an appended 0.
    """
    bs, T = mask.shape
    positions = torch.arange(T, device=mask.device).expand(bs, T)
    own_or_T = torch.where(mask, positions, T)
    first_at_or_after = own_or_T.flip(-1).cummin(-1).values.flip(-1)
    first_after = torch.cat([first_at_or_after[:, 1:], own_or_T.new_full((bs, 1), T)], dim=1)
    padded = torch.cat([values, values.new_zeros(bs, 1)], dim=1)
    return padded.gather(1, first_after)


# -- estimators ---------------------------------------------------------------


@torch.no_grad()
def gae(data: AdvantageInput, cfg: AlgoConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation with a critic (Schulman et al. 2016, arXiv:1506.02438).

    Reads token_rewards, loss_mask, values, all [bs, T]; cfg.gamma, cfg.lam.
    Runs over response tokens only: the value that follows a response token is the
    value of the next *response* token in the row (the first token of the next turn
    when a turn ends; env observation tokens in between are skipped), and 0 after
    the last one (the episode ends there; truncated episodes are not bootstrapped).

        delta_t = r_t + gamma * V_next(t) - V_t
        A_t     = delta_t + gamma * lam * A_next(t)
        returns = A + V                     (the value-loss targets)

    The advantages are then whitened over the batch's response tokens (as verl and
    OpenRLHF do), so their scale does not depend on the reward's.
    Returns (advantages, returns), float32 [bs, T], 0 off the mask.
    """
    rewards, mask = check_advantage_input("gae", data)
    require_present("gae", values=data.values)
    require_same_shape("gae", 2, token_rewards=data.token_rewards, values=data.values)
    gamma = require_range(cfg, "gamma", 0.0, 1.0)
    lam = require_range(cfg, "lam", 0.0, 1.0)
    values = data.values.float()
    deltas = rewards + gamma * next_response_values(values, mask) - values
    raw = reverse_discounted_sum(deltas, mask, gamma * lam)
    returns = torch.where(mask, raw + values, 0.0)
    return masked_whiten(raw, mask, cfg.eps), returns


@torch.no_grad()
def grpo(data: AdvantageInput, cfg: AlgoConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative advantage (GRPO; Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

    Reads token_rewards, loss_mask [bs, T], group_ids [bs]; cfg.norm_adv_by_std, cfg.eps.
    Each row's score is the sum of its token rewards; its advantage is
    (score - group mean) / (group std + eps), or (score - group mean) when
    cfg.norm_adv_by_std is false, on every response token of the row. Rows
    alone in their group get 0. Returns (advantages, advantages), float32 [bs, T].
    """
    rewards, mask = check_advantage_input("grpo", data)
    scores = episode_scores(rewards, mask)
    advantages = broadcast_to_tokens(group_normalize(scores, data.group_ids, cfg.norm_adv_by_std, cfg.eps), mask)
    return advantages, advantages


@torch.no_grad()
def dr_grpo(data: AdvantageInput, cfg: AlgoConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO without the std division (Dr. GRPO; Liu et al. 2025, "Understanding R1-Zero-Like Training").

    Reads token_rewards, loss_mask [bs, T], group_ids [bs]. Advantage =
    score - group mean on every response token, whatever cfg.norm_adv_by_std says:
    dividing by the std up-weights groups that are nearly all right or all wrong.
    Pair it with loss_agg_mode seq-mean-token-sum to also drop the length bias.
    Returns (advantages, advantages), float32 [bs, T]; rows alone in a group get 0.
    """
    rewards, mask = check_advantage_input("dr_grpo", data)
    scores = episode_scores(rewards, mask)
    advantages = broadcast_to_tokens(group_normalize(scores, data.group_ids, False, cfg.eps), mask)
    return advantages, advantages


@torch.no_grad()
def rloo(data: AdvantageInput, cfg: AlgoConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE Leave-One-Out (Ahmadian et al. 2024, "Back to Basics", arXiv:2402.14740).

    Reads token_rewards, loss_mask [bs, T], group_ids [bs]. Each row's baseline
    is the mean score of the *other* rows of its group:
    A_i = score_i - (sum_group - score_i) / (n - 1), on every response token.
    Rows alone in their group have no other rows and get 0.
    Returns (advantages, advantages), float32 [bs, T].
    """
    rewards, mask = check_advantage_input("rloo", data)
    scores = episode_scores(rewards, mask)
    _, inverse, counts = torch.unique(data.group_ids, return_inverse=True, return_counts=True)
    group_sum = scores.new_zeros(len(counts)).index_add_(0, inverse, scores)[inverse]
    size = counts[inverse]
    baseline = (group_sum - scores) / (size - 1).clamp(min=1).to(scores.dtype)
    per_row = torch.where(size > 1, scores - baseline, 0.0)
    advantages = broadcast_to_tokens(per_row, mask)
    return advantages, advantages


@torch.no_grad()
def reinforce_plus_plus(data: AdvantageInput, cfg: AlgoConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted returns-to-go, whitened over the batch (Hu 2025, arXiv:2501.03262).

    Reads token_rewards, loss_mask [bs, T]; cfg.gamma, cfg.eps. group_ids are not used.
    G_t = r_t + gamma * G_next(t) over response tokens (env tokens between turns
    are skipped, as in gae), then advantages = (G - mean) / (std + eps) over every
    response token of the batch. Returns (advantages, G), float32 [bs, T].
    """
    rewards, mask = check_advantage_input("reinforce_plus_plus", data)
    gamma = require_range(cfg, "gamma", 0.0, 1.0)
    returns = reverse_discounted_sum(rewards, mask, gamma)
    return masked_whiten(returns, mask, cfg.eps), returns
