"""The config sections the commands share, and each command's whole config.

Every field has a help text (``omrl config keys train`` prints them all).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from omrl.algos import AlgoConfig
from omrl.config.fields import opt
from omrl.config.seats import SeatsConfig


@dataclass
class ModelConfig:
    name: str = opt(
        "smollm2-135m", "Built-in name (smollm2-135m, smollm2-135m-webshop, tiny), local HF directory or hub id."
    )
    dtype: str = opt("float32", "Weights dtype: float32, bfloat16, float16.")
    trust_remote_code: bool = opt(False, "Run code shipped with the model (off unless asked for).")
    gradient_checkpointing: bool = opt(False, "Recompute activations in backward to save memory.")
    lora_rank: int = opt(0, "LoRA rank through peft; 0 trains all weights.")
    lora_alpha: int = opt(16, "LoRA alpha.")
    lora_dropout: float = opt(0.0, "LoRA dropout.")
    lora_target_modules: list[str] = opt(["q_proj", "k_proj", "v_proj", "o_proj"], "Modules LoRA adapts.")


@dataclass
class EnvConfig:
    name: str = opt(
        "webshop",
        "Registered env name (see `omrl env list`), or several with weights: webshop:0.5,gridworld:0.5 "
        "(a mixture; see env.mix for each env's own settings).",
    )
    split: str = opt("train", "Task split to draw tasks from.")
    template: str = opt("react", "Action template: react, xml, tool_call.")
    max_turns: int = opt(0, "Turns per episode; 0 uses the env's own cap.")
    num_workers: int = opt(8, "Threads stepping I/O-bound envs concurrently.")
    demonstration: bool = opt(
        True,
        "Open the chat with the env's worked example when it has one (a one-shot "
        "prompt: small models need it to follow the action format); false: zero-shot.",
    )
    mix: list[Any] = opt(
        [],
        "Several envs in one run, each an env name or a mapping: {name, weight, and any of split, "
        "template, max_turns, demonstration, num_workers, reward (its reward weights), plugins}; what "
        "an entry leaves out is this section's (omrl.mixture).",
    )


@dataclass
class GenerationConfig:
    backend: str = opt("hf", "Generation backend: hf, vllm, openai.")
    max_new_tokens: int = opt(96, "New tokens per model turn.")
    max_context: int = opt(2048, "Total tokens per episode (prompt + all turns).")
    temperature: float = opt(1.0, "Sampling temperature (0 = greedy).")
    top_p: float = opt(1.0, "Nucleus sampling.")
    batch_size: int = opt(32, "Sequences per generate call.")
    base_url: str = opt("", "openai backend: the endpoint, e.g. http://127.0.0.1:8000/v1.")
    api_key_env: str = opt("OPENAI_API_KEY", "openai backend: environment variable holding the key.")
    weight_sync: str = opt(
        "none",
        "openai backend, training: how trained weights reach the vLLM server: files (a safetensors file "
        "the server reloads from generation.weight_dir), nccl (vLLM's weight transfer, GPU to GPU), lora "
        "(model.lora_rank > 0: only the adapter, loaded under a new name per version; "
        "omrl.backends.lora_sync) or none (omrl.backends.weight_sync).",
    )
    weight_dir: str = opt(
        "",
        "weight_sync=files or lora: a folder the server can read too (shared storage across machines; '': a "
        "temp folder).",
    )
    lora_keep: int = opt(
        1,
        "weight_sync=lora: older adapter versions kept loaded beside the newest, so episodes that started "
        "under one finish under it (as rollout.max_staleness); older ones are unloaded and their folders removed.",
    )
    weight_sync_address: str = opt(
        "", "weight_sync=nccl: HOST:PORT this trainer listens on for the server's workers ('': 127.0.0.1, a free port)."
    )
    gpu_memory_utilization: float = opt(0.5, "vllm backend: share of GPU memory for the engine.")
    sampler_check_kl: float = opt(
        0.1,
        "Stop the run when the sampler's log-probs differ from the trainer's on the same tokens by more than this "
        "KL per token (mismatch_kl_k3) after a weight sync: a server that kept old weights (0: never).",
    )
    kv_reuse: bool = opt(
        True,
        "hf backend: keep each conversation's KV states between turns, so a turn prefills "
        "only its new tokens (the same samples as without).",
    )
    kv_cache_mb: int = opt(
        1024,
        "hf backend: most MiB of KV states kept between generate calls (least recently used "
        "dropped first; 0: no bound).",
    )


@dataclass
class ChatConfig:
    history: str = opt(
        "keep",
        "How earlier turns reach the next prompt when the chat template rewrites them "
        "(thinking models): keep (one row per episode, the sampled ids verbatim; the model "
        "sees its earlier reasoning) or as_template (each prompt as the template renders it, "
        "the episode split into rows where it rewrites). `omrl check-template MODEL` reports "
        "what each does for a model.",
    )
    template_kwargs: dict[str, Any] = opt(
        {},
        "Options the model's chat template reads, as jinja variables (e.g. chat.template_kwargs.enable_thinking=false, "
        "chat.template_kwargs.reasoning_effort=low): used by every render in rollout, train, eval and sft, kept in "
        "the run's config and used again by `omrl eval` of the run. A name the template does not read is an error.",
    )


@dataclass
class AgentConfig:
    callable: str = opt(
        "",
        "An agent program to play the episodes as it is (docs/agents.md): module:function, called per "
        "episode as fn(task, base_url=, api_key=, model=) on its own thread; it talks to the policy "
        "through the OpenAI-compatible endpoint omrl serves. '': the env and template play (no agent).",
    )
    command: str = opt(
        "",
        "The same as a command, e.g. 'python my_agent.py': run per episode with OPENAI_BASE_URL, "
        "OPENAI_API_KEY, OMRL_TASK (JSON) and OMRL_RESULT_FILE in its environment.",
    )
    reward: str = opt(
        "",
        "module:function scoring an agent's episode: fn(task, result, transcript) -> a number or named "
        "numbers (summed); '': the env scores the agent's answer (the dataset env matches it).",
    )
    timeout_s: float = opt(300.0, "Seconds an agent may take for one episode; past it the episode is env_error.")
    max_calls: int = opt(64, "Calls to the model an episode may make; past them each is answered finish_reason length.")
    max_parallel: int = opt(0, "Agents running at once (0: every episode of a step at once).")
    reward_timeout_s: float = opt(60.0, "Seconds agent.reward may take for one episode; past it, env_error.")
    sampling: str = opt(
        "run",
        "Whose temperature and top_p apply: run (generation.*; what training's log-probs assume) or "
        "request (each call's own).",
    )
    host: str = opt("127.0.0.1", "Where the endpoint listens (loopback; another address lets other machines in).")
    port: int = opt(0, "The endpoint's port (0: a free one).")
    batch_window_ms: float = opt(20.0, "How long a call waits for other agents' calls to share its generate call.")


AGENT_SAMPLING = ("run", "request")


@dataclass
class RewardConfig:
    weights: dict[str, float] = opt({"goal": 1.0}, "Reward components and their weights, e.g. {goal: 1, format: 0.1}.")
    allocation: str = opt("last_token", "Reward to tokens: last_token, uniform_positive, discounted, per_turn.")
    gamma: float = opt(1.0, "Discount for the discounted allocation.")
    per_env_scale: str = opt(
        "none",
        "With several envs (grpo, ppo): std divides each env's rewards by their spread in the step, so "
        "one env's reward scale cannot dominate the update (omrl.training.env_scale); none: as composed.",
    )


@dataclass
class ToolHealthConfig:
    """When a run whose env offers tools stops for its tool calls (omrl.training.tool_health)."""

    max_steps_without_valid_call: int = opt(
        10, "Steps in a row with no well-formed call to an offered tool before the run stops (0: never)."
    )
    max_malformed_rate: float = opt(
        0.5, "Share of unreadable tool-call attempts above which a step counts as malformed."
    )
    malformed_steps: int = opt(3, "Malformed steps in a row before the run stops (max_malformed_rate=1: never).")


@dataclass
class DeadlineConfig:
    """How long each stage of a run may take (omrl.supervisor); 0: no deadline."""

    generate_s: float = opt(900.0, "Seconds one generate call may take.")
    env_reset_s: float = opt(300.0, "Seconds one env reset may take.")
    env_step_s: float = opt(300.0, "Seconds one env step may take, its tool calls and scoring included.")
    reward_s: float = opt(600.0, "Seconds one reward function may take over a step's episodes.")
    weight_sync_s: float = opt(900.0, "Seconds one weight sync to the rollout backend may take.")
    checkpoint_s: float = opt(900.0, "Seconds one checkpoint save may take.")
    eval_s: float = opt(7200.0, "Seconds one evaluation during training may take.")
    handover_s: float = opt(3600.0, "async_generation: seconds to wait for the generation process's next step.")
    on_stall: str = opt(
        "drop",
        "An env or reward stage past its deadline: drop (its episodes end env_error, never trained on), "
        "retry (played again once, then dropped) or stop (the run stops, exit status 2). Other stages always stop.",
    )
    grace_s: float = opt(30.0, "Seconds a stalled stage has to give way before the process exits with status 2.")
    heartbeat_s: float = opt(
        60.0, "Seconds between heartbeats (heartbeat.json; metrics.jsonl when no step was logged)."
    )


@dataclass
class RolloutConfig:
    """How a command plays its tasks (``rollout.*``; the same keys in rollout, eval and train)."""

    strategy: str = opt(
        "chain",
        "How tasks are played: chain (the batched rollout, samples per task), or a search "
        "(best_of_n, beam, dfsdt, mcts or a plugin's: `omrl plugins --kind strategy`; options in "
        "plugins.<name>). In training a search grows group_size trees per task, whose finished paths "
        "are the episodes; grpo and ppo train a turn several paths share once, dpo pairs sibling "
        "replies' paths.",
    )
    budget: int = opt(0, "Model tokens each task's search may generate, scorer prompts included (0: no limit).")


@dataclass
class TrainRolloutConfig(RolloutConfig):
    """``rollout.*`` of ``omrl train``: how each step plays, and generation ahead of the trainer."""

    async_generation: bool = opt(
        False,
        "Generate in a process of its own (hf backend) that plays ahead while the trainer updates "
        "(omrl.training.async_generation).",
    )
    max_staleness: int = opt(
        1, "With async_generation: step k plays with the weights of step k - max_staleness (0: the synchronous run's)."
    )
    generation_threads: int = opt(0, "With async_generation: torch threads of the generation process (0: default).")
    partial_rollouts: bool = opt(
        False,
        "With async_generation: the generation process loads each new weight version as it arrives, between "
        "turns, and episodes in flight continue under it with their finished turns kept (each turn records "
        "its version); false: every step plays whole with one version (reproducible).",
    )


@dataclass
class OptimConfig:
    learning_rate: float = opt(1e-5, "Peak learning rate (AdamW).")
    weight_decay: float = opt(0.0, "AdamW weight decay.")
    warmup_steps: int = opt(0, "Linear warm-up steps.")
    lr_schedule: str = opt("constant", "constant, linear or cosine decay after warm-up.")
    max_grad_norm: float = opt(1.0, "Gradient clipping norm.")
    micro_batch_size: int = opt(4, "Sequences per forward/backward pass.")
    gradient_accumulation_steps: int = opt(1, "Micro-batches per optimizer step (SFT).")
    max_nan_steps: int = opt(5, "Stop after this many consecutive non-finite losses.")
    share_prefix: bool = opt(
        True,
        "RL update: rows opening with the same prompt run it once (same gradients, "
        "fewer tokens; one process or data parallel, no critic).",
    )


@dataclass
class LoggingConfig:
    output_dir: str = opt("runs/latest", "Run directory: checkpoints, metrics.jsonl, config.yaml.")
    logging_steps: int = opt(1, "Log metrics every N steps.")
    save_steps: int = opt(0, "Checkpoint every N steps (0: only at the end).")
    keep_checkpoints: int = opt(2, "How many checkpoints to keep.")
    tensorboard: bool = opt(True, "Write TensorBoard events (when tensorboard is installed).")
    wandb_project: str = opt("", "Log to this wandb project (when wandb is installed).")
    save_rollouts: bool = opt(True, "RL: write each step's episodes to <output_dir>/rollouts/ (omrl view shows them).")


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
    seed: int = opt(0, "Random seed.")
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


@dataclass
class RolloutRunConfig(EnvRunConfig):
    """`omrl rollout`: play episodes and write trajectories."""

    command: str = command_opt("rollout")
    num_tasks: int = opt(8, "Tasks to play (from the start of the split).")
    group_size: int = opt(1, "Samples per task.")
    use_expert: bool = opt(False, "Play the env's scripted expert instead of a model.")
    output: str = opt(
        "rollouts/trajectories.parquet", "Trajectory parquet (a .jsonl of readable episodes goes beside it)."
    )
    max_env_error_rate: float = env_error_rate_opt()
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    plugins: dict[str, dict[str, Any]] = plugins_opt()
    renamed_keys: ClassVar[dict[str, str]] = {"strategy": "rollout.strategy", "budget": "rollout.budget"}


@dataclass
class EvalRunConfig(EnvRunConfig):
    """`omrl eval`: success rate and friends on an env split."""

    command: str = command_opt("eval")
    env: EnvConfig = field(default_factory=lambda: EnvConfig(split="test"))
    generation: GenerationConfig = field(default_factory=lambda: GenerationConfig(temperature=0.0))
    num_tasks: int = opt(5, "Tasks to evaluate (from the start of the split).")
    samples_per_task: int = opt(1, "Samples per task for pass@k and best-of-N (k <= this).")
    report: str = opt("", "JSON report path (default: <output_dir>/report.json).")
    output_dir: str = opt("", "Folder for the report and every episode (default: evals/<model>-<env>-<time>).")
    max_env_error_rate: float = env_error_rate_opt()
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    plugins: dict[str, dict[str, Any]] = plugins_opt()
    renamed_keys: ClassVar[dict[str, str]] = {"strategy": "rollout.strategy", "budget": "rollout.budget"}


@dataclass
class SftRunConfig(RunConfig):
    """`omrl sft`: supervised fine-tuning on agent conversations."""

    command: str = command_opt("sft")
    chat: ChatConfig = field(default_factory=ChatConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(learning_rate=2e-5))
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
    group_size: int = opt(4, "Samples per task (G).")
    ppo_epochs: int = opt(1, "Passes over each rollout batch.")
    mini_batch_size: int = opt(
        0,
        "Episodes per optimizer step; each pass over the rollout takes "
        "ceil(episodes / mini_batch_size) steps (0: one step for the whole rollout).",
    )
    eval_every: int = opt(0, "Evaluate on the test split every N steps (0: at the end only).")
    eval_tasks: int = opt(10, "Test tasks per evaluation.")
    eval_temperature: float = opt(0.0, "Sampling temperature of evaluations (0: greedy).")
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
    num_tasks: int = opt(5, "Tasks every cell plays (from the start of the split).")
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
class RmTrainRunConfig(RunConfig):
    """`omrl rm train`: a reward model (outcome or process) from trajectory files."""

    command: str = command_opt("rm-train")
    chat: ChatConfig = field(default_factory=ChatConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(learning_rate=2e-5))
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
    report: str = opt("", "JSON report path (default: <model>/rm_eval.json).")
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
