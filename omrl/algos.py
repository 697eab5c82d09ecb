"""Calling conventions for algorithm plugins, and the small tensor helpers they share.

Every function of one kind has one signature, so the training recipe calls any
of them the same way:

- ``advantage``:   ``fn(data: AdvantageInput, cfg: AlgoConfig) -> (advantages, returns)``,
  both (bs, T) and zero where ``loss_mask`` is 0.
- ``policy_loss``: ``fn(data: PolicyLossInput, cfg: AlgoConfig) -> (loss, metrics)``,
  ``loss`` a scalar tensor, ``metrics`` a dict of floats.
- ``kl``:          ``fn(log_probs, ref_log_probs) -> kl`` elementwise, (bs, T) -> (bs, T).
- ``rollout_correction``: ``fn(data: CorrectionInput, cfg: AlgoConfig) -> (weights, keep, metrics)``,
  ``weights`` (bs, T) multiplying each token's loss, ``keep`` (bs, T) bool the tokens left in the
  loss, ``metrics`` a dict of floats.

Shapes: ``bs`` rows (one per trajectory), ``T`` token positions of the trained
sequence, ``K`` the most turns in any row.

An advantage estimator that needs more than the rollout says so when it registers:
``register("remax", remax, kind="advantage", needs=("greedy_scores",))`` makes the recipe play a
greedy episode of each task and fill :attr:`AdvantageInput.greedy_scores`.

A policy loss registered with ``zero_advantage_rows_add_nothing=True`` promises that each row's loss
reads that row alone and is 0, with a 0 gradient, where the row's advantages are all 0 (no batch
statistic, no term without the advantage): the recipe then runs no forward or backward for such rows
(a GRPO group whose samples all got the same reward) when there is no reference model, entropy bonus
or value loss, and the update is the one that runs them (``zero_advantage_rows`` in the
step's metrics is their share; its ``entropy``, ``pg_*`` and on-policy ``mismatch_*`` figures are over the
rows that ran).
"""

from __future__ import annotations

import difflib
import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only annotations: the config schema must load without torch
    import torch

from omrl.config.fields import opt
from omrl.errors import ConfigError, OmrlError

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "token-sum", "seq-mean-token-sum-norm")


RECIPES = ("grpo", "ppo", "dpo")


