"""Each command's whole config (``omrl config show train``), built of the sections in
:mod:`omrl.config.sections`; :data:`CONFIG_CLASSES` maps a command to its class.

Every field has a help text (``omrl config keys train`` prints them all).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from omrl.algos import AlgoConfig
from omrl.config.fields import opt
from omrl.config.seats import SeatsConfig
from omrl.config.sections import AGENT_SAMPLING as AGENT_SAMPLING  # where it was first defined: still importable
from omrl.config.sections import (
    AgentConfig,
    ChatConfig,
    DeadlineConfig,
    EnvConfig,
    GenerationConfig,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    RolloutConfig,
    ToolHealthConfig,
    TrainRolloutConfig,
)

# -- the commands' configs ----------------------------------------------------------------------------
# Each command's config is a RunConfig: the fields every command opens with, in the order `omrl config
# show` and `omrl config keys` list them (a dataclass lists a base's fields before its own). The fields
# several commands share further down are built by the functions below, so each help text is written once.


def command_opt(name: str) -> Any:
    return opt(name, "Which command this config is for.")


def plugins_opt(help: str = "Per-plugin options, keyed by plugin name.") -> Any:
    return opt({}, help)


def resume_opt() -> Any:
    return opt(False, "Continue the run in logging.output_dir from its last checkpoint.")


def env_error_rate_opt() -> Any:
    return opt(
        0.1,
        "Largest share of episodes that may fail in the env (a server down, a simulator crash: "
        "end_reason env_error) before the command exits non-zero (status 2); they never count as "
        "the model's losses.",
    )


def epochs_opt() -> Any:
    return opt(1.0, "Passes over the data.")


def bf16_opt() -> Any:
    return opt(False, "Train in bfloat16 autocast.")


@dataclass
class RunConfig:
    """What every command's config opens with; each command's class sets ``command``'s default."""

    command: str = command_opt("")
    description: str = opt("", "One line about this preset.")
    seed: int = opt(0, "Random seed.", low=0)
    model: ModelConfig = field(default_factory=ModelConfig)


