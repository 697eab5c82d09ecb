"""What every training recipe does the same way around its own setup and loop: run, checkpoint, close.

A recipe is a class that reads top to bottom: ``setup()``, ``train()`` (returns the run's
summary), ``cleanup()``. These functions are what SFT, reward models and RL would otherwise
each write out again; a recipe calls them, it does not inherit them:

    def save_checkpoint(self) -> Path:
        return save_recipe_checkpoint(self, data_state={"epoch": self.epoch, ...})

    def cleanup(self) -> None:
        close_all(getattr(self, "logger", None), self.strategy)

    def run_sft(cfg, ...):
        return run_recipe(SftRecipe(cfg, ...), "sft")

and at the end of ``train()``, ``save_final(self)``: the last checkpoint and the model.
A recipe that walks epochs of fixed data (SFT, reward models) also sets itself up with
:func:`start_setup` and :func:`finish_setup`, steps with :func:`update` and :func:`end_step`,
and ends with :func:`finish`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from omrl.config import to_dict
from omrl.parallel import make_strategy
from omrl.supervisor import supervise
from omrl.training import checkpoint as ckpt
from omrl.training.common import SkippedUpdates, seed_everything
from omrl.training.metrics import MetricsLogger, NullLogger, StepCallback, peak_memory
from omrl.training.model_setup import save_final_from_every_process
from omrl.training.optim import Update, apply_update, build_optimizer, build_scheduler


class Recipe(Protocol):
    """What these functions read of a recipe (:func:`run_recipe` only its three methods)."""

    cfg: Any  # a RunConfig with optim and logging
    output_dir: Path
    step: int  # updates done (skipped ones too)
    strategy: Any  # omrl.parallel.Strategy
    model: Any
    optimizer: Any
    scheduler: Any
    tokenizer: Any
    config_dict: dict[str, Any]  # the run's config as a checkpoint keeps it (omrl.config.to_dict)
    skipped: Any  # omrl.training.common.SkippedUpdates

    def setup(self) -> Any: ...

    def train(self) -> dict[str, Any]: ...

    def cleanup(self) -> None: ...

    def save_checkpoint(self) -> Path: ...


def start_recipe(recipe: Any, cfg: Any, on_step_end: StepCallback | None, console: Console | None) -> None:
    """What every recipe's ``__init__`` sets first: its config, callback, console, output
    directory, step 0, skipped-update counts and strategy."""
    recipe.cfg = cfg
    recipe.on_step_end = on_step_end  # called after each step's logging and checkpoint
    recipe.console = console or Console(stderr=True)
    recipe.output_dir = Path(cfg.logging.output_dir)
    recipe.step = 0
    recipe.skipped = SkippedUpdates(cfg.optim.max_nan_steps)
    recipe.strategy = make_strategy(cfg.model.dtype)  # one process, or one of several under `accelerate launch`


def run_recipe(recipe: Recipe, command: str) -> dict[str, Any]:
    """Set up, train and clean up ``recipe``; returns what ``train()`` returns. Ctrl-C becomes
    :class:`~omrl.training.checkpoint.Interrupted`, naming the checkpoint kept and the ``omrl
    <command> ... --resume`` that continues from it. ``cleanup()`` runs however it ends."""
    deadlines = getattr(recipe.cfg, "deadlines", None)  # a recipe that plays episodes states them
    watch = (
        supervise(
            deadlines, recipe.output_dir, warn=lambda text: _warn(recipe, text), heartbeat=lambda r: _beat(recipe, r)
        )
        if deadlines is not None
        else contextlib.nullcontext()
    )
    try:
        with watch:
            recipe.setup()
            return recipe.train()
    except KeyboardInterrupt as stop:
        raise ckpt.interrupted(recipe.cfg.logging.output_dir, command) from stop
    finally:
        recipe.cleanup()


def _warn(recipe: Recipe, text: str) -> None:
    logger = getattr(recipe, "logger", None)  # above the progress bar, once there is one
    if logger is not None:
        logger.warn(text)
    else:
        recipe.console.print(f"[yellow]warning:[/] {text}", highlight=False, soft_wrap=True)


def _beat(recipe: Recipe, record: dict[str, Any]) -> None:
    logger = getattr(recipe, "logger", None)
    if logger is not None and hasattr(logger, "heartbeat"):
        logger.heartbeat(record)


def save_recipe_checkpoint(recipe: Recipe, data_state: dict[str, Any], extra: dict[str, Any] | None = None) -> Path:
    """Checkpoint ``recipe`` at its step: weights, optimizer, schedule, random states, tokenizer,
    config, ``data_state`` (where its data stands, to resume at the next batch) and ``extra``
    (default: its skipped-update counts), keeping ``logging.keep_checkpoints`` of them. Every
    process calls; the main one writes."""
    return ckpt.save_from_every_process(
        recipe.strategy,
        recipe.output_dir,
        recipe.step,
        recipe.model,
        recipe.optimizer,
        scheduler=recipe.scheduler,
        data_state=data_state,
        config=recipe.config_dict,
        extra=recipe.skipped.state_dict() if extra is None else extra,
        tokenizer=recipe.tokenizer,
        keep=recipe.cfg.logging.keep_checkpoints,
    )


def save_epoch_checkpoint(recipe: Any) -> Path:
    """:func:`save_recipe_checkpoint` for a recipe that walks epochs of fixed data: where it stands
    (epoch, index) and the data's fingerprint."""
    return save_recipe_checkpoint(
        recipe, data_state={"epoch": recipe.epoch, "index": recipe.index, "fingerprint": recipe.data_fingerprint}
    )


