"""The ``omrl rm train`` recipe: a reward model from trajectory files.

Reads top to bottom like :mod:`omrl.training.sft`: ``setup`` (seed, resume point,
model, data, optimizer, logger), ``train`` (the loop), ``cleanup``. The loss is
summed over the labelled positions of a step's micro-batches and divided by their
number (pairs for ``bt``):

- ``bce``: binary cross-entropy of the head's logit against the label in [0, 1];
- ``mse``: squared error of the head's value against the label;
- ``bt``: -log sigmoid(value(chosen) - value(rejected)) per pair (Bradley-Terry).

Loss falls only where labels are; every other token only feeds the backbone. The
output directory ends up holding the reward model (LoRA merged) in Hugging Face
format, ``config.yaml``, ``metrics.jsonl``, ``checkpoints/``, and with
``eval_dataset`` an ``rm_eval.json`` report.

Several trajectory datasets with weights (``dataset=a.parquet:0.5,b.parquet:0.5``, each a
file or a directory of them) are drawn once, seeded, as SFT draws them (:mod:`omrl.data.mixture`):
their examples, or for ``bt`` their pairs (made within each dataset), in the shares the weights
ask; the per-dataset counts go to the console and ``data_mix.json``. A mixture's labels must not
all be the same; one dataset of it may hold one outcome (expert wins beside a policy's losses).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console

from omrl.clock import timed
from omrl.config.options import RmTrainRunConfig
from omrl.data.mixture import draw_mixture, mix_summary, report_mix
from omrl.errors import ConfigError
from omrl.rm.data import collate, fingerprint, load_examples, pair_rows, pointwise_rows
from omrl.rm.labels import check_label, check_outcomes
from omrl.rm.model import build_reward_model, check_kind, head_values, mismatched_episode
from omrl.training import recipe
from omrl.training.metrics import StepCallback
from omrl.training.model_setup import made_trainable

IN_MIXTURE = "(in a mixture each dataset pairs its own episodes)"


class RmRecipe:
    """Reward-model training: ``setup()``, ``train()``, ``cleanup()`` (or :func:`run_rm_train`)."""

    def __init__(self, cfg: RmTrainRunConfig, on_step_end: StepCallback | None = None, console: Console | None = None):
        recipe.start_epoch_recipe(self, cfg, on_step_end, console)

    # -- SETUP ----------------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        self.sources = recipe.dataset_sources_of(cfg, "<trajectory parquet or directory> (or --data)")
        check_kind(cfg.kind, cfg.objective)
        check_label(cfg.kind, cfg.label)
        if cfg.objective == "bce" and cfg.label == "step_reward":
            raise ConfigError("label=step_reward is a real-valued reward; valid objective for it: mse")
        if cfg.num_train_epochs <= 0:
            raise ConfigError(f"num_train_epochs must be > 0, got {cfg.num_train_epochs}")
        if cfg.max_seq_length < 2 or cfg.max_pairs_per_task < 1:
            raise ConfigError(
                f"max_seq_length={cfg.max_seq_length} and max_pairs_per_task={cfg.max_pairs_per_task}: "
                "valid: max_seq_length >= 2 and max_pairs_per_task >= 1"
            )
        if cfg.optim.micro_batch_size < 1 or cfg.optim.gradient_accumulation_steps < 1:
            raise ConfigError(
                "optim.micro_batch_size and optim.gradient_accumulation_steps must be >= 1, got "
                f"{cfg.optim.micro_batch_size} and {cfg.optim.gradient_accumulation_steps}"
            )
        resume_from = recipe.start_setup(self)
        self._setup_model()
        self._setup_data()
        recipe.finish_setup(self, resume_from, "rm")
        if self.cut:
            self.logger.warn(
                f"{self.cut} episodes were longer than max_seq_length={cfg.max_seq_length} tokens "
                + ("and were left out" if cfg.kind == "orm" else "and were cut (later labels dropped)")
            )
        unit = "pairs" if cfg.objective == "bt" else "examples"
        report_mix(self.mix, unit, cfg.dataset, cfg.seed, self.strategy, self.console, self.output_dir)

    def _setup_model(self) -> None:
        cfg = self.cfg
        model, self.tokenizer = build_reward_model(
            cfg.model.name,
            cfg.kind,
            cfg.objective,
            cfg.label,
            dtype=cfg.model.dtype,
            device=str(self.device),
            trust_remote_code=cfg.model.trust_remote_code,
        )
        model = made_trainable(model, cfg.model, task_type="TOKEN_CLS", new_heads=("score",))  # a new head: whole
        self.model = self.strategy.prepare(model)

    def _setup_data(self) -> None:
        cfg = self.cfg
        mixed = len(self.sources) > 1  # a mixture's outcomes are checked once drawn: one source may have one
        loaded = [
            load_examples(
                source.path,
                cfg.kind,
                cfg.label,
                cfg.max_seq_length,
                self.tokenizer if cfg.text else None,
                for_training=not mixed,
                tokenizer=self.tokenizer,
            )
            for source in self.sources
        ]
        found = [ex for examples, _, _ in loaded for ex in examples]
        episodes = [ep for _, source_episodes, _ in loaded for ep in source_episodes]
        self.cut = sum(cut for _, _, cut in loaded)
        held_out: list[Any] = []
        if cfg.eval_dataset:  # evaluated after training: loaded now, so bad ids or no labels fail before step 1
            _, held_out, _ = load_examples(
                cfg.eval_dataset,
                cfg.kind,
                cfg.label,
                1 << 30,  # as evaluate_reward_model loads it: nothing cut
                self.tokenizer if cfg.text else None,
                for_training=False,
                tokenizer=self.tokenizer,
            )
        if not cfg.text:
            for data, checked in ((cfg.dataset, episodes), (cfg.eval_dataset, held_out)):
                bad = mismatched_episode(self.tokenizer, checked)
                if bad is not None:
                    raise ConfigError(
                        f"the episodes in {data} were not tokenized with {cfg.model.name!r}'s "
                        f"tokenizer (task {bad.task_id} does not decode to its messages); train on the "
                        "policy's own base model, or set text=true to re-encode the chats"
                    )
        outside = next((t for ex in found for t in ex.targets if not 0.0 <= t <= 1.0), None)
        if cfg.objective == "bce" and outside is not None:
            raise ConfigError(
                f"{cfg.dataset} has the label {outside!r} ({cfg.label}), but objective=bce needs labels "
                "in [0, 1]; valid: objective=mse for other values"
            )
        # what a mixture draws by weight: a source's pairs (bt, made within the source) or its examples
        self.mix: list[dict[str, Any]] = []
        if cfg.objective == "bt":
            per_source = [
                pair_rows(
                    examples, cfg.max_pairs_per_task, f"{source.path} {IN_MIXTURE}" if mixed else cfg.dataset, cfg.seed
                )
                for (examples, _, _), source in zip(loaded, self.sources)
            ]
            self.pairs = self._draw(per_source, "pairs")
            self.rows = [row for pair in self.pairs for row in pair]  # chosen, rejected, chosen, ...
            units = [[2 * i, 2 * i + 1] for i in range(len(self.pairs))]
        else:
            found = self._draw([examples for examples, _, _ in loaded], "examples")
            if mixed:
                check_outcomes(found, cfg.label, cfg.dataset)
            self.rows = pointwise_rows(found, cfg.max_seq_length, cfg.packing)
            units = [[i] for i in range(len(self.rows))]
        self.units = units
        self.examples = len(found)
        self.data_fingerprint = fingerprint(self.rows)
        self.micro_per_epoch = math.ceil(len(units) / cfg.optim.micro_batch_size)
        self.steps_per_epoch = math.ceil(self.micro_per_epoch / cfg.optim.gradient_accumulation_steps)
        self.total_steps = max(1, math.ceil(cfg.num_train_epochs * self.steps_per_epoch))

    def _draw(self, per_source: list[list[Any]], unit: str) -> list[Any]:
        """One source's units as they are; a mixture's drawn by weight (:mod:`omrl.data.mixture`), with
        ``self.mix`` its per-source counts."""
        if len(per_source) == 1:
            return per_source[0]
        empty = next((s.path for s, units in zip(self.sources, per_source) if not units), None)
        if empty is not None:
            raise ConfigError(
                f"{empty} gives no {unit} to train on, so its weight in dataset={self.cfg.dataset} cannot be met"
            )
        sizes = [len(units) for units in per_source]
        drawn = draw_mixture(sizes, [s.weight for s in self.sources], self.cfg.seed)
        self.mix = mix_summary(self.sources, sizes, drawn, unit)
        return [per_source[source][item] for source, item in drawn]

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """The micro-batches (row indices) of ``epoch``: units shuffled by the seed and the epoch, then cut
        in order. Not grouped by length: when length goes with outcome (short wins, long losses), such
        batches would each hold one class and the head would swing between them."""
        order = np.random.default_rng([self.cfg.seed % 2**32, epoch]).permutation(len(self.units)).tolist()
        size = self.cfg.optim.micro_batch_size
        return [[r for u in order[i : i + size] for r in self.units[u]] for i in range(0, len(order), size)]

    # -- TRAIN ----------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        cfg, strategy = self.cfg, self.strategy
        accumulation = cfg.optim.gradient_accumulation_steps
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.model.train()
        micro = self.epoch_batches(self.epoch)
        while self.step < self.total_steps:
            # DATA: the next micro-batches of this epoch
            if self.index >= len(micro):
                self.epoch, self.index = self.epoch + 1, 0
                micro = self.epoch_batches(self.epoch)
            chosen = micro[self.index : self.index + accumulation]
            self.index += len(chosen)
            self.step += 1
            started = time.perf_counter()
            labels = sum(self._labels(rows) for rows in chosen)
            batches = [collate([self.rows[r] for r in rows], pad_id) for rows in strategy.shard(chosen)]

            # FORWARD/BACKWARD: summed loss over labels (or pairs) / their number in the whole step
            loss_value, correct, finite = 0.0, 0.0, True
            for batch in strategy.micro_batches(batches, idle=self._forward):
                batch = {k: v.to(self.device) for k, v in batch.items()}
                values = self._forward(batch)[batch["row"], batch["position"]]
                loss_sum, hits = self._loss(values, batch["targets"])
                loss = loss_sum / labels
                with timed("backward"):
                    strategy.backward(loss)
                finite = finite and bool(torch.isfinite(loss))
                loss_value += loss.item()
                correct += hits

            # UPDATE: sum over processes, clip, step, or skip a non-finite step
            loss_value, correct, nonfinite = strategy.sum([loss_value, correct, not finite])
            finite = not nonfinite
            grad_norm, lr, applied = recipe.update(self, self.step, finite)

            # LOG and CHECKPOINT
            step_time = time.perf_counter() - started
            metrics = {
                "loss": loss_value if finite else float("nan"),
                "train_accuracy": correct / labels,
                "lr": lr,
                "grad_norm": grad_norm,
                "labels": labels,
                "step_time": step_time,
            }
            recipe.end_step(self, metrics, applied)  # with the epoch, peak memory and skipped updates

        # SAVE: the final checkpoint (resumable) and the reward model (LoRA merged)
        mix = {"data_mix": self.mix} if self.mix else {}
        return recipe.finish(self, examples=self.examples, **mix)

    def _labels(self, rows: list[int]) -> int:
        """What a micro-batch's loss is averaged over: its pairs (bt) or its labelled positions."""
        return len(rows) // 2 if self.cfg.objective == "bt" else sum(len(self.rows[r].positions) for r in rows)

    def _loss(self, values: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, float]:
        """(summed loss, how many labels or pairs it got right): values and targets [n]."""
        objective = self.cfg.objective
        if objective == "bt":  # rows alternate chosen, rejected
            margin = values[0::2] - values[1::2]
            return -F.logsigmoid(margin).sum(), float((margin > 0).sum())
        if objective == "bce":
            hits = ((values > 0) == (targets >= 0.5)).sum()
            return F.binary_cross_entropy_with_logits(values, targets, reduction="sum"), float(hits)
        return ((values - targets) ** 2).sum(), float(((values >= 0.5) == (targets >= 0.5)).sum())

    @timed("forward")
    def _forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The head's values at every token of a micro-batch [bs, L], through the strategy."""
        return self.strategy.forward(self._values, batch)

    def _values(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with recipe.autocast(self):
            return head_values(self.model, batch["input_ids"], batch["position_ids"])

    def save_checkpoint(self) -> Path:
        """Every process calls; the main one writes."""
        return recipe.save_epoch_checkpoint(self)

    # -- CLEANUP --------------------------------------------------------------------------------------
    def cleanup(self) -> None:
        recipe.close_recipe(self)


def run_rm_train(
    cfg: RmTrainRunConfig, on_step_end: StepCallback | None = None, console: Console | None = None
) -> dict[str, Any]:
    """Set up, train and clean up; with ``eval_dataset``, also evaluate and write ``rm_eval.json``."""
    rm_recipe = RmRecipe(cfg, on_step_end=on_step_end, console=console)
    summary = recipe.run_recipe(rm_recipe, "rm train")
    if cfg.eval_dataset and rm_recipe.strategy.is_main:
        from omrl.rm.evaluate import evaluate_reward_model, write_rm_report

        report = evaluate_reward_model(summary["output_dir"], cfg.eval_dataset, text=cfg.text)
        summary["eval"] = report
        write_rm_report(report, Path(summary["output_dir"]) / "rm_eval.json")
    return summary
