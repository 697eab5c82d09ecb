"""On-policy distillation (``algorithm.teacher``): a teacher model's log-probs of the tokens the student
sampled become a dense, per-token reward.

Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from Self-Generated
Mistakes" (GKD, arXiv:2306.13649); Gu et al. 2024, MiniLLM (arXiv:2306.08543); Thinking Machines
2025, "On-Policy Distillation". The student samples its own episodes; on each model token t

    r_t = teacher_coef * (log p_teacher(y_t) - log p_student(y_t))

whose expectation over the student's samples is -teacher_coef * KL(student || teacher) per token (the
reverse KL, mode seeking). It is added to the env's rewards on the same tokens, so distillation
works with the env reward or alone (``reward.weights={goal: 0}``); the advantage estimator then
does what it does with any reward (a per-token one keeps it dense: ``advantage=reinforce_plus_plus``
with ``gamma=0``). The teacher runs in the scoring pass beside the reference model, frozen, and
must share the student's tokenizer: its log-probs are of the student's token ids.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from omrl.algos import require_same_shape
from omrl.errors import ConfigError
from omrl.models.loading import load_tokenizer
from omrl.training.model_setup import load_frozen_copy


def load_teacher(cfg: Any, strategy: Any, student_tokenizer: Any) -> Any:
    """The frozen teacher ``cfg.algorithm.teacher`` (loaded as the student is: dtype, remote code),
    prepared by the strategy; refused when its tokenizer is not the student's."""
    name = cfg.algorithm.teacher
    if not cfg.algorithm.teacher_coef > 0:
        raise ConfigError(f"algorithm.teacher_coef must be > 0 with a teacher, got {cfg.algorithm.teacher_coef}")
    check_same_tokenizer(name, load_tokenizer(name, cfg.model.trust_remote_code), cfg.model.name, student_tokenizer)
    teacher_cfg = dataclasses.replace(cfg.model, name=name, lora_rank=0)
    return strategy.prepare(load_frozen_copy(teacher_cfg, str(strategy.device)), frozen=True)


def check_same_tokenizer(teacher: str, teacher_tokenizer: Any, student: str, student_tokenizer: Any) -> None:
    """The teacher scores the student's token ids, so both must map ids to the same strings."""
    teacher_vocab, student_vocab = teacher_tokenizer.get_vocab(), student_tokenizer.get_vocab()
    if teacher_vocab != student_vocab:
        only_teacher = sorted(set(teacher_vocab) - set(student_vocab))[:3]
        differ = [tok for tok in student_vocab if teacher_vocab.get(tok, student_vocab[tok]) != student_vocab[tok]][:3]
        raise ConfigError(
            f"algorithm.teacher={teacher!r} has another tokenizer than the student {student!r} "
            f"({len(teacher_vocab)} tokens against {len(student_vocab)}; e.g. only the teacher's: {only_teacher}, "
            f"other ids: {differ}): it would score token ids it does not mean; choose a teacher of the "
            "student's model family"
        )


def add_teacher_rewards(batch: Any, coef: float, strategy: Any) -> dict[str, float]:
    """Add ``coef * (teacher - student)`` log-probs to ``batch``'s token_rewards on its loss tokens (the
    teacher's are its teacher_log_probs, the student's its old_log_probs: the policy that sampled).
    Returns ``teacher_kl``: the mean over the loss tokens of every process of student - teacher
    log-probs, the k1 estimate of KL(student || teacher) per token, which distillation drives down.
    A process with no rows this step (the others have some) adds nothing but still counts."""
    if not len(batch):
        total, tokens = strategy.sum([0.0, 0.0])
        return {"teacher_kl": total / max(tokens, 1.0)}
    teacher_log_probs = batch["teacher_log_probs"]
    require_same_shape(
        "add_teacher_rewards",
        2,
        teacher_log_probs=teacher_log_probs,
        old_log_probs=batch["old_log_probs"],
        loss_mask=batch["loss_mask"],
    )
    mask = batch["loss_mask"].bool()
    gap = torch.where(mask, batch["old_log_probs"].float() - teacher_log_probs.float(), 0.0)
    batch.tensors["token_rewards"] = batch["token_rewards"].float() - coef * gap
    total, tokens = strategy.sum([gap.sum(), mask.sum()])
    return {"teacher_kl": total / max(tokens, 1.0)}