def save_final(recipe: Recipe) -> None:
    """The end of ``train()``: the final checkpoint (resumable; unless the last step wrote it) and
    the final model with its tokenizer in ``output_dir`` (LoRA merged in). Every process calls."""
    if ckpt.latest_checkpoint(recipe.output_dir) != ckpt.checkpoint_path(recipe.output_dir, recipe.step):
        recipe.save_checkpoint()
    save_final_from_every_process(
        recipe.strategy, recipe.model, recipe.tokenizer, recipe.output_dir, merge_lora=recipe.cfg.model.lora_rank > 0
    )


def start_setup(recipe: Any) -> Path | None:
    """The start of an epoch recipe's setup, after its config checks: the config as checkpoints keep
    it, the resume point (None: a fresh run), the seed and the device; returns the resume point."""
    cfg = recipe.cfg
    recipe.config_dict = to_dict(cfg)
    resume_from = ckpt.resume_point(recipe.output_dir, recipe.config_dict, cfg.resume, defaults=to_dict(type(cfg)()))
    seed_everything(cfg.seed)
    recipe.device = recipe.strategy.device
    return resume_from


def finish_setup(recipe: Any, resume_from: Path | None, description: str, why_not: str = "") -> None:
    """The end of it, once the recipe's model and data are set up: optimizer and schedule, the state
    resumed from ``resume_from`` (see :func:`load_resume_state`), the logger (see :func:`setup_logger`)."""
    setup_optimizer(recipe)
    if resume_from is not None:
        load_resume_state(recipe, resume_from, why_not)
    recipe.logger = setup_logger(recipe, description)


def setup_logger(recipe: Any, description: str) -> MetricsLogger | NullLogger:
    """The recipe's logger, counting from its (resumed) step to ``total_steps``: the main process
    logs; the others hold one that drops everything."""
    if not recipe.strategy.is_main:
        return NullLogger()
    return MetricsLogger(
        recipe.output_dir,
        recipe.cfg.logging,
        recipe.total_steps,
        start_step=recipe.step,
        run_config=recipe.config_dict,
        console=recipe.console,
        description=description,
    )


def setup_optimizer(recipe: Any) -> None:
    """The recipe's optimizer (handed to its strategy) and learning-rate schedule over ``total_steps``."""
    optim = recipe.cfg.optim
    recipe.optimizer = build_optimizer(recipe.model, optim, fused=recipe.strategy.fused_optimizer)
    recipe.strategy.prepare_optimizer({"policy": recipe.model}, recipe.optimizer, optim.max_grad_norm)
    recipe.scheduler = build_scheduler(recipe.optimizer, optim, recipe.total_steps)


def load_resume_state(recipe: Any, path: Path, why_not: str = "") -> None:
    """Load the checkpoint at ``path`` into ``recipe`` and continue at its step, epoch and index;
    refused (``why_not`` ends the message) when the training data's fingerprint changed since."""
    state = ckpt.load_checkpoint(
        path, recipe.model, optimizer=recipe.optimizer, scheduler=recipe.scheduler, strategy=recipe.strategy
    )
    if state.data_state.get("fingerprint") != recipe.data_fingerprint:
        raise ckpt.CheckpointError(
            f"cannot resume from {path}: the training data changed since it was written (fingerprint "
            f"{state.data_state.get('fingerprint')} -> {recipe.data_fingerprint}){why_not}"
        )
    recipe.step = state.step
    recipe.epoch, recipe.index = state.data_state["epoch"], state.data_state["index"]
    recipe.skipped.load_state_dict(state.extra)


def update(recipe: Any, finite: bool) -> Update:
    """The step's optimizer update (or its skip): :func:`omrl.training.optim.apply_update`."""
    return apply_update(
        recipe.strategy,
        recipe.params,
        recipe.optimizer,
        recipe.scheduler,
        recipe.skipped,
        recipe.logger,
        recipe.step,
        recipe.cfg.optim.max_grad_norm,
        finite,
    )


def end_step(recipe: Any, metrics: dict[str, Any]) -> None:
    """After a step: log ``metrics`` with where the run stands in its epochs, peak memory and the
    skipped-update counts; checkpoint every ``logging.save_steps``, then call ``on_step_end``."""
    metrics = {
        **metrics,
        "epoch": recipe.epoch + recipe.index / recipe.micro_per_epoch,
        **peak_memory(),
        **recipe.skipped.metrics(),
    }
    recipe.logger.log(recipe.step, metrics)
    save_steps = recipe.cfg.logging.save_steps
    if save_steps and recipe.step % save_steps == 0:
        recipe.save_checkpoint()
    if recipe.on_step_end is not None:
        recipe.on_step_end(recipe.step, metrics)


def finish(recipe: Any, last_loss: float, step_times: list[float], **extra: Any) -> dict[str, Any]:
    """The end of an epoch recipe's ``train()``: :func:`save_final`, then the run's summary (``extra``
    after the final loss)."""
    save_final(recipe)
    return {
        "steps": recipe.step,
        "final_loss": last_loss,
        **extra,
        "skipped_updates": recipe.skipped.count,
        "mean_step_time": sum(step_times) / len(step_times) if step_times else 0.0,
        "output_dir": str(recipe.output_dir),
    }


def close_all(*things: Any) -> None:
    """Close each of ``things`` in order; None stands for one never opened (``setup()`` stopped
    before it)."""
    for thing in things:
        if thing is not None:
            thing.close()
