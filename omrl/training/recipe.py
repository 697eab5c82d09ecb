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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from omrl.training import checkpoint as ckpt
from omrl.training.model_setup import save_final_from_every_process


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


def run_recipe(recipe: Recipe, command: str) -> dict[str, Any]:
    """Set up, train and clean up ``recipe``; returns what ``train()`` returns. Ctrl-C becomes
    :class:`~omrl.training.checkpoint.Interrupted`, naming the checkpoint kept and the ``omrl
    <command> ... --resume`` that continues from it. ``cleanup()`` runs however it ends."""
    try:
        recipe.setup()
        return recipe.train()
    except KeyboardInterrupt as stop:
        raise ckpt.interrupted(recipe.cfg.logging.output_dir, command) from stop
    finally:
        recipe.cleanup()


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


def save_final(recipe: Recipe) -> None:
    """The end of ``train()``: the final checkpoint (resumable; unless the last step wrote it) and
    the final model with its tokenizer in ``output_dir`` (LoRA merged in). Every process calls."""
    if ckpt.latest_checkpoint(recipe.output_dir) != ckpt.checkpoint_path(recipe.output_dir, recipe.step):
        recipe.save_checkpoint()
    save_final_from_every_process(
        recipe.strategy, recipe.model, recipe.tokenizer, recipe.output_dir, merge_lora=recipe.cfg.model.lora_rank > 0
    )


def close_all(*things: Any) -> None:
    """Close each of ``things`` in order; None stands for one never opened (``setup()`` stopped
    before it)."""
    for thing in things:
        if thing is not None:
            thing.close()
