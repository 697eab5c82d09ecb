"""The stages of examples/learn_webshop.py: expert data, SFT, GRPO and held-out evaluation on WebShop.

Each stage is one function over the public APIs the ``omrl`` commands call (``rollout --expert``,
``sft``, ``train``, ``eval``), configured by a :class:`Size`. Every prompt leaves WebShop's worked
example out (``env.demonstration=false``): SFT records made from episodes never hold it, so the
rollouts and evaluations then see the very prompts the model was fine-tuned on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from common import standard_error  # examples/common.py: learn_webshop.py puts this folder on sys.path

from omrl.config import load_config
from omrl.config.options import EvalRunConfig, RolloutRunConfig, SftRunConfig, TrainRunConfig
from omrl.data import write_episodes
from omrl.data.trajectory import Episode
from omrl.errors import ConfigError
from omrl.models import WEBSHOP_DELTA, resolve_model_path
from omrl.models.delta import export_low_rank_delta, file_digest
from omrl.rollout import PlaySpec, RolloutSession
from omrl.training.checkpoint import latest_checkpoint
from omrl.training.metrics import read_metrics
from omrl.training.rl import run_rl
from omrl.training.sft import run_sft

# the expert needs 3-6 turns (measured on all 800 train goals); its longest episode is 1,936
# SmolLM2 tokens, so 2,048 holds every expert episode whole
ENV = ["env.name=webshop", "env.template=react", "env.max_turns=8", "env.demonstration=false"]
GENERATION = ["generation.max_new_tokens=48", "generation.max_context=2048", "generation.batch_size=64"]
RL_REWARD = "{goal: 1.0, format: 0.1}"  # WebShop's score (partial credit); the format term keeps replies parseable
LORA_LR_SCALE = 10  # LoRA's low-rank updates need about 10x the learning rate of full fine-tuning
# The SFT model is shipped as the built-in smollm2-135m-webshop: the top DELTA_RANK singular directions
# of its weight change (chosen by measurement: see the docstring of examples/learn_webshop.py)
DELTA_RANK = 32
DELTA_FILE = "sft.delta.safetensors"


@dataclass(frozen=True)
class Size:
    """How much work each stage does. ``full`` is the issue's run, ``toy`` the test suite's."""

    model: str  # the base model: smollm2-135m (full) or tiny (toy)
    expert_episodes: int  # train goals the expert plays (the first N of the 800)
    sft_epochs: float
    sft_learning_rate: float  # full fine-tuning; LoRA takes LORA_LR_SCALE times this
    sft_micro_batch: int  # episodes per forward/backward (one episode a row, no packing)
    sft_accumulation: int  # micro-batches per optimizer step
    rl_steps: int
    tasks_per_step: int  # T
    group_size: int  # G: samples per task, compared with each other
    rl_learning_rate: float
    rl_micro_batch: int
    ppo_epochs: int  # passes over each rollout (1: on-policy, no extra forward)
    train_tasks: int  # GRPO plays only the first N train goals (0: all 800)
    eval_goals: int  # held-out test goals (the first N of the 200)
    base_eval_goals: int  # the base model's: it never buys, so each episode runs to the turn cap (~7x the cost)
    eval_samples: int  # k: sampled episodes per goal at temperature 1
    save_steps: int  # SFT and GRPO checkpoint every N steps, so a stopped stage resumes (0: at the end)
    # GiGPO's step-level groups: turns of one goal's samples that answered the same page (the search
    # page always; a results page when two samples searched alike) are credited against each other
    advantage: str = "gigpo"
    gamma: float = 0.95


FULL = Size(
    model="smollm2-135m",
    expert_episodes=200,
    sft_epochs=2.0,
    sft_learning_rate=5e-5,
    sft_micro_batch=1,
    sft_accumulation=8,
    rl_steps=12,
    tasks_per_step=4,
    group_size=4,
    rl_learning_rate=2e-6,
    rl_micro_batch=1,
    ppo_epochs=1,
    train_tasks=0,
    eval_goals=200,
    base_eval_goals=20,
    eval_samples=2,
    save_steps=10,
)
# the same stages on the 1M-parameter `tiny`, in minutes: its own learning rates, one GRPO step
TOY = replace(
    FULL,
    model="tiny",
    expert_episodes=32,
    sft_epochs=4.0,
    sft_learning_rate=6e-3,
    sft_accumulation=1,
    rl_steps=1,
    rl_learning_rate=1e-3,
    rl_micro_batch=16,
    ppo_epochs=4,
    train_tasks=4,
    eval_goals=10,
    base_eval_goals=5,
    save_steps=0,
)
SIZES = {"full": FULL, "toy": TOY}


def expert_stage(path: Path, size: Size, seed: int) -> dict[str, Any]:
    """``omrl rollout --expert`` on the first ``expert_episodes`` train goals -> ``path`` (parquet)."""
    cfg = load_config(RolloutRunConfig, None, [f"model.name={size.model}", *ENV, *GENERATION, f"seed={seed}"])
    with RolloutSession.from_config(cfg, expert=True) as session:
        episodes = session.play(
            session.task_ids("train", size.expert_episodes), PlaySpec(split="train", expert=True)
        ).episodes
    write_episodes(episodes, path)
    n = len(episodes)
    return {
        "episodes": n,
        "success": sum(ep.won for ep in episodes) / n,
        "tokens_per_episode": sum(len(ep.token_ids) for ep in episodes) / n,
        "trained_tokens_per_episode": sum(sum(ep.loss_mask) for ep in episodes) / n,
    }


def sft_stage(data: Path, out: Path, size: Size, seed: int, lora_rank: int = 0) -> dict[str, Any]:
    """``omrl sft`` of the base model on the expert's episodes -> ``out`` (LoRA merged in); continues
    from the newest checkpoint in ``out`` when a stopped run left one."""
    lr = size.sft_learning_rate * (LORA_LR_SCALE if lora_rank else 1)
    summary = run_sft(
        load_config(
            SftRunConfig,
            None,
            [
                f"model.name={size.model}",
                f"model.lora_rank={lora_rank}",
                f"dataset={data}",
                f"logging.output_dir={out}",
                f"num_train_epochs={size.sft_epochs}",
                f"optim.learning_rate={lr}",
                "optim.lr_schedule=cosine",
                "optim.warmup_steps=3",
                f"optim.micro_batch_size={size.sft_micro_batch}",
                f"optim.gradient_accumulation_steps={size.sft_accumulation}",
                "max_seq_length=2048",
                "packing=false",
                f"seed={seed}",
                "logging.tensorboard=false",
                f"logging.save_steps={size.save_steps}",
                "logging.keep_checkpoints=1",
                f"resume={latest_checkpoint(out) is not None}",
            ],
        )
    )
    records = read_metrics(out)
    return {
        "steps": summary["steps"],
        "first_loss": records[0]["loss"] if records else None,
        "final_loss": summary["final_loss"],
        "tokens_per_s": _mean(r["tokens_per_s"] for r in records),
    }


def delta_stage(sft: Path, size: Size) -> dict[str, Any]:
    """The SFT model's change from its base as a rank-``DELTA_RANK`` delta file beside it, and whether it is
    byte-for-byte the one omrl ships as ``smollm2-135m-webshop`` (only a full-size run can be)."""
    from safetensors.torch import load_file

    started = time.perf_counter()
    files = [Path(resolve_model_path(size.model)) / "model.safetensors", sft / "model.safetensors"]
    if missing := [str(f) for f in files if not f.is_file()]:
        raise ConfigError(
            f"the delta needs both models as one local model.safetensors each; missing: "
            f"{', '.join(missing)} (a hub id or a sharded checkpoint cannot be used here)"
        )
    base, tuned = (load_file(f) for f in files)
    kept = export_low_rank_delta(base, tuned, sft.parent / DELTA_FILE, DELTA_RANK, base_name=size.model)
    digest = file_digest(sft.parent / DELTA_FILE)
    return {
        **kept,
        "rank": DELTA_RANK,
        "sha256": digest,
        "seconds": time.perf_counter() - started,
        "same_as_shipped": WEBSHOP_DELTA.exists() and digest == file_digest(WEBSHOP_DELTA),
    }


def rl_stage(sft: Path, out: Path, size: Size, seed: int, reward: str = RL_REWARD) -> dict[str, Any]:
    """``omrl train --algo grpo`` from the SFT model ``sft`` -> ``out``: ``rl_steps`` steps of
    ``tasks_per_step`` goals x ``group_size`` samples; returns each step's reward, success and share
    of parseable replies (from metrics.jsonl). Continues from a checkpoint in ``out`` like sft_stage."""
    run_rl(
        load_config(
            TrainRunConfig,
            "grpo",
            [
                f"model.name={sft}",
                *ENV,
                *GENERATION,
                f"logging.output_dir={out}",
                "logging.tensorboard=false",
                f"logging.save_steps={size.save_steps}",
                "logging.keep_checkpoints=1",
                f"steps={size.rl_steps}",
                f"tasks_per_step={size.tasks_per_step}",
                f"group_size={size.group_size}",
                f"train_tasks={size.train_tasks}",
                f"ppo_epochs={size.ppo_epochs}",
                "mini_batch_size=0",
                f"algorithm.advantage={size.advantage}",
                f"algorithm.gamma={size.gamma}",
                "algorithm.kl_coef=0.0",
                "algorithm.loss_agg_mode=seq-mean-token-mean",
                f"reward.weights={reward}",
                f"optim.learning_rate={size.rl_learning_rate}",
                f"optim.micro_batch_size={size.rl_micro_batch}",
                "generation.temperature=1.0",
                "eval_tasks=0",
                f"seed={seed}",
                f"resume={latest_checkpoint(out) is not None}",
            ],
        )
    )
    records = read_metrics(out)
    return {
        "steps": len(records),
        "reward": [r["reward"] for r in records],
        "success": [r["success"] for r in records],
        "format_ok": [r["format_ok"] for r in records],
    }


def evaluate_model(model: str, size: Size, seed: int, sampled: bool, goals: int) -> dict[str, Any]:
    """``omrl eval`` on the first ``goals`` test goals: ``eval_samples`` episodes a goal at
    temperature 1 (``sampled``), else one greedy episode a goal. See :func:`summarize`."""
    temperature, samples = (1.0, size.eval_samples) if sampled else (0.0, 1)
    started = time.perf_counter()
    cfg = load_config(
        EvalRunConfig,
        None,
        [f"model.name={model}", *ENV, *GENERATION, f"seed={seed}", f"generation.temperature={temperature}"],
    )
    with RolloutSession.from_config(cfg) as session:
        episodes = session.play(
            session.task_ids("test", goals), PlaySpec(split="test", group_size=samples, seed=seed)
        ).episodes
    return {**summarize(episodes), "samples_per_goal": samples, "seconds": time.perf_counter() - started}


def summarize(episodes: list[Episode]) -> dict[str, Any]:
    """Success rate and mean score with standard errors over goals (a goal's samples are averaged
    first: they are correlated, so goals are the independent units), the share of replies the
    template parses (``format_valid``), and the per-goal values for paired comparisons."""
    by_goal: dict[int, list[Episode]] = {}
    for ep in episodes:
        by_goal.setdefault(ep.task_id, []).append(ep)
    goals = sorted(by_goal)
    success = [_mean(ep.won for ep in by_goal[g]) for g in goals]
    score = [_mean(ep.score for ep in by_goal[g]) for g in goals]
    turns = [t for ep in episodes for t in ep.turns]
    return {
        "goals": len(goals),
        "episodes": len(episodes),
        "success": _mean(success),
        "success_se": standard_error(success),
        "score": _mean(score),
        "score_se": standard_error(score),
        "format_valid": _mean(t.format_ok for t in turns) if turns else 0.0,
        "mean_turns": len(turns) / len(episodes),
        "per_goal": {"task_ids": goals, "success": success, "score": score},
    }


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0
