"""``omrl sft``: supervised fine-tuning on agent conversations.

    omrl sft [PRESET] [key=value ...] [--model M --dataset D --learning-rate 2e-5 ...]

The config is built from the defaults, then the preset (default: ``sft``), then
the ``key=value`` overrides, then the flags (which mirror the OpenManus-RL SFT
script's options). Several datasets are mixed by weight, named in one string:
``--dataset a.parquet:0.7,b.jsonl:0.3`` (see :mod:`omrl.data.mixture`).
"""

from __future__ import annotations

from typing import Optional

import typer

# the flags `omrl sft` and `omrl rm train` share, declared once
LEARNING_RATE_OPTION = typer.Option(None, "--learning-rate", help="Peak learning rate.")
EPOCHS_OPTION = typer.Option(None, "--num-train-epochs", help="Passes over the data.")
LORA_RANK_OPTION = typer.Option(None, "--lora-rank", help="LoRA rank (0: train all weights).")
SEED_OPTION = typer.Option(None, "--seed", help="Random seed.")

# flag name -> dotted config key: those both commands take, then sft's own
DATASET_TRAINER_KEYS = {
    "model": "model.name",
    "learning_rate": "optim.learning_rate",
    "num_train_epochs": "num_train_epochs",
    "output_dir": "logging.output_dir",
    "lora_rank": "model.lora_rank",
    "seed": "seed",
}
FLAG_KEYS = {
    **DATASET_TRAINER_KEYS,
    "dataset": "dataset",
    "max_seq_length": "max_seq_length",
    "packing": "packing",
    "per_device_train_batch_size": "optim.micro_batch_size",
    "gradient_accumulation_steps": "optim.gradient_accumulation_steps",
    "gradient_checkpointing": "model.gradient_checkpointing",
    "bf16": "bf16",
    "logging_steps": "logging.logging_steps",
    "save_steps": "logging.save_steps",
    "min_reward": "min_reward",
}


def sft(
    args: Optional[list[str]] = typer.Argument(
        None, help="An optional preset name or YAML path, then key=value overrides (see `omrl config keys sft`)."
    ),
    model: Optional[str] = typer.Option(None, "--model", help="Model name or directory."),
    dataset: Optional[str] = typer.Option(
        None,
        "--dataset",
        help="JSONL, parquet, HF dataset directory, or `omrl rollout` output; several with weights: "
        "a.parquet:0.7,b.jsonl:0.3 (a mixture).",
    ),
    learning_rate: Optional[float] = LEARNING_RATE_OPTION,
    num_train_epochs: Optional[float] = EPOCHS_OPTION,
    max_seq_length: Optional[int] = typer.Option(None, "--max-seq-length", help="Tokens per row."),
    packing: Optional[bool] = typer.Option(None, "--packing/--no-packing", help="Pack conversations into rows."),
    per_device_train_batch_size: Optional[int] = typer.Option(
        None, "--per-device-train-batch-size", help="Rows per forward/backward pass."
    ),
    gradient_accumulation_steps: Optional[int] = typer.Option(
        None, "--gradient-accumulation-steps", help="Micro-batches per optimizer step."
    ),
    gradient_checkpointing: Optional[bool] = typer.Option(
        None, "--gradient-checkpointing/--no-gradient-checkpointing", help="Recompute activations to save memory."
    ),
    bf16: Optional[bool] = typer.Option(None, "--bf16/--no-bf16", help="bfloat16 autocast."),
    logging_steps: Optional[int] = typer.Option(None, "--logging-steps", help="Log every N steps."),
    save_steps: Optional[int] = typer.Option(None, "--save-steps", help="Checkpoint every N steps (0: at the end)."),
    output_dir: Optional[str] = typer.Option(
        None, "--output-dir", "-o", help="Run directory (default: runs/sft-<time>)."
    ),
    lora_rank: Optional[int] = LORA_RANK_OPTION,
    min_reward: Optional[float] = typer.Option(
        None, "--min-reward", help="Rollout data: keep episodes with total reward >= this."
    ),
    seed: Optional[int] = SEED_OPTION,
    resume: bool = typer.Option(
        False, "--resume", help="Continue from the newest complete checkpoint in the output directory."
    ),
) -> None:
    """Fine-tune a model on agent conversations (loss on the assistant's tokens only)."""
    from transformers.utils import logging as hf_logging

    from omrl.cli import err_console, stop_on_interrupt
    from omrl.config import command_line_config
    from omrl.config.options import SftRunConfig
    from omrl.config.presets import preset_inputs, resumed_preset, user_sets
    from omrl.data.mixture import dataset_inputs, mix_line
    from omrl.outputs import check_run_dir, fresh_dir
    from omrl.parallel import is_main_process
    from omrl.training.sft import run_sft

    flags = {FLAG_KEYS[name]: value for name, value in locals().items() if name in FLAG_KEYS}
    preset = resumed_preset(output_dir, resume, "sft")
    cfg = command_line_config(SftRunConfig, args, {**flags, "resume": True if resume else None}, preset)
    asked = output_dir is not None or user_sets(args, "logging.output_dir")  # runs/sft said is runs/sft
    if not asked and cfg.logging.output_dir in ("", "runs/sft"):  # the default: a fresh directory per run
        cfg.logging.output_dir = fresh_dir("runs", "sft")
    inputs = {"--model": cfg.model.name, **dataset_inputs(cfg.dataset, "--dataset"), **preset_inputs(args, resume)}
    check_run_dir(cfg.logging.output_dir, inputs, cfg.resume)
    hf_logging.disable_progress_bar()  # transformers' per-save bars would break the live progress line
    summary = stop_on_interrupt(lambda: run_sft(cfg), err_console)
    if is_main_process():  # under accelerate launch, one summary rather than one per process
        typer.echo(
            f"trained {summary['steps']} step{'s' * (summary['steps'] != 1)} (final loss {summary['final_loss']:.4f}, "
            f"{summary['mean_step_time']:.3f} s/step, {summary['skipped_updates']} skipped); "
            f"model saved in {summary['output_dir']}"
        )
        if "data_mix" in summary:
            typer.echo(f"dataset mixture: {mix_line(summary['data_mix'], 'conversations')}")


def add_to(app: typer.Typer) -> None:
    app.command("sft")(sft)
