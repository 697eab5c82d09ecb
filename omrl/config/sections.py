"""The sections of a command's config, one dataclass for each thing it configures: the model, the env,
generation, the chat, an agent program, the reward, tool health, deadlines, how tasks are played, the
optimizer and logging.

Every field has a help text (``omrl config keys train`` prints them all); the commands' whole configs
that hold these sections are :mod:`omrl.config.options`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Literal

from omrl.config.fields import opt

#: generation.batching's values (omrl.backends.hf)
BATCHING = ("turns", "continuous")
#: optim.lr_schedule's values (omrl.training.optim)
SCHEDULES = ("constant", "linear", "cosine")


def check_schedule(schedule: str) -> None:
    """Refuse an ``optim.lr_schedule`` that is not one of :data:`SCHEDULES`."""
    if schedule not in SCHEDULES:
        from omrl.errors import ConfigError

        raise ConfigError(f"unknown optim.lr_schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")


_TENSORBOARD_INSTALLED = importlib.util.find_spec("tensorboard") is not None


@dataclass
class ModelConfig:
    name: str = opt(
        "smollm2-135m", "Built-in name (smollm2-135m, smollm2-135m-webshop, tiny), local HF directory or hub id."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = opt("float32", "Weights dtype.")
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
    max_parallel: int = opt(
        0,
        "Episodes (games) played at once, each holding an env instance: an MCP server process, an env server's "
        "session (0: every episode of a step at once); one that ends makes room for the next.",
        low=0,
    )
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
    batch_size: int = opt(32, "Sequences per generate call.", low=1)
    base_url: str = opt("", "openai backend: the endpoint, e.g. http://127.0.0.1:8000/v1.")
    api_key_env: str = opt("OPENAI_API_KEY", "openai backend: environment variable holding the key.")
    request_timeout_s: float = opt(
        120.0,
        "openai backend: seconds a request may go without an answer before it is sent again (a long reply on "
        "a busy server needs more; each wait past it is warned of).",
        low=1,
    )
    request_retries: int = opt(
        3, "openai backend: times a request is sent again after a timeout, a refused connection, 429 or 5xx.", low=0
    )
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
    gpu_memory_utilization: float = opt(0.5, "vllm backend: share of GPU memory for the engine.", low=0, high=1)
    sampler_check_kl: float = opt(
        0.1,
        "Stop the run when the sampler's log-probs differ from the trainer's on the same tokens by more than this "
        "KL per token (mismatch_kl_k3) after a weight sync: a server that kept old weights (0: never).",
        low=0,
    )
    kv_reuse: bool = opt(
        True,
        "hf backend: keep each conversation's KV states between turns, so a turn prefills "
        "only its new tokens (the same samples as without).",
    )
    batching: str = opt(
        "turns",
        "hf backend: how a rollout's turns are batched: turns (every live episode's turn in one call, the "
        "batch run to its longest reply) or continuous (a turn joins the running batch as soon as its "
        "episode is ready and leaves it when it ends; each row samples from its own seeded stream, so the "
        "ids differ from turns' as another seed's would). Needs kv_reuse; chain rollouts only.",
    )
    kv_cache_mb: int = opt(
        1024,
        "hf backend: most MiB of KV states kept between generate calls (least recently used "
        "dropped first; 0: no bound).",
        low=0,
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
        "module:function scoring an agent's episode, given task, result and transcript by name (those it "
        "takes) -> a number or named numbers (summed); '': the env scores the agent's answer (the dataset env "
        "matches it).",
    )
    timeout_s: float = opt(300.0, "Seconds an agent may take for one episode; past it the episode is env_error.")
    max_calls: int = opt(
        64, "Calls to the model an episode may make; past them each is answered finish_reason length.", low=1
    )
    max_parallel: int = opt(0, "Agents running at once (0: every episode of a step at once).", low=0)
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

    generate_s: float = opt(900.0, "Seconds one generate call may take.", low=0)
    env_reset_s: float = opt(300.0, "Seconds one env reset may take.", low=0)
    env_step_s: float = opt(300.0, "Seconds one env step may take, its tool calls and scoring included.", low=0)
    reward_s: float = opt(600.0, "Seconds one reward function may take over a step's episodes.", low=0)
    weight_sync_s: float = opt(900.0, "Seconds one weight sync to the rollout backend may take.", low=0)
    checkpoint_s: float = opt(900.0, "Seconds one checkpoint save may take.", low=0)
    eval_s: float = opt(7200.0, "Seconds one evaluation during training may take.", low=0)
    handover_s: float = opt(3600.0, "async_generation: seconds to wait for the generation process's next step.", low=0)
    on_stall: str = opt(
        "drop",
        "An env or reward stage past its deadline: drop (its episodes end env_error, never trained on), "
        "retry (played again once, then dropped) or stop (the run stops, exit status 2). Other stages always stop.",
    )
    grace_s: float = opt(30.0, "Seconds a stalled stage has to give way before the process exits with status 2.", low=0)
    heartbeat_s: float = opt(
        60.0, "Seconds between heartbeats (heartbeat.json; metrics.jsonl when no step was logged).", low=0
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
    weight_decay: float = opt(0.0, "AdamW weight decay.", low=0)
    warmup_steps: int = opt(0, "Linear warm-up steps.")
    lr_schedule: str = opt("constant", "constant, linear or cosine decay after warm-up.")
    max_grad_norm: float = opt(1.0, "Gradient clipping norm.", low=0)
    micro_batch_size: int = opt(4, "Sequences per forward/backward pass.")
    gradient_accumulation_steps: int = opt(1, "Micro-batches per optimizer step (SFT).")
    max_nan_steps: int = opt(5, "Stop after this many consecutive non-finite losses.", low=0)
    share_prefix: bool = opt(
        True,
        "RL update: rows opening with the same prompt run it once (same gradients, "
        "fewer tokens; one process or data parallel, no critic).",
    )


@dataclass
class LoggingConfig:
    output_dir: str = opt(
        "runs/latest",
        "Run directory: checkpoints, metrics.jsonl, config.yaml. Left unset, omrl train and omrl sft make a fresh "
        "one per run: runs/<algo>-<env>-<time> and runs/sft-<time>.",
    )
    logging_steps: int = opt(1, "Log metrics every N steps.")
    save_steps: int = opt(0, "Checkpoint every N steps (0: only at the end).")
    keep_checkpoints: int = opt(2, "How many checkpoints to keep (0: all).")
    tensorboard: bool = opt(
        _TENSORBOARD_INSTALLED,  # a base install has none: its first run would warn of a default it cannot honour
        "Write TensorBoard events (default: on where tensorboard is installed, pip install 'omrl[tensorboard]').",
    )
    wandb_project: str = opt("", "Log to this wandb project (when wandb is installed).")
    save_rollouts: bool = opt(True, "RL: write each step's episodes to <output_dir>/rollouts/ (omrl view shows them).")