@dataclass
class AlgoConfig:
    """The ``algorithm`` section: which recipe and plugins train, and every hyper-parameter of
    their maths. Algorithm functions receive it whole and read what they need."""

    name: str = opt("grpo", f"Training recipe: {', '.join(RECIPES)} (--algo).")
    advantage: str = opt("grpo", "Advantage estimator.", names_of=("algorithms", "advantage"))
    policy_loss: str = opt("ppo_clip", "Policy loss.", names_of=("algorithms", "policy_loss"))
    kl_estimator: str = opt("k3", "KL estimator.", names_of=("algorithms", "kl"))
    kl_coef: float = opt(0.0, "KL to the reference model; 0 turns it off (and skips the reference).")
    kl_target: float = opt(
        0.0, "Adaptive KL: the KL per token the coefficient steers toward (Ziegler et al. 2019); 0 keeps kl_coef fixed."
    )
    kl_horizon: int = opt(10000, "Adaptive KL: samples over which the coefficient adapts.")
    kl_in_reward: bool = opt(False, "Put the KL penalty in the reward instead of the loss.")
    entropy_coef: float = opt(0.0, "Entropy bonus.")
    value_coef: float = opt(0.5, "PPO: value-loss weight.")
    value_clip: float = opt(0.2, "PPO: value clipping range (0 turns clipping off).")
    critic: str = opt("head", "PPO critic: head (a value head on the policy's backbone) or model (separate copy).")
    dpo_beta: float = opt(0.1, "DPO beta.")
    gamma: float = opt(1.0, "Discount per token (gae) or per turn (gigpo).")
    lam: float = opt(1.0, "GAE lambda.")
    norm_adv_by_std: bool = opt(True, "GRPO: divide by the group's std (Dr. GRPO: no).")
    eps: float = opt(1e-6, "Added to denominators.")
    clip_ratio_low: float = opt(0.2, "PPO clip: ratio >= 1 - clip_ratio_low.")
    clip_ratio_high: float = opt(0.2, "PPO clip: ratio <= 1 + clip_ratio_high (DAPO clip-higher: 0.28).")
    clip_ratio_c: float = opt(3.0, "Dual-clip bound for negative advantages.")
    loss_agg_mode: str = opt("token-mean", f"How token losses become one number: {', '.join(LOSS_AGG_MODES)}.")
    loss_norm_tokens: int = opt(
        0,
        "seq-mean-token-sum-norm: the constant each sequence's token sum is divided by; 0: the "
        "run's token budget per episode (generation.max_new_tokens x env.max_turns).",
    )
    sapo_tau_pos: float = opt(1.0, "SAPO: gate temperature for positive advantages.")
    sapo_tau_neg: float = opt(1.05, "SAPO: gate temperature for negative advantages.")
    cov_clip_ratio: float = opt(2e-4, "Clip-Cov: share of tokens whose gradient is cut.")
    cov_clip_low: float = opt(1.0, "Clip-Cov: lowest covariance of a token it may cut.")
    cov_clip_high: float = opt(5.0, "Clip-Cov: highest covariance of a token it may cut.")
    kl_cov_ratio: float = opt(2e-3, "KL-Cov: share of tokens (highest covariance) given the KL penalty.")
    kl_cov_coef: float = opt(1.0, "KL-Cov: weight of that penalty.")
    pass_k: int = opt(4, "pass_at_k: the k of pass@k the advantages optimise.")
    pass_threshold: float = opt(1.0, "pass_at_k: a sample whose score reaches this counts as a pass.")
    dynamic_sampling: bool = opt(
        False,
        "DAPO dynamic sampling: drop groups whose samples all got the same reward and draw more "
        "tasks until the step has tasks_per_step groups.",
    )
    dynamic_sampling_max_draws: int = opt(4, "Dynamic sampling: extra rollouts a step may draw at most.")
    teacher: str = opt(
        "",
        "On-policy distillation: a teacher model (name or path) whose per-token log-probs on the "
        "student's rollouts become a dense reward; empty turns it off.",
    )
    teacher_coef: float = opt(
        1.0, "On-policy distillation: weight of the per-token reward log p_teacher - log p_student."
    )
    rollout_correction: str = opt(
        "auto",
        "Correction for the sampler's log-probs differing from the trainer's; auto: none for the hf backend "
        "in float32, else token_tis.",
        names_of=("algorithms", "rollout_correction"),
    )
    rollout_is_cap: float = opt(
        2.0, "token_tis, seq_tis: the weights' cap; seq_mask: the ratio above which a row drops (>= 1)."
    )
    rollout_band_low: float = opt(0.5, "token_mask: a token with a lower ratio drops.")
    rollout_band_high: float = opt(5.0, "token_mask: a token with a higher ratio drops.")
    gigpo_step_weight: float = opt(1.0, "GiGPO: weight of the step-level advantage.")
    tree_step_weight: float = opt(1.0, "tree_grpo: weight of the step-level advantage (see tree_step_mode).")
    tree_step_mode: str = opt(
        "siblings",
        "tree_grpo's step level: siblings (each turn's subtree against its siblings' at a branch "
        "point) or intra_tree (GRPO over one tree's leaves, Tree-GRPO's intra-tree advantage).",
    )

    def summary(self) -> str:
        """The recipe's maths in one line: estimator, loss and its aggregation, KL, batch shaping, teacher."""
        if self.name == "dpo":  # no estimator nor policy loss: the loss of pairs of a task's samples
            return f"dpo: pairs of a task's samples whose rewards differ, beta {self.dpo_beta:g} against the starting model"
        parts = [f"{self.name}: advantage {self.advantage}, policy loss {self.policy_loss} ({self.loss_agg_mode})"]
        if self.kl_coef > 0:
            adaptive = f", adapting toward {self.kl_target:g} a token" if self.kl_target > 0 else ""
            where = "in the reward" if self.kl_in_reward else "in the loss"
            parts.append(f"KL {self.kl_estimator} x {self.kl_coef:g} {where}{adaptive}")
        if self.dynamic_sampling:
            parts.append(f"dynamic sampling (up to {self.dynamic_sampling_max_draws} extra draws)")
        if self.teacher:
            parts.append(f"teacher {self.teacher} x {self.teacher_coef:g}")
        return "; ".join(parts)


