"""Critic-free estimators that differ from GRPO in their baseline: what a row's score is compared with.

Same convention as :mod:`omrl_plugins.algos.advantages`: ``fn(data: AdvantageInput, cfg: AlgoConfig)
-> (advantages, returns)``, both float32 [bs, T] and exactly 0 where ``loss_mask`` is 0; a row's
score is the sum of its response tokens' rewards; with no critic the advantages are the returns too.

- :func:`opo`: the group's length-weighted mean score (the variance-optimal baseline).
- :func:`reinforce_plus_plus_baseline`: the group's mean, then whitening over the whole batch.
- :func:`pass_at_k`: the advantage of pass@k training, in closed form from the group's passes.
- :func:`remax`: the score of a greedy episode of the same task (not a group estimator).

Group estimators give 0 to a row alone in its group (no other sample to compare with), as
:func:`~omrl_plugins.algos.advantages.grpo` does. Grouping is vectorised, no loop over rows.
"""

from __future__ import annotations

import torch

from omrl.algos import AdvantageInput, AlgoConfig, require_present
from omrl.errors import ConfigError, OmrlError
from omrl_plugins.algos.advantages import (
    broadcast_to_tokens,
    check_advantage_input,
    episode_scores,
    group_normalize,
    masked_whiten,
)


