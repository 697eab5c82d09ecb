"""The one scaffold of every training recipe: what SFT, reward models, GRPO/PPO and DPO do the same way
around their own setup and loop. A recipe calls these functions; it inherits nothing.

A recipe is a class that reads top to bottom: ``setup()``, ``train()`` (returns the run's
summary), ``cleanup()``; :func:`run_recipe` runs the three. Its setup starts with
:func:`start_setup` (config as checkpoints keep it, resume point, seed, device) and, once its
model is loaded, :func:`setup_optimizer`, :func:`resume` and :func:`setup_logger`; each step ends
in :func:`update` (or :func:`skip_update`) and :func:`log_step`; ``train()`` ends in
:func:`save_final`. Its forward passes run under :func:`autocast`. For example::

    def save_checkpoint(self) -> Path:
        return save_recipe_checkpoint(self, data_state={"epoch": self.epoch, ...})

    def cleanup(self) -> None:
        close_recipe(self)

    def run_sft(cfg, ...):
        return run_recipe(SftRecipe(cfg, ...), "sft")

A recipe that walks epochs of fixed data (SFT, reward models, an :class:`EpochRecipe`) uses
:func:`start_epoch_recipe`, :func:`dataset_sources_of`, :func:`finish_setup`, :func:`end_step`,
:func:`finish` and :func:`save_epoch_checkpoint`; the online recipes add the playing half,
:mod:`omrl.training.online_run`.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any, Protocol

import torch
from rich.console import Console
from torch import nn

from omrl.atomic import atomic_write_text
from omrl.clock import breakdown, take, timed
from omrl.config import to_dict, to_yaml
from omrl.data.mixture import DataSource, dataset_sources
from omrl.errors import ConfigError, EndpointError, FailedStep
from omrl.parallel import make_strategy
from omrl.supervisor import StageStalled, supervise
from omrl.training import checkpoint as ckpt
from omrl.training import stopped
from omrl.training.checkpoint_marker import damage, finished_note
from omrl.training.common import SkippedUpdates, seed_everything
from omrl.training.metrics import MetricsLogger, NullLogger, StepCallback, peak_memory, read_metrics
from omrl.training.model_setup import save_final_from_every_process
from omrl.training.optim import Update, apply_update, build_optimizer, build_scheduler
from omrl.training.resume import paths_as_saved, resume_point


class Recipe(Protocol):
    """What the scaffold functions read and set of a recipe (:func:`run_recipe` only its methods)."""

    cfg: Any  # a RunConfig with model, optim, logging and seed
    on_step_end: StepCallback | None  # called after each step's logging and checkpoint
    console: Console
    output_dir: Path
    step: int  # updates done (skipped ones too)
    saved_step: int  # the step of the last checkpoint this run wrote (-1: none)
    skipped: SkippedUpdates
    strategy: Any  # omrl.parallel.Strategy
    device: Any  # torch.device
    config_dict: dict[str, Any]  # the run's config as a checkpoint keeps it (omrl.config.to_dict)
    model: Any
    tokenizer: Any
    params: list[nn.Parameter]  # what the optimizer updates
    optimizer: Any
    scheduler: Any
    logger: MetricsLogger | NullLogger

    def setup(self) -> Any: ...

    def train(self) -> dict[str, Any]: ...

    def cleanup(self) -> None: ...

    def save_checkpoint(self) -> Path: ...


class EpochRecipe(Recipe, Protocol):
    """A recipe that walks epochs of fixed data (SFT, reward models): where it stands in them."""

    total_steps: int
    epoch: int
    index: int  # the next micro-batch of the epoch's order
    micro_per_epoch: int
    data_fingerprint: str  # the training data's; a resume refuses other data
    last_loss: float  # of the last step whose update applied (nan: none yet)
    step_times: list[float]  # seconds of each step this process ran


def check_logging(logging: Any) -> None:
    """Refuse a checkpoint or logging cadence that means nothing (a LoggingConfig), naming the key."""
    for key, low, meaning in (
        ("logging_steps", 1, "log every N steps"),
        ("save_steps", 0, "checkpoint every N steps; 0: only at the end"),
        ("keep_checkpoints", 0, "checkpoints kept; 0: all"),
    ):
        value = getattr(logging, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"logging.{key} must be a whole number >= {low} ({meaning}), got {value!r}")


def start_recipe(recipe: Recipe, cfg: Any, on_step_end: StepCallback | None, console: Console | None) -> None:
    """What every recipe's ``__init__`` sets first: its config, callback, console, output
    directory, step 0, skipped-update counts and strategy."""
    check_logging(cfg.logging)
    recipe.cfg = cfg
    recipe.on_step_end = on_step_end
    recipe.output_dir = Path(cfg.logging.output_dir)
    recipe.step, recipe.saved_step = 0, -1
    recipe.skipped = SkippedUpdates(cfg.optim.max_nan_steps)
    recipe.strategy = make_strategy(cfg.model.dtype)  # one process, or one of several under `accelerate launch`
    recipe.console = console or Console(stderr=True, quiet=not recipe.strategy.is_main)  # one report, not one each


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
            take()  # the setup's time is no step's (omrl.clock)
            try:
                return recipe.train()
            except (FailedStep, StageStalled, EndpointError) as stop:  # the world failed: keep what was done
                raise stopped.explained(recipe, stop, command) from stop
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


# -- SETUP --------------------------------------------------------------------------------------------


def start_setup(recipe: Recipe) -> Path | None:
    """The start of a recipe's setup, after its own config checks: the config as checkpoints keep
    it, the resume point (None: a fresh run), the seed and the device; returns the resume point."""
    cfg = recipe.cfg
    paths_as_saved(cfg)  # config.yaml too: `--resume` works from any folder
    recipe.config_dict = to_dict(cfg)
    resume_from = resume_point(
        recipe.output_dir,
        recipe.config_dict,
        cfg.resume,
        defaults=to_dict(type(cfg)()),
        renamed=getattr(type(cfg), "renamed_keys", None),  # keys the config class renamed (omrl.config.loading)
    )
    seed_everything(cfg.seed)
    recipe.device = recipe.strategy.device
    return resume_from


def autocast(recipe: Recipe) -> torch.autocast:
    """The precision a recipe's forward passes run in: bfloat16 autocast with ``bf16=true`` (weights,
    gradients and optimizer state stay as loaded), else a disabled region. Autocast keeps each weight's
    cast until its region ends, so a region spanning several micro-batches casts them once."""
    return torch.autocast(recipe.device.type, dtype=torch.bfloat16, enabled=bool(recipe.cfg.bf16))


def setup_optimizer(recipe: Recipe, schedule_steps: int, extra_modules: dict[str, nn.Module] | None = None) -> None:
    """The recipe's optimizer over the model's trainable weights and ``extra_modules``' (a value head,
    a critic: by name), handed to its strategy, and the learning-rate schedule over ``schedule_steps``
    optimizer steps."""
    optim, extra_modules = recipe.cfg.optim, extra_modules or {}
    extra = [p for module in extra_modules.values() for p in module.parameters()]
    recipe.params = [p for p in recipe.model.parameters() if p.requires_grad] + extra
    recipe.optimizer = build_optimizer(recipe.model, optim, extra_params=extra, fused=recipe.strategy.fused_optimizer)
    recipe.strategy.prepare_optimizer({"policy": recipe.model, **extra_modules}, recipe.optimizer, optim.max_grad_norm)
    recipe.scheduler = build_scheduler(recipe.optimizer, optim, schedule_steps)


def resume(recipe: Recipe, path: Path, total_steps: int) -> ckpt.Checkpoint:
    """Load the checkpoint at ``path`` into the recipe's model, optimizer and schedule, and continue
    at its step (of ``total_steps``) with its skipped-update counts; returns it (its data state and
    extras are the recipe's to read)."""
    state = ckpt.load_checkpoint(
        path, recipe.model, optimizer=recipe.optimizer, scheduler=recipe.scheduler, strategy=recipe.strategy
    )
    recipe.step = state.step
    recipe.skipped.load_state_dict(state.extra)
    done = finished_note(recipe.output_dir, recipe.step) if recipe.step >= total_steps else ""
    recipe.console.print(f"resuming from {path} at step {recipe.step} of {total_steps}{done}", soft_wrap=True)
    return state


def setup_logger(recipe: Recipe, description: str, total_steps: int) -> MetricsLogger | NullLogger:
    """The recipe's logger, counting from its (resumed) step to ``total_steps``: the main process
    logs; the others hold one that drops everything. The run's config.yaml is written beside it."""
    recipe.strategy.on_main(atomic_write_text, recipe.output_dir / "config.yaml", to_yaml(recipe.cfg))
    if not recipe.strategy.is_main:
        return NullLogger()
    return MetricsLogger(
        recipe.output_dir,
        recipe.cfg.logging,
        total_steps,
        start_step=recipe.step,
        run_config=recipe.config_dict,
        console=recipe.console,
        description=description,
    )


# -- each step ----------------------------------------------------------------------------------------


def update(recipe: Recipe, step: int, finite: bool = True, advance: int = 1) -> Update:
    """Step ``step``'s optimizer update, or its skip when the loss (``finite``) or the gradient is not
    finite, moving the schedule ``advance`` steps: :func:`omrl.training.optim.apply_update`."""
    with timed("optimizer"):
        return apply_update(
            recipe.strategy,
            recipe.params,
            recipe.optimizer,
            recipe.scheduler,
            recipe.skipped,
            recipe.logger,
            step,
            recipe.cfg.optim.max_grad_norm,
            finite,
            advance,
        )


def skip_update(recipe: Recipe, step: int, why: str) -> dict[str, float]:
    """Skip step ``step``'s update for ``why`` (nothing to learn from): no optimizer step; returns the
    skipped-update metrics."""
    recipe.strategy.zero_grad(recipe.optimizer)
    return recipe.skipped.skip(why, recipe.logger, step)


def log_step(recipe: Recipe, metrics: dict[str, Any]) -> None:
    """The end of every step: log ``metrics`` with peak memory and where the step's time went
    (:mod:`omrl.clock`) at the recipe's step, checkpoint every ``logging.save_steps``, then call
    ``on_step_end``."""
    metrics.update(peak_memory())
    parts = take()
    if parts:
        metrics.update(breakdown(metrics.get("step_time", sum(parts.values())), parts))
    with timed("log"):  # counted with the next step
        recipe.logger.log(recipe.step, metrics)
    save_steps = recipe.cfg.logging.save_steps
    if save_steps and recipe.step % save_steps == 0:
        recipe.save_checkpoint()
    if recipe.on_step_end is not None:
        recipe.on_step_end(recipe.step, metrics)


# -- the end ------------------------------------------------------------------------------------------


def save_recipe_checkpoint(recipe: Recipe, data_state: dict[str, Any], extra: dict[str, Any] | None = None) -> Path:
    """Checkpoint ``recipe`` at its step: weights, optimizer, schedule, random states, tokenizer,
    config, ``data_state`` (where its data stands, to resume at the next batch) and ``extra``
    (default: its skipped-update counts), keeping ``logging.keep_checkpoints`` of them. Every
    process calls; the main one writes."""
    recipe.saved_step = recipe.step
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


def save_final(recipe: Recipe) -> None:
    """The end of ``train()``: the final checkpoint (resumable; unless the last step wrote it) and
    the final model with its tokenizer in ``output_dir`` (LoRA merged in). Every process calls."""
    final = ckpt.checkpoint_path(recipe.output_dir, recipe.step)
    stale = recipe.saved_step != recipe.step  # not this run's: a damaged one a resume went back past, say
    if ckpt.latest_checkpoint(recipe.output_dir) != final or (stale and damage(final) is not None):
        recipe.save_checkpoint()
    save_final_from_every_process(recipe)


def close_all(*things: Any) -> None:
    """Close each of ``things`` in order; None stands for one never opened (``setup()`` stopped
    before it)."""
    for thing in things:
        if thing is not None:
            thing.close()


def close_recipe(recipe: Recipe) -> None:
    """A recipe's ``cleanup()``: its online run (when it plays one), its logger, then its strategy,
    each closed when ``setup()`` got as far as opening it."""
    close_all(*(getattr(recipe, name, None) for name in ("run", "logger", "strategy")))


# -- recipes that walk epochs of fixed data -----------------------------------------------------------


def start_epoch_recipe(
    recipe: EpochRecipe, cfg: Any, on_step_end: StepCallback | None, console: Console | None
) -> None:
    """:func:`start_recipe` for a recipe that walks epochs: at the start of the first one, with no
    step run yet."""
    start_recipe(recipe, cfg, on_step_end, console)
    recipe.epoch, recipe.index = 0, 0
    recipe.last_loss, recipe.step_times = float("nan"), []


def dataset_sources_of(cfg: Any, what: str) -> list[DataSource]:
    """The datasets ``cfg.dataset`` names (one, or several mixed by weight), their mistakes named before
    the model loads; ``what`` says what a dataset may be when none is given."""
    if not cfg.dataset:
        raise ConfigError(f"no dataset given; set dataset={what}")
    return dataset_sources(cfg.dataset)


def finish_setup(recipe: EpochRecipe, resume_from: Path | None, description: str, why_not: str = "") -> None:
    """The end of an epoch recipe's setup, once its model and data are set up: optimizer and schedule,
    the state resumed from ``resume_from`` (refused, ``why_not`` ending the message, when the training
    data changed since), the logger."""
    setup_optimizer(recipe, recipe.total_steps)
    if resume_from is not None:
        state = resume(recipe, resume_from, recipe.total_steps)
        if state.data_state.get("fingerprint") != recipe.data_fingerprint:
            raise ckpt.CheckpointError(
                f"cannot resume from {resume_from}: the training data changed since it was written (fingerprint "
                f"{state.data_state.get('fingerprint')} -> {recipe.data_fingerprint}){why_not}"
            )
        recipe.epoch, recipe.index = state.data_state["epoch"], state.data_state["index"]
    recipe.logger = setup_logger(recipe, description, recipe.total_steps)


def end_step(recipe: EpochRecipe, metrics: dict[str, Any], applied: bool) -> None:
    """:func:`log_step` with where the run stands in its epochs and the skipped-update counts; the
    step's time and, when its update ``applied``, its loss are kept for :func:`finish`'s summary."""
    recipe.step_times.append(metrics["step_time"])
    if applied:
        recipe.last_loss = metrics["loss"]
    log_step(
        recipe, {**metrics, "epoch": recipe.epoch + recipe.index / recipe.micro_per_epoch, **recipe.skipped.metrics()}
    )


def save_epoch_checkpoint(recipe: EpochRecipe) -> Path:
    """:func:`save_recipe_checkpoint` with where the recipe stands (epoch, index) and the data's fingerprint."""
    return save_recipe_checkpoint(
        recipe, data_state={"epoch": recipe.epoch, "index": recipe.index, "fingerprint": recipe.data_fingerprint}
    )


def _final_loss(recipe: EpochRecipe) -> float:
    """The loss of the run's last applied update: this process's, or, where it ran none (a finished run
    resumed), the last one the run logged."""
    if not math.isnan(recipe.last_loss):
        return recipe.last_loss
    logged = [r["loss"] for r in read_metrics(recipe.output_dir) if isinstance(r.get("loss"), (int, float))]
    return float(logged[-1]) if logged else recipe.last_loss


def finish(recipe: EpochRecipe, **extra: Any) -> dict[str, Any]:
    """The end of an epoch recipe's ``train()``: :func:`save_final`, then the run's summary (``extra``
    after the final loss)."""
    save_final(recipe)
    recipe.skipped.check_learned(recipe.step, recipe.output_dir, recipe.logger)
    return {
        "steps": recipe.step,
        "final_loss": _final_loss(recipe),
        **extra,
        "skipped_updates": recipe.skipped.count,
        "mean_step_time": sum(recipe.step_times) / max(len(recipe.step_times), 1),
        "output_dir": str(recipe.output_dir),
    }