@dataclass
class AdvantageInput:
    """What an advantage estimator may read. Shapes in brackets.

    token_rewards  [bs, T]  reward placed on response tokens (allocation and any KL-in-reward applied)
    loss_mask      [bs, T]  1 on model-generated tokens (the ones trained on), 0 elsewhere
    group_ids      [bs]     rows with equal ids are samples of the same task
    values         [bs, T]  critic values (gae only), else None
    turn_index     [bs, T]  index of the model turn each token belongs to, -1 elsewhere
    turn_rewards   [bs, K]  reward of each turn (0 past the last turn)
    turn_state_ids [bs, K]  id of the observation each turn answered (GiGPO anchor states), -1 padding
    turn_node_ids  [bs, K]  search-tree node each turn made; ids are unique in the batch, so rows that
                            share an id share that turn (a tree's shared prefix); -1 for padding
    turn_parent_ids [bs, K] the node each turn grew from (its branch point, same ids), -1 when that is
                            a tree's root (the task's start) and for padding; both None off a tree
    tree_ids       [bs]     the search tree each row (a root-to-leaf path) belongs to; None off a tree
    greedy_scores  [bs]     the score of a greedy episode of each row's task (ReMax's baseline); set when
                            the estimator registered with ``needs=("greedy_scores",)``, else None
    """

    token_rewards: torch.Tensor
    loss_mask: torch.Tensor
    group_ids: torch.Tensor
    values: torch.Tensor | None = None
    turn_index: torch.Tensor | None = None
    turn_rewards: torch.Tensor | None = None
    turn_state_ids: torch.Tensor | None = None
    turn_node_ids: torch.Tensor | None = None
    turn_parent_ids: torch.Tensor | None = None
    tree_ids: torch.Tensor | None = None
    greedy_scores: torch.Tensor | None = None

    @property
    def response_mask(self) -> torch.Tensor:
        """Deprecated name of :attr:`loss_mask` (omrl 0.1), kept for plugins written against it."""
        return _renamed("AdvantageInput.response_mask", "loss_mask", self.loss_mask)


@dataclass
class PolicyLossInput:
    """What a policy loss reads. All [bs, T]."""

    log_probs: torch.Tensor
    old_log_probs: torch.Tensor
    advantages: torch.Tensor
    loss_mask: torch.Tensor

    @property
    def response_mask(self) -> torch.Tensor:
        """Deprecated name of :attr:`loss_mask` (omrl 0.1), kept for plugins written against it."""
        return _renamed("PolicyLossInput.response_mask", "loss_mask", self.loss_mask)