def group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(inverse [bs]: each row's group as 0..G-1, counts [G]: rows per group)."""
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    return inverse, counts


def group_sum(values: torch.Tensor, inverse: torch.Tensor, groups: int) -> torch.Tensor:
    """The sum of ``values`` [bs] over each group: [G]."""
    return values.new_zeros(groups).index_add_(0, inverse, values)


@torch.no_grad()
def opo(data: AdvantageInput, cfg: AlgoConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO's optimal reward baseline (Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline", arXiv:2505.23585).

    Reads token_rewards, loss_mask [bs, T], group_ids [bs]. No cfg field.
    The baseline that minimises the policy gradient's variance is E[|grad log p|^2 R] /
    E[|grad log p|^2]; with |grad log p(o)|^2 taken proportional to the length |o| it is the
    group's length-weighted mean score, |o_i| being row i's number of trained (masked) tokens:

        b = sum_i |o_i| R_i / sum_i |o_i|        A_i = R_i - b   on every trained token of row i

    No std division. A row alone in its group gets 0 (verl gives it its raw score instead); a row
    without tokens weighs nothing in b. The paper pairs it with exact on-policy training (one
    update per rollout). Returns (advantages, advantages), float32 [bs, T].
    """
    rewards, mask = check_advantage_input("opo", data)
    scores = episode_scores(rewards, mask)
    lengths = mask.sum(-1).to(scores.dtype)
    inverse, counts = group_index(data.group_ids)
    weighted = group_sum(lengths * scores, inverse, len(counts))
    baseline = weighted / group_sum(lengths, inverse, len(counts)).clamp(min=1.0)
    per_row = torch.where(counts[inverse] > 1, scores - baseline[inverse], 0.0)
    advantages = broadcast_to_tokens(per_row, mask)
    return advantages, advantages


@torch.no_grad()
def reinforce_plus_plus_baseline(data: AdvantageInput, cfg: AlgoConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with baseline (Hu, Liu, Xu and Shen 2025, "REINFORCE++", arXiv:2501.03262).

    Reads token_rewards, loss_mask [bs, T], group_ids [bs]; cfg.eps.
    The group-sampling variant: each row's score minus its group's mean (no std: the local std
    is what the paper drops), on every trained token of the row, then whitened over every trained
    token of the batch (global normalisation):

        A'_i = R_i - mean_group(R)      A = (A' - mean_batch(A')) / (std_batch(A') + eps)

    mean_batch and the unbiased std_batch run over tokens, as :func:`~omrl_plugins.algos.advantages.masked_whiten` does (verl's
    masked_whiten too). Rows alone in their group have no baseline: they are left out of the
    whitening and get 0. Returns (advantages, advantages), float32 [bs, T].
    """
    rewards, mask = check_advantage_input("reinforce_plus_plus_baseline", data)
    scores = episode_scores(rewards, mask)
    inverse, counts = group_index(data.group_ids)
    grouped = mask & (counts[inverse] > 1)[:, None]
    centred = broadcast_to_tokens(group_normalize(scores, data.group_ids, False, cfg.eps), grouped)
    advantages = torch.where(grouped, masked_whiten(centred, grouped, cfg.eps), 0.0)
    return advantages, advantages


def pass_at_k_terms(n: torch.Tensor, c: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(Rbar, C(n-c-1, k-1) / C(n-1, k-1)) [G], float64, of groups of ``n`` [G] rows with ``c`` [G]
    passes. Each binomial ratio is a product of k (or k - 1) factors, C(n-c, k) / C(n, k) =
    prod_{j<k} (n-c-j) / (n-j), which is 0 once a factor n-c-j reaches 0; 1 <= k <= n."""
    j = torch.arange(k, dtype=torch.float64, device=n.device)
    n, fails = n.double()[:, None], (n - c).double()[:, None]
    none_pass = ((fails - j).clamp(min=0) / (n - j)).prod(-1)
    jm = j[: k - 1]
    fail_alone = ((fails - 1 - jm).clamp(min=0) / (n - 1 - jm)).prod(-1)
    return 1.0 - none_pass, fail_alone


@torch.no_grad()
def pass_at_k(data: AdvantageInput, cfg: AlgoConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k training, its analytical advantage (Chen et al. 2025, "Pass@k Training", arXiv:2508.10751).

    Title: "Pass@k Training for Adaptively Balancing Exploration and Exploitation of Large
    Reasoning Models".
    Reads token_rewards, loss_mask [bs, T], group_ids [bs]; cfg.pass_k (k), cfg.pass_threshold,
    cfg.eps. A row passes when its score >= cfg.pass_threshold. For a group of n rows with c
    passes, averaging the pass@k reward (1 when any of k rows drawn without replacement passes)
    over all C(n, k) draws gives, in closed form:

        Rbar   = 1 - C(n-c, k) / C(n, k)                    the group's mean pass@k reward
        sigma  = sqrt(Rbar (1 - Rbar))                      its std
        A_pass = (1 - Rbar) / (sigma + eps)
        A_fail = (1 - Rbar - C(n-c-1, k-1) / C(n-1, k-1)) / (sigma + eps)

    on every trained token of the row (eps as in the authors' code and GRPO). sigma = 0 (every
    row passes, or none) gives 0. k = 1 is GRPO on the pass/fail outcomes with the population
    std: A = (pass - c/n) / (sqrt(c/n (1 - c/n)) + eps). Needs 1 <= k <= n in every group, so a
    row alone in its group gets 0 (sigma = 0 when k = 1). A group smaller than k (one that lost
    untrainable rows) has no pass@k and gets 0; k above every group's size is refused.
    Returns (advantages, advantages), float32 [bs, T]; raises ConfigError for a k out of range.
    """
    rewards, mask = check_advantage_input("pass_at_k", data)
    k = cfg.pass_k
    passed = episode_scores(rewards, mask) >= cfg.pass_threshold
    inverse, counts = group_index(data.group_ids)
    if not isinstance(k, int) or k < 1 or (len(counts) and k > int(counts.max())):
        largest = int(counts.max()) if len(counts) else 0
        raise ConfigError(
            f"pass_at_k: algorithm.pass_k must be an integer with 1 <= pass_k <= the group size, but pass_k is "
            f"{k!r} and the largest group has {largest} rows; lower pass_k or raise group_size"
        )
    passes = group_sum(passed.long(), inverse, len(counts))
    whole = counts >= k  # a group that lost rows (env errors) below k has no pass@k: its rows get 0
    mean, fail_alone = pass_at_k_terms(torch.where(whole, counts, k), torch.where(whole, passes, 0), k)
    sigma = torch.where(whole, (mean * (1.0 - mean)).clamp(min=0.0).sqrt(), 0.0)
    a_pass = (1.0 - mean) / (sigma + cfg.eps)
    a_fail = (1.0 - mean - fail_alone) / (sigma + cfg.eps)
    per_group = torch.stack([a_fail, a_pass])  # [2, G]
    per_row = torch.where(sigma[inverse] > 0, per_group[passed.long(), inverse], 0.0)
    advantages = broadcast_to_tokens(per_row.float(), mask)
    return advantages, advantages


@torch.no_grad()
def remax(data: AdvantageInput, cfg: AlgoConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax, a greedy episode's score as the baseline (Li et al. 2023, "ReMax", arXiv:2310.10505).

    Title: "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning
    Large Language Models".
    Reads token_rewards, loss_mask [bs, T], greedy_scores [bs]. No cfg field.
    The baseline of a sampled episode is the score of a greedy (argmax) episode of the same task:

        A_i = R_i - greedy_scores_i      on every trained token of row i

    Not a group estimator: group_ids are only shape-checked, and a row alone in its group still
    has its baseline. (verl gives each token the reward-to-go minus the baseline; with the reward on the
    last token, as here by default, the two agree.) The estimator must be registered with
    ``needs=("greedy_scores",)`` so that the recipe plays the greedy episodes.
    Returns (advantages, advantages), float32 [bs, T].
    """
    rewards, mask = check_advantage_input("remax", data)
    try:
        require_present("remax", greedy_scores=data.greedy_scores)
    except OmrlError as err:
        raise OmrlError(
            f'{err}: register the estimator with needs=("greedy_scores",) so that the recipe plays '
            "a greedy episode of each task"
        ) from err
    if data.greedy_scores.shape != (len(rewards),):
        raise OmrlError(
            f"remax: greedy_scores has shape {tuple(data.greedy_scores.shape)}; it must be [bs] = ({len(rewards)},)"
        )
    per_row = episode_scores(rewards, mask) - data.greedy_scores.to(rewards.device).float()
    advantages = broadcast_to_tokens(per_row, mask)
    return advantages, advantages