@dataclass
class EnvRunConfig(RunConfig):
    """A command that plays episodes in an env: rollout, eval, train, sweep."""

    env: EnvConfig = field(default_factory=EnvConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    chat: ChatConfig = field(default_factory=ChatConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    seats: SeatsConfig = field(default_factory=SeatsConfig)
    deadlines: DeadlineConfig = field(default_factory=DeadlineConfig)
    bf16: bool = opt(
        False,
        "bfloat16 for the policy's forward passes: generation (hf: autocast; vllm: bfloat16 weights) and, in "
        "train, the update's (autocast; weights, gradients and optimizer state stay in model.dtype).",
    )


# keys of `omrl rollout` and `omrl eval` that moved into their rollout section (still read, with a warning)
ROLLOUT_KEYS_MOVED = {"strategy": "rollout.strategy", "budget": "rollout.budget"}


@dataclass
class RolloutRunConfig(EnvRunConfig):
    """`omrl rollout`: play episodes and write trajectories."""

    command: str = command_opt("rollout")
    num_tasks: int = opt(8, "Tasks to play (from the start of the split).", low=1)
    group_size: int = opt(1, "Samples per task.", low=1)
    use_expert: bool = opt(False, "Play the env's scripted expert instead of a model.")
    output: str = opt(
        "rollouts/trajectories.parquet", "Trajectory parquet (a .jsonl of readable episodes goes beside it)."
    )
    max_env_error_rate: float = env_error_rate_opt()
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    plugins: dict[str, dict[str, Any]] = plugins_opt()
    renamed_keys: ClassVar[dict[str, str]] = ROLLOUT_KEYS_MOVED


@dataclass
class EvalRunConfig(EnvRunConfig):
    """`omrl eval`: success rate and friends on an env split."""

    command: str = command_opt("eval")
    env: EnvConfig = field(default_factory=lambda: EnvConfig(split="test"))
    generation: GenerationConfig = field(default_factory=lambda: GenerationConfig(temperature=0.0))
    num_tasks: int = opt(5, "Tasks to evaluate (from the start of the split).", low=1)
    samples_per_task: int = opt(1, "Samples per task for pass@k and best-of-N (k <= this).")
    report: str = opt("", "JSON report path (default: <output_dir>/report.json).")
    output_dir: str = opt("", "Folder for the report and every episode (default: evals/<model>-<env>-<time>).")
    max_env_error_rate: float = env_error_rate_opt()
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    plugins: dict[str, dict[str, Any]] = plugins_opt()
    renamed_keys: ClassVar[dict[str, str]] = ROLLOUT_KEYS_MOVED


@dataclass
class DatasetRunConfig(RunConfig):
    """A command that trains for epochs on a dataset: sft, rm train."""

    chat: ChatConfig = field(default_factory=ChatConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(learning_rate=2e-5))


@dataclass
class SftRunConfig(DatasetRunConfig):
    """`omrl sft`: supervised fine-tuning on agent conversations."""

    command: str = command_opt("sft")
    logging: LoggingConfig = field(default_factory=lambda: LoggingConfig(output_dir="runs/sft"))
    dataset: str = opt(
        "",
        "JSONL, parquet, HF dataset dir, or `omrl rollout` output; several mixed by weight, each "
        "share drawn once, seeded: a.parquet:0.7,b.jsonl:0.3 (omrl.data.mixture).",
    )
    min_reward: float = opt(float("-inf"), "For rollout output: keep episodes with total reward >= this.")
    num_train_epochs: float = epochs_opt()
    max_seq_length: int = opt(2048, "Longer conversations are truncated.")
    packing: bool = opt(True, "Pack several conversations into one sequence.")
    bf16: bool = bf16_opt()
    resume: bool = resume_opt()
    plugins: dict[str, dict[str, Any]] = plugins_opt()


@dataclass
class TrainRunConfig(EnvRunConfig):
    """`omrl train`: online RL (grpo, ppo, dpo) in an env."""

    # keys of omrl 0.1 -> where they live now (still read, with a warning)
    renamed_keys: ClassVar[dict[str, str]] = {
        key: f"algorithm.{new}"
        for key, new in (
            ("algo", "name"),
            ("advantage", "advantage"),
            ("policy_loss", "policy_loss"),
            ("kl_estimator", "kl_estimator"),
            ("kl_coef", "kl_coef"),
            ("kl_in_reward", "kl_in_reward"),
            ("entropy_coef", "entropy_coef"),
            ("value_coef", "value_coef"),
            ("value_clip", "value_clip"),
            ("critic", "critic"),
            ("dpo_beta", "dpo_beta"),
        )
    }

    command: str = command_opt("train")
    optim: OptimConfig = field(default_factory=OptimConfig)
    logging: LoggingConfig = field(default_factory=lambda: LoggingConfig(output_dir="runs/train"))
    algorithm: AlgoConfig = field(default_factory=AlgoConfig)
    rollout: TrainRolloutConfig = field(default_factory=TrainRolloutConfig)
    tool_health: ToolHealthConfig = field(default_factory=ToolHealthConfig)
    steps: int = opt(4, "RL steps (rollout + update each).")
    tasks_per_step: int = opt(2, "Tasks per rollout step.")
    train_tasks: int = opt(0, "Train on only the first N tasks of env.split (0: all of them).")
    group_size: int = opt(4, "Samples per task (G).", low=1)
    ppo_epochs: int = opt(1, "Passes over each rollout batch.")
    mini_batch_size: int = opt(
        0,
        "Episodes per optimizer step; each pass over the rollout takes "
        "ceil(episodes / mini_batch_size) steps (0: one step for the whole rollout).",
    )
    eval_every: int = opt(0, "Evaluate on the test split every N steps (0: at the end only).", low=0)
    eval_tasks: int = opt(10, "Test tasks per evaluation.", low=0)
    eval_temperature: float = opt(0.0, "Sampling temperature of evaluations (0: greedy).", low=0)
    eval_samples_per_task: int = opt(
        1, "Samples per test task in evaluations (more than 1 needs eval_temperature > 0); eval_success is their mean."
    )
    max_env_error_rate: float = opt(
        0.1,
        "Largest share of the run's episodes that may fail in the env (a server "
        "down, a simulator crash: never trained on) before the run exits non-zero "
        "(status 2, after saving its model).",
    )
    resume: bool = resume_opt()
    plugins: dict[str, dict[str, Any]] = plugins_opt()


@dataclass
class SweepRunConfig(EnvRunConfig):
    """`omrl sweep`: success against token budget for several rollout strategies."""

    command: str = command_opt("sweep")
    seed: int = opt(0, "Random seed (the same for every cell).")
    env: EnvConfig = field(default_factory=lambda: EnvConfig(split="test"))
    # sampled: best_of_n, beam, dfsdt and mcts draw several candidates of one prompt
    generation: GenerationConfig = field(default_factory=lambda: GenerationConfig(temperature=1.0))
    num_tasks: int = opt(5, "Tasks every cell plays (from the start of the split).", low=1)
    strategies: list[str] = opt(
        ["chain", "best_of_n", "beam", "dfsdt", "mcts"],
        "Rollout strategies to compare (chain: pass@1, one cell with no budget).",
    )
    budgets: list[int] = opt([500, 1000, 2000], "Generated tokens per task each strategy may use, one cell each.")
    out: str = opt("runs/sweep", "Folder for sweep.json and sweep.png.")
    resume: bool = opt(
        True,
        "Keep the cells <out>/sweep.json holds from a sweep with the same settings and play "
        "only the others; false: start over.",
    )
    plugins: dict[str, dict[str, Any]] = plugins_opt("Per-plugin options, keyed by plugin name (plugins.beam.width=3).")


@dataclass
class RmTrainRunConfig(DatasetRunConfig):
    """`omrl rm train`: a reward model (outcome or process) from trajectory files."""

    command: str = command_opt("rm-train")
    logging: LoggingConfig = field(default_factory=lambda: LoggingConfig(output_dir="runs/rm"))
    kind: str = opt("orm", "orm: one score per episode (at its last token); prm: one per assistant turn.")
    label: str = opt(
        "success",
        "What is learned. orm: success (won or not) or score (the env's final score); "
        "prm: mc (each turn's Monte Carlo value, from trees), mc_score (the same on the env's "
        "final score) or step_reward.",
    )
    objective: str = opt(
        "bce",
        "bce: binary cross-entropy (scores are probabilities); mse: regression; bt: "
        "Bradley-Terry on pairs of one task's episodes with different outcomes (orm).",
    )
    dataset: str = opt(
        "",
        "Trajectory parquet from `omrl rollout` (a file, or a directory of them); several mixed by "
        "weight, each share drawn once, seeded: a.parquet:0.5,b.parquet:0.5 (omrl.data.mixture).",
    )
    eval_dataset: str = opt("", "Held-out trajectories: reported at the end (as `omrl rm eval`).")
    text: bool = opt(
        False,
        "Re-encode each chat with the model's own tokenizer instead of the episodes' ids "
        "(needed when the policy's tokenizer differs).",
    )
    max_pairs_per_task: int = opt(16, "bt: most pairs taken from one task.")
    num_train_epochs: float = epochs_opt()
    max_seq_length: int = opt(2048, "orm: longer episodes are dropped; prm: cut (labels past the cut dropped).")
    packing: bool = opt(True, "Pack several episodes into one sequence (bce and mse).")
    bf16: bool = bf16_opt()
    resume: bool = resume_opt()
    plugins: dict[str, dict[str, Any]] = plugins_opt()


@dataclass
class RmEvalRunConfig(RunConfig):
    """`omrl rm eval`: a reward model scored on held-out trajectories."""

    command: str = command_opt("rm-eval")
    dataset: str = opt("", "Held-out trajectory parquet (a file, or a directory of them).")
    report: str = opt("", "JSON report path (default: <model>/rm_eval-<data>.json, named after --data).")
    text: bool = opt(
        False,
        "Re-encode each chat with the model's own tokenizer; when not given, as the model was trained "
        "(its config.yaml).",
    )


CONFIG_CLASSES = {
    "train": TrainRunConfig,
    "sft": SftRunConfig,
    "rollout": RolloutRunConfig,
    "eval": EvalRunConfig,
    "sweep": SweepRunConfig,
    "rm-train": RmTrainRunConfig,
    "rm-eval": RmEvalRunConfig,
}