@dataclass
class CorrectionInput:
    """What a rollout correction reads. All [bs, T].

    old_log_probs      the trainer's log-probs of the policy that sampled (the proximal policy)
    sampler_log_probs  the log-probs the rollout's sampler reported for the same tokens
    loss_mask          1 on the trained tokens
    """

    old_log_probs: torch.Tensor
    sampler_log_probs: torch.Tensor
    loss_mask: torch.Tensor

    def log_ratio(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(log rho = old - sampler per token, float32, 0 off the mask and clamped to +-20 so that
        exp() cannot overflow; the mask as bool). Checks the three shapes first."""
        require_same_shape(
            "rollout correction",
            2,
            old_log_probs=self.old_log_probs,
            sampler_log_probs=self.sampler_log_probs,
            loss_mask=self.loss_mask,
        )
        mask = self.loss_mask.bool()
        gap = (self.old_log_probs.detach().float() - self.sampler_log_probs.float()).masked_fill(~mask, 0.0)
        return gap.clamp(-MAX_CORRECTION_LOG_RATIO, MAX_CORRECTION_LOG_RATIO), mask


#: a rollout correction's log ratios (per token, and summed per sequence) are clamped to +-this
MAX_CORRECTION_LOG_RATIO = 20.0


def _renamed(old: str, new: str, value):
    warnings.warn(f"{old} is deprecated; read .{new} (the same tensor)", DeprecationWarning, stacklevel=3)
    return value


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` where ``mask`` is 1 (0 when nothing is masked in)."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def aggregate_loss(loss: torch.Tensor, mask: torch.Tensor, mode: str, norm_tokens: float = 0.0) -> torch.Tensor:
    """Reduce a [bs, T] token loss to a scalar. Sequences are the rows with a token in ``mask``.

    token-mean:              sum over all tokens / number of tokens (DAPO)
    seq-mean-token-sum:      per sequence the token sum, then the mean over sequences
    seq-mean-token-mean:     per sequence the token mean, then the mean over sequences (GRPO paper)
    token-sum:               the sum over all tokens, no normaliser
    seq-mean-token-sum-norm: per sequence the token sum divided by the constant ``norm_tokens``
                             (> 0), then the mean over sequences (Dr. GRPO's constant normaliser,
                             Liu et al. 2025, arXiv:2503.20783: no length bias)
    """
    mask = mask.to(loss.dtype)
    has_tokens = (mask.sum(-1) > 0).to(loss.dtype)
    n_seq = has_tokens.sum().clamp(min=1.0)
    if mode == "token-mean":
        return masked_mean(loss, mask)
    if mode == "seq-mean-token-sum":
        return ((loss * mask).sum(-1) * has_tokens).sum() / n_seq
    if mode == "seq-mean-token-mean":
        return (masked_mean(loss, mask, dim=-1) * has_tokens).sum() / n_seq
    if mode == "token-sum":
        return (loss * mask).sum()
    if mode == "seq-mean-token-sum-norm":
        if not norm_tokens > 0:
            raise ConfigError(
                f"loss_agg_mode seq-mean-token-sum-norm divides by algorithm.loss_norm_tokens, which must be "
                f"> 0 here (the recipe sets 0 to the run's token budget); got {norm_tokens}"
            )
        return ((loss * mask).sum(-1) * has_tokens).sum() / (n_seq * norm_tokens)
    raise ConfigError(f"unknown loss_agg_mode {mode!r}; valid: {', '.join(LOSS_AGG_MODES)}")


def aggregate(loss: torch.Tensor, mask: torch.Tensor, cfg: AlgoConfig) -> torch.Tensor:
    """:func:`aggregate_loss` with the mode and normaliser ``cfg`` names (what policy losses call)."""
    return aggregate_loss(loss, mask, require_agg_mode(cfg.loss_agg_mode), cfg.loss_norm_tokens)


def micro_batch_share(mode: str, mb_mask: torch.Tensor, total_tokens: float, total_seqs: float) -> float:
    """The weight of one micro-batch's aggregated loss when micro-batches are accumulated into one
    mini-batch of ``total_tokens`` trained tokens in ``total_seqs`` sequences with tokens, so that
    the sum of weighted losses is the mini-batch's loss under ``mode``: its share of the tokens
    (token-mean), of the sequences (the seq-mean modes), or 1 (token-sum: sums add)."""
    if mode == "token-sum":
        return 1.0
    if mode.startswith("seq-mean"):
        return float((mb_mask.sum(-1) > 0).sum()) / max(total_seqs, 1.0)
    return float(mb_mask.sum()) / max(total_tokens, 1.0)


# -- input checks every algorithm function runs first: a wrong shape would otherwise broadcast
# silently into a wrong loss ----------------------------------------------------------------------


def require_same_shape(fn_name: str, ndim: int, **tensors: torch.Tensor) -> None:
    """Every tensor has ``ndim`` dimensions and the shape of the first one."""
    names = list(tensors)
    first = tensors[names[0]]
    for name, tensor in tensors.items():
        if tensor.dim() != ndim or tensor.shape != first.shape:
            raise OmrlError(
                f"{fn_name}: {name} has shape {tuple(tensor.shape)}, but {', '.join(names)} "
                f"must all have one {ndim}-d shape (the shape of {names[0]}: {tuple(first.shape)})"
            )


def require_present(fn_name: str, **tensors: torch.Tensor | None) -> None:
    """Optional inputs that this function needs are set."""
    missing = [name for name, tensor in tensors.items() if tensor is None]
    if missing:
        raise OmrlError(f"{fn_name} needs AdvantageInput.{', '.join(missing)}; it was None")


def require_range(cfg: AlgoConfig, name: str, low: float, high: float = math.inf, low_inclusive: bool = True) -> float:
    """``cfg.<name>`` lies in [low, high] (or (low, high] when not ``low_inclusive``)."""
    value = getattr(cfg, name)
    above_low = value >= low if low_inclusive else value > low
    if not (above_low and value <= high):
        if math.isinf(high):
            valid = f"{'>=' if low_inclusive else '>'} {low}"
        else:
            valid = f"in {'[' if low_inclusive else '('}{low}, {high}]"
        raise ConfigError(f"algorithm.{name} must be {valid}, got {value}")
    return value


#: the core's own algorithm settings: (lowest, highest, lowest allowed); a plugin checks its options when called
SETTING_RANGES = {
    "kl_coef": (0.0, math.inf, True),
    "kl_target": (0.0, math.inf, True),
    "entropy_coef": (-math.inf, math.inf, True),
    "value_coef": (0.0, math.inf, True),
    "value_clip": (0.0, math.inf, True),
    "dpo_beta": (0.0, math.inf, False),
    "gamma": (0.0, 1.0, True),
    "lam": (0.0, 1.0, True),
    "eps": (0.0, math.inf, False),
    "loss_norm_tokens": (0, math.inf, True),
    "teacher_coef": (0.0, math.inf, True),
    "clip_ratio_low": (0.0, math.inf, True),
    "clip_ratio_high": (0.0, math.inf, True),
    "clip_ratio_c": (0.0, math.inf, True),
    "rollout_is_cap": (1.0, math.inf, True),  # a cap below 1 scales every token's weight down: a smaller step
}


def check_settings(cfg: AlgoConfig) -> None:
    """Refuse a core setting outside its range (:data:`SETTING_RANGES`; NaN and infinities too) or
    an unknown loss_agg_mode, before any model loads: a negative kl_coef would turn the KL off, a
    NaN value_clip the clipping, a negative value_coef would train the critic to err."""
    require_agg_mode(cfg.loss_agg_mode)
    for name, (low, high, low_inclusive) in SETTING_RANGES.items():
        value = require_range(cfg, name, low, high, low_inclusive)
        if isinstance(value, bool) or not math.isfinite(value):
            raise ConfigError(f"algorithm.{name} must be a finite number, got {value}")


def require_agg_mode(mode: str) -> str:
    """A loss aggregation mode that :func:`omrl.algos.aggregate_loss` knows."""
    if mode not in LOSS_AGG_MODES:
        close = difflib.get_close_matches(str(mode).replace("_", "-"), LOSS_AGG_MODES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"algorithm.loss_agg_mode {mode!r} is unknown{hint}; valid: {', '.join(LOSS_AGG_MODES)}")
    return mode
