"""The ``omrl sft`` recipe: supervised fine-tuning on agent conversations.

Reads top to bottom: ``setup`` (seed, resume point, model, data, optimizer,
logger), ``train`` (the loop), ``cleanup``. The loss is the mean cross-entropy
over the assistant tokens of each optimizer step (all its micro-batches
together), with labels shifted per conversation (see :mod:`omrl.training.packing`).

A step whose loss or gradient is not finite is skipped (no update, and the
learning-rate schedule does not advance: :func:`omrl.training.optim.apply_update`)
with a warning; ``optim.max_nan_steps`` such steps in a row stop the run. The strategy
(:mod:`omrl.parallel`) hides how processes share the work.

Several datasets with weights (``dataset=a.parquet:0.7,b.jsonl:0.3``) are drawn
once, seeded, into one training set whose conversations come from each dataset in
the share its weight asks (how: :mod:`omrl.data.mixture`; the share is of the
conversations that fit ``max_seq_length``). Each step then logs
``conversations/<dataset>``, how many of its conversations each dataset gave, and
the start's per-dataset counts go to the console and ``data_mix.json``.

The output directory ends up holding the final model and tokenizer (LoRA merged
in, so ``omrl eval --model <output_dir>`` loads it), ``config.yaml``,
``metrics.jsonl``, ``checkpoints/`` and, for a mixture, ``data_mix.json``.
``cfg.resume`` continues from the newest complete checkpoint at exactly the next batch.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from omrl.chat import check_history
from omrl.clock import timed
from omrl.config.options import SftRunConfig
from omrl.data.conversations import load_conversations
from omrl.data.mixture import draw_mixture, mix_summary, report_mix
from omrl.errors import ConfigError, OmrlError
from omrl.models import check_context_window
from omrl.training import recipe
from omrl.training.metrics import StepCallback
from omrl.training.model_setup import load_trainable_model
from omrl.training.packing import (
    IGNORE_INDEX,
    Row,
    collate,
    fingerprint,
    micro_batches,
    pack_bins,
    pack_rows,
    tokenize_conversations,
)
from omrl.training.policy import labelled_nll_sum


class SftRecipe:
    """Supervised fine-tuning: ``setup()``, ``train()``, ``cleanup()`` (or :func:`run_sft`)."""

    def __init__(self, cfg: SftRunConfig, on_step_end: StepCallback | None = None, console: Console | None = None):
        recipe.start_epoch_recipe(self, cfg, on_step_end, console)

    # -- SETUP ----------------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        self.sources = recipe.dataset_sources_of(cfg, "<file or directory> (or --dataset)")
        if cfg.num_train_epochs <= 0:
            raise ConfigError(f"num_train_epochs must be > 0, got {cfg.num_train_epochs}")
        if cfg.optim.micro_batch_size < 1:
            raise ConfigError(f"optim.micro_batch_size must be >= 1, got {cfg.optim.micro_batch_size}")
        resume_from = recipe.start_setup(self)
        self._setup_model()
        self._setup_data()
        recipe.finish_setup(self, resume_from, "sft", "; resuming would not continue the same run")
        self.console.print(self._plan(), highlight=False, soft_wrap=True)
        accumulation, processes = cfg.optim.gradient_accumulation_steps, self.strategy.world_size
        if accumulation % processes:  # each process takes a share of a step's micro-batches
            idle = processes - accumulation % processes
            self.logger.warn(
                f"optim.gradient_accumulation_steps={accumulation} with {processes} processes: "
                f"{idle} of them sit{'s' * (idle == 1)} idle for part of every step (a step's "
                f"micro-batches are shared out among them); a multiple of {processes} keeps every process busy"
            )
        if self.truncated:
            self.logger.warn(
                f"{self.truncated} conversations were longer than max_seq_length={cfg.max_seq_length} "
                "tokens and were cut to it (raise max_seq_length to keep them whole)"
            )
        if self.dropped:
            self.logger.warn(
                f"{self.dropped} conversations had no assistant token within max_seq_length="
                f"{cfg.max_seq_length} and were dropped"
            )
        report_mix(self.mix, "conversations", cfg.dataset, cfg.seed, self.strategy, self.console, self.output_dir)

    def _plan(self) -> str:
        """The run in one line: model, data (packed or not), epochs, steps and how a step is made up."""
        cfg = self.cfg
        rows = len(self.rows)
        packed = (
            f", packed into {rows} row{'s' * (rows != 1)} of up to {cfg.max_seq_length} tokens" if cfg.packing else ""
        )
        processes = f" over {self.strategy.world_size} processes" if self.strategy.world_size > 1 else ""
        epochs, per_epoch, total = cfg.num_train_epochs, self.steps_per_epoch, self.total_steps
        return (
            f"omrl sft: {cfg.model.name} on {self.conversations} conversations{packed}; {epochs:g} "
            f"epoch{'s' * (epochs != 1)} of {per_epoch} step{'s' * (per_epoch != 1)} ({len(self.micro)} micro-batches "
            f"of up to {cfg.optim.micro_batch_size} rows, up to {cfg.optim.gradient_accumulation_steps} a step"
            f"{processes}): {total} step{'s' * (total != 1)} -> {self.output_dir}"
        )

    def _setup_model(self) -> None:
        check_context_window(self.cfg.model.name, self.cfg.max_seq_length, "max_seq_length")
        model, self.tokenizer = load_trainable_model(self.cfg.model, str(self.device), self.cfg.chat)
        self.model = self.strategy.prepare(model)  # sharded under FSDP (under ZeRO-3 with the optimizer)

    def _setup_data(self) -> None:
        cfg = self.cfg
        sources = self.sources
        loaded = [self._source_rows(source.path) for source in sources]
        self.dropped, self.truncated = sum(x[1] for x in loaded), sum(x[2] for x in loaded)
        self.conversations = sum(x[3] for x in loaded)
        self.mix: list[dict[str, Any]] = []  # per source of a mixture: its weight, conversations and draw
        row_source: list[int] = []  # in a mixture, the source of each conversation's row
        if len(sources) == 1:  # one dataset: read and trained on as it always was
            rows = loaded[0][0]
        else:
            sizes = [len(source_rows) for source_rows, _, _, _ in loaded]
            drawn = draw_mixture(sizes, [source.weight for source in sources], cfg.seed)
            rows = [loaded[source][0][item] for source, item in drawn]
            row_source = [source for source, _ in drawn]
            self.mix = mix_summary(sources, sizes, drawn, "conversations")
        self.rows = pack_rows(rows, cfg.max_seq_length) if cfg.packing else rows
        # the sources each training row holds: packed, in the bins pack_rows made
        packed = cfg.packing and row_source
        bins = (
            pack_bins([len(r) for r in rows], cfg.max_seq_length) if packed else [[i] for i in range(len(row_source))]
        )
        self.row_sources = [[row_source[i] for i in members] for members in bins]
        self.micro = micro_batches(self.rows, cfg.optim.micro_batch_size)
        self.micro_per_epoch = len(self.micro)
        self.micro_label_tokens = [
            sum(label != IGNORE_INDEX for r in rows for label in self.rows[r].labels) for rows in self.micro
        ]
        self.data_fingerprint = fingerprint(self.rows)
        accumulation = cfg.optim.gradient_accumulation_steps
        if accumulation < 1:
            raise ConfigError(f"optim.gradient_accumulation_steps must be >= 1, got {accumulation}")
        self.steps_per_epoch = math.ceil(len(self.micro) / accumulation)
        self.total_steps = max(1, math.ceil(cfg.num_train_epochs * self.steps_per_epoch))
        self._orders: dict[int, list[int]] = {}

    def _source_rows(self, path: str) -> tuple[list[Row], int, int, int]:
        """One dataset's training rows (one per conversation unless chat.history splits it), how many
        conversations were dropped and truncated, and how many it holds; an error naming ``path`` when it
        gives none."""
        cfg = self.cfg
        conversations = load_conversations(path, cfg.min_reward)
        if not conversations:
            raise OmrlError(
                f"{path} holds no conversations"
                + (f" with reward >= {cfg.min_reward}" if cfg.min_reward > float("-inf") else "")
            )
        check_history(cfg.chat.history)
        rows, dropped, truncated = tokenize_conversations(
            self.tokenizer, conversations, cfg.max_seq_length, cfg.chat.history, cfg.chat.template_kwargs
        )
        if not rows:
            raise OmrlError(
                f"no conversation in {path} has an assistant token within max_seq_length={cfg.max_seq_length}"
            )
        return rows, dropped, truncated, len(conversations)

    def step_mix(self, chosen: list[int]) -> dict[str, float]:
        """In a mixture: how many of a step's conversations (rows before packing) came from each dataset,
        as ``conversations/<dataset>``; nothing for one dataset."""
        if not self.mix:
            return {}
        counts = np.bincount(
            [source for j in chosen for r in self.micro[j] for source in self.row_sources[r]], minlength=len(self.mix)
        )
        return {f"conversations/{s['dataset']}": float(n) for s, n in zip(self.mix, counts.tolist())}

    def epoch_order(self, epoch: int) -> list[int]:
        """The micro-batch order of ``epoch``: a shuffle that depends only on the seed and the epoch."""
        if epoch not in self._orders:
            rng = np.random.default_rng([self.cfg.seed % 2**32, epoch])
            self._orders = {epoch: rng.permutation(len(self.micro)).tolist()}
        return self._orders[epoch]

    # -- TRAIN ----------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        cfg, model, strategy = self.cfg, self.model, self.strategy
        accumulation = cfg.optim.gradient_accumulation_steps
        pad_id = self.tokenizer.pad_token_id
        model.train()
        while self.step < self.total_steps:
            # DATA: the next micro-batches in this epoch's order
            order = self.epoch_order(self.epoch)
            if self.index >= len(order):
                self.epoch, self.index = self.epoch + 1, 0
                continue
            chosen = order[self.index : self.index + accumulation]
            self.index += len(chosen)
            self.step += 1
            started = time.perf_counter()
            label_tokens = sum(self.micro_label_tokens[j] for j in chosen)
            tokens = sum(len(self.rows[r]) for j in chosen for r in self.micro[j])
            # with several processes each takes its share of the step's micro-batches
            batches = [collate([self.rows[r] for r in self.micro[j]], pad_id) for j in strategy.shard(chosen)]

            # FORWARD/BACKWARD: loss = summed token losses / assistant tokens in the whole step
            loss_value, finite = 0.0, True
            for batch in strategy.micro_batches(batches, idle=self._forward):
                batch = {k: v.to(self.device) for k, v in batch.items()}
                loss = self._forward(batch) / label_tokens
                # backward even when not finite (the step is skipped below): when sharded every process
                # must take part in each backward's collectives
                with timed("backward"):
                    strategy.backward(loss)
                finite = finite and bool(torch.isfinite(loss))
                loss_value += loss.item()

            # UPDATE: sum gradients over processes, clip, step, or skip a non-finite step
            loss_value, nonfinite_anywhere = strategy.sum([loss_value, not finite])
            finite = not nonfinite_anywhere
            grad_norm, lr, applied = recipe.update(self, self.step, finite)

            # LOG and CHECKPOINT
            step_time = time.perf_counter() - started
            metrics = {
                "loss": loss_value if finite else float("nan"),
                "lr": lr,
                "tokens_per_s": tokens / step_time,
                "step_time": step_time,
                "grad_norm": grad_norm,
                "label_tokens": label_tokens,
                **self.step_mix(chosen),
            }
            recipe.end_step(self, metrics, applied)  # with the epoch, peak memory and skipped updates

        # SAVE: the final checkpoint (resumable) and the final model (LoRA merged)
        return recipe.finish(self, **({"data_mix": self.mix} if self.mix else {}))

    @timed("forward")
    def _forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """A micro-batch's summed token loss, through the strategy (a forward it counts)."""
        return self.strategy.forward(self._loss_sum, batch)

    def _loss_sum(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with recipe.autocast(self):
            return labelled_nll_sum(self.model, batch["input_ids"], batch["position_ids"], batch["labels"])

    def save_checkpoint(self) -> Path:
        """Every process calls; the main one writes."""
        return recipe.save_epoch_checkpoint(self)

    # -- CLEANUP --------------------------------------------------------------------------------------
    def cleanup(self) -> None:
        recipe.close_recipe(self)


def run_sft(
    cfg: SftRunConfig, on_step_end: StepCallback | None = None, console: Console | None = None
) -> dict[str, Any]:
    """Set up, train and clean up; returns a summary (steps, final_loss, skipped_updates, mean_step_time)."""
    return recipe.run_recipe(SftRecipe(cfg, on_step_end=on_step_end, console=console), "sft")
