"""RL update throughput: the recipe's forward+backward vs a bare one on the same sequences, in one run.

    python benchmarks/update_throughput.py [--model smollm2-135m] [--episodes 4] [--rounds 2] [--json out.json]

Sequences: the default WebShop job's shapes (``configs/grpo.yaml``: react template, worked
example on, at most 6 turns, 48 new tokens a turn, 1,536 tokens of context), played by the
env's scripted expert on ``--episodes`` tasks (grouped in pairs like the job's 2 samples a
task), so they are ~1,300-token multi-turn chats of slightly different lengths whose model
tokens carry the loss. (The expert's replies are shorter than a sampled model's: about 5% of
the tokens carry loss here.)

Peer (the limit): a bare forward+backward of the same model on the same sequences, one row
at a time with no padding: ``model(input_ids, logits_to_keep=<positions that predict a
model token>)``, the log-prob of those tokens, their mean, backward. It does the least work
that gives the same gradient's shape of computation.

The recipe's side is what ``omrl train --algo grpo`` does in its UPDATE section for one
on-policy pass: ``episodes_to_batch`` -> ``sort_by_length`` -> the advantage estimator ->
``micro_batches(batch, optim.micro_batch_size)`` -> ``policy_forward`` (log-probs and
entropy, LM head on the model tokens only) -> ``policy_gradient_loss`` -> backward weighted
by tokens; the old log-probs are the forward's own, detached (one epoch, one mini-batch).
Measured for micro-batch sizes 1 and 2, and with ``optim.share_prefix`` (on by default: rows
that open with the same tokens run them once, here the system prompt and worked example every
WebShop episode starts with; the job's samples of one task also share their first prompt,
which these one-episode-per-task rows do not), at micro-batch 1 and at the largest size (a prefix's
rows packed, as one sequence of their suffixes). The optimizer step is left out of both sides.

Targets: tokens/s of the recipe >= 0.9x the bare pass and a padding share < 5% (padded
positions / all positions the recipe's micro-batches run). The rows are cut into units as the
recipe pairs them (longest first, ``max(--micro-batch-sizes)`` rows each); every side runs a
unit right after the others, their order rotating from unit to unit, and the ratio (bare
seconds / recipe seconds on the same rows) is taken per unit: min and median over units and
rounds. Each unit is a round in the sense of the other benchmarks, so a loaded machine slows
the sides alike.

Memory (on by default; ``--no-memory`` skips it): each configuration runs in a fresh process,
loads the model, lowers the RSS high-water mark to the RSS (``/proc/self/clear_refs``), runs
the longest micro-batch's forward+backward (``--memory-full-pass``: the whole pass) and reads
the high-water mark (VmHWM); reported are that peak and what the pass added to the RSS before
it: bare one row, recipe micro-batch 1 and 2, the recipe also with
``model.gradient_checkpointing``.
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _memory import GIB, parse_args, peak_while, run_worker, worker_spec
from _results import default_json, machine, save_json

TOKENS_TARGET = 0.9
PADDING_TARGET = 0.05


def job_config(model: str, overrides: list[str]):
    from omrl.config import load_config
    from omrl.config.options import TrainRunConfig

    return load_config(TrainRunConfig, "grpo", [f"model.name={model}", *overrides])


def expert_episodes(cfg, count: int):
    """``count`` expert episodes of the job's env, one per task (the expert plays a task the same way
    every time, and sampled episodes of one task differ), grouped in pairs as the job's 2 samples a
    task would be, with rewards that differ within each pair so the advantages are not all 0."""
    from omrl import registry
    from omrl.models import load_tokenizer
    from omrl.rollout import EnvPool, RolloutLimits, collect

    tokenizer = load_tokenizer(cfg.model.name)
    pool = EnvPool(registry.envs.get(cfg.env.name), name=cfg.env.name)
    tasks = list(pool.probe().split_of(cfg.env.split))[:count]
    template = registry.templates.get(cfg.env.template)()
    episodes = collect(
        pool,
        template,
        tokenizer,
        tasks,
        expert=True,
        limits=RolloutLimits.from_config(cfg.generation, cfg.env.max_turns),
        demonstration=cfg.env.demonstration,
    )
    pool.close()
    for i, ep in enumerate(episodes):
        ep.group, ep.sample = i // 2, i % 2
        ep.rewards = {"total": [0.0] * (len(ep.turns) - 1) + [float(i % 2)]}
    return episodes


def load_policy(cfg, checkpointing: bool):
    import dataclasses

    from omrl.training.model_setup import load_trainable_model

    model, tokenizer = load_trainable_model(dataclasses.replace(cfg.model, gradient_checkpointing=checkpointing), "cpu")
    model.train()
    return model, tokenizer


class RecipeUpdate:
    """The recipe's UPDATE section for one on-policy pass (no optimizer step)."""

    def __init__(self, cfg, model, pad_token_id: int):
        from omrl import registry

        self.cfg, self.model, self.pad = cfg, model, pad_token_id
        algo = cfg.algorithm
        self.advantage_fn = registry.algorithms.get(algo.advantage, kind="advantage")
        self.policy_loss_fn = registry.algorithms.get(algo.policy_loss, kind="policy_loss")
        self.kl_fn = registry.algorithms.get(algo.kl_estimator, kind="kl")
        self.temperature = cfg.generation.temperature if cfg.generation.temperature > 0 else 1.0

    def batch(self, episodes):
        """The rollout's length-sorted batch with its advantages, as the recipe builds it."""
        from omrl.training.rl_data import advantage_input, episodes_to_batch, sort_by_length, trainable

        cfg = self.cfg
        batch = sort_by_length(
            episodes_to_batch(trainable(episodes), self.pad, cfg.reward.allocation, cfg.reward.gamma)
        )
        batch.tensors["advantages"], batch.tensors["returns"] = self.advantage_fn(advantage_input(batch), cfg.algorithm)
        return batch

    def micro_batches(self, episodes, size: int):
        from omrl.training.rl_data import micro_batches

        batch = self.batch(episodes)
        return micro_batches(batch, size), float(batch["loss_mask"].sum())

    def run(self, episodes, size: int, limit: int = 0, share_prefix: bool = False) -> dict[str, float]:
        """One pass (``limit`` > 0: only the first ``limit`` micro-batches); real and run positions.
        ``share_prefix``: rows that open alike run their shared prompt once (``optim.share_prefix``)."""
        from omrl.training.losses import policy_gradient_loss
        from omrl.training.policy import policy_forward
        from omrl.training.shared_prefix import with_shared_prefixes

        self.model.zero_grad(set_to_none=True)
        parts, tokens = self.micro_batches(episodes, size)
        if share_prefix:
            parts = with_shared_prefixes(self.model, self.batch(episodes), size)
        else:
            parts = ((mb, None) for mb in parts)
        real = positions = 0
        for i, (mb, prefix) in enumerate(parts):
            if limit and i >= limit:
                break
            out = policy_forward(
                self.model,
                mb["input_ids"],
                mb["attention_mask"],
                self.temperature,
                with_entropy=True,
                token_mask=mb["loss_mask"],
                prefix=prefix,
            )
            mb.tensors["old_log_probs"] = out["log_probs"].detach()
            loss, _ = policy_gradient_loss(out, mb, self.cfg.algorithm, self.policy_loss_fn, self.kl_fn)
            (loss * (float(mb["loss_mask"].sum()) / tokens)).backward()
            start = prefix.length if prefix is not None else 0  # the prefix ran once for the group
            real += int(mb["attention_mask"].sum()) - start
            positions += mb["input_ids"].numel() - start * len(mb)
        return {"real_tokens": real, "positions": positions}


def bare_pass(model, episodes, limit: int = 0) -> dict[str, float]:
    """One row at a time, no padding: forward with logits only where a model token is predicted, backward."""
    model.zero_grad(set_to_none=True)
    real = 0
    rows = sorted(episodes, key=lambda ep: len(ep.token_ids), reverse=True)
    for ep in rows[:limit] if limit else rows:
        ids = torch.tensor(ep.token_ids)[None]
        mask = torch.tensor(ep.loss_mask)
        keep = torch.nonzero(mask[1:]).squeeze(-1)  # logits at t predict token t + 1
        logits = model(input_ids=ids, use_cache=False, logits_to_keep=keep).logits[0].float()
        log_probs = torch.log_softmax(logits, -1).gather(-1, ids[0, keep + 1][:, None])
        (-log_probs.mean()).backward()
        real += ids.shape[1]
    return {"real_tokens": real, "positions": real}


def timed(fn) -> tuple[float, dict]:
    gc.collect()
    start = time.perf_counter()
    got = fn()
    return time.perf_counter() - start, got


def memory_worker(spec_path: str) -> None:
    """Run one memory configuration in this (fresh) process; print its report as JSON."""
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(spec["threads"])
    cfg = job_config(spec["model"], spec["overrides"])
    episodes = pickle.loads(Path(spec["episodes"]).read_bytes())
    model, tokenizer = load_policy(cfg, spec["checkpointing"])
    limit = 0 if spec["full_pass"] else 1
    recipe = RecipeUpdate(cfg, model, tokenizer.pad_token_id)
    if spec["side"] == "bare":
        run = lambda: bare_pass(model, episodes, limit)  # noqa: E731
    else:
        run = lambda: recipe.run(episodes, spec["micro_batch_size"], limit)  # noqa: E731
    gc.collect()
    (seconds, got), before, peak = peak_while(lambda: timed(run))
    print(json.dumps({"rss_before": before, "peak_rss": peak, "seconds": seconds, **got}))


def measure_memory(args, episodes) -> list[dict]:
    configs = [("bare", 1, False), ("recipe", 1, False), ("recipe", 2, False), ("recipe", 1, True), ("recipe", 2, True)]
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        episodes_path = Path(tmp, "episodes.pkl")
        episodes_path.write_bytes(pickle.dumps(episodes))
        for side, size, checkpointing in configs:
            if side == "recipe" and size not in args.micro_batch_sizes:
                continue
            spec = worker_spec(
                args,
                episodes=str(episodes_path),
                side=side,
                micro_batch_size=size,
                checkpointing=checkpointing,
                full_pass=args.memory_full_pass,
            )
            report = run_worker(__file__, spec, Path(tmp, "spec.json"))
            out.append(
                {
                    "side": side,
                    "micro_batch_size": size,
                    "gradient_checkpointing": checkpointing,
                    **report,
                    "added": report["peak_rss"] - report["rss_before"],
                }
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--episodes", type=int, default=4, help="expert episodes of the job (one task each)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="passes over the rows; each pass times every side on each unit (pair) of rows in turn",
    )
    parser.add_argument("--micro-batch-sizes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-memory", dest="memory", action="store_false", help="skip the peak-RSS runs")
    parser.add_argument(
        "--memory-full-pass",
        action="store_true",
        help="memory runs play the whole pass, not just the longest micro-batch",
    )
    parser.add_argument("--json", type=Path, default=default_json("update_throughput"), help="where the results go")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the grpo preset")
    args = parse_args(parser, memory_worker)
    if args is None:
        return

    torch.set_num_threads(args.threads)
    cfg = job_config(args.model, args.overrides)
    episodes = expert_episodes(cfg, args.episodes)
    model, tokenizer = load_policy(cfg, checkpointing=False)
    recipe = RecipeUpdate(cfg, model, tokenizer.pad_token_id)
    # units of rows as the recipe pairs them (longest first); every side runs each unit back to back,
    # in an order that rotates, so load on the machine hits the sides alike
    ordered = sorted(episodes, key=lambda ep: len(ep.token_ids), reverse=True)
    width = max(args.micro_batch_sizes)
    units = [ordered[i : i + width] for i in range(0, len(ordered), width)]
    sides = [("bare", lambda unit: bare_pass(model, unit))]
    sides += [(f"recipe mb={size}", lambda unit, size=size: recipe.run(unit, size)) for size in args.micro_batch_sizes]
    sides += [("recipe shared", lambda unit: recipe.run(unit, 1, share_prefix=True))]
    if width > 1:  # a prefix's rows packed, width at a time
        sides += [(f"recipe shared mb={width}", lambda unit: recipe.run(unit, width, share_prefix=True))]
    recipe.run(ordered[-1:], 1), bare_pass(model, ordered[-1:])  # warm-up on one row each

    times: dict[str, list[float]] = {name: [] for name, _ in sides}  # per (round, unit)
    turn = 0
    for _ in range(args.rounds):
        for unit in units:
            for name, fn in sides[turn % len(sides) :] + sides[: turn % len(sides)]:
                times[name].append(timed(lambda fn=fn, unit=unit: fn(unit))[0])
            turn += 1
    real = sum(len(ep.token_ids) for ep in episodes)
    rows = []
    for name, _ in sides:
        ratios = [b / s for b, s in zip(times["bare"], times[name])]  # same real tokens: time ratio = tokens/s ratio
        if name == "bare":
            padding = 0.0
        elif name.startswith("recipe shared"):
            padding = 0.0  # a group's rows run alone or packed, no padding (every row here is in a group)
        else:  # the whole rollout's micro-batches, as the recipe cuts them
            parts, _ = recipe.micro_batches(episodes, int(name.split("=")[1]))
            padding = 1 - sum(int(mb["attention_mask"].sum()) for mb in parts) / sum(
                mb["input_ids"].numel() for mb in parts
            )
        per_round = sum(times[name]) / args.rounds
        row = {
            "side": name,
            "seconds": times[name],
            "seconds_per_pass": per_round,
            "tokens_per_s": real / per_round,
            "ratio_min": min(ratios),
            "ratio_median": statistics.median(ratios),
            "ratios": ratios,
            "padding_share": padding,
        }
        if name != "bare":
            row["met"] = row["ratio_median"] >= TOKENS_TARGET and padding < PADDING_TARGET
        rows.append(row)
    memory = measure_memory(args, episodes) if args.memory else []

    lengths = [len(ep.token_ids) for ep in episodes]
    sampled = sum(sum(ep.loss_mask) for ep in episodes)
    print(
        f"update forward+backward, {args.model}, {len(episodes)} webshop expert episodes "
        f"({sum(lengths)} tokens, rows {min(lengths)}-{max(lengths)}, {sampled} sampled), "
        f"{args.rounds} round(s) x {len(units)} units of {width} rows, {args.threads} thread(s)"
    )
    print(
        f"{'side':14s} {'s / pass':>9s} {'tokens/s':>9s} {'ratio min':>10s} {'ratio med':>10s} {'padding':>8s}  "
        f"target: ratio >= {TOKENS_TARGET}, padding < {PADDING_TARGET:.0%}"
    )
    for row in rows:
        verdict = "" if "met" not in row else ("met" if row["met"] else "MISSED")
        print(
            f"{row['side']:14s} {row['seconds_per_pass']:9.2f} {row['tokens_per_s']:9.1f} "
            f"{row['ratio_min']:10.3f} {row['ratio_median']:10.3f} {row['padding_share']:8.1%}  {verdict}"
        )
    if memory:
        what = "whole pass" if args.memory_full_pass else "longest micro-batch"
        print(f"\npeak RSS, one fresh process each ({what}):")
        print(f"{'side':8s} {'mb':>3s} {'grad ckpt':>9s} {'peak GiB':>9s} {'added GiB':>10s} {'seconds':>8s}")
        for m in memory:
            print(
                f"{m['side']:8s} {m['micro_batch_size']:3d} {str(m['gradient_checkpointing']):>9s} "
                f"{m['peak_rss'] / GIB:9.2f} {m['added'] / GIB:10.2f} {m['seconds']:8.2f}"
            )
    save_json(
        args.json,
        {
            "benchmark": "update_throughput",
            "target": f"tokens/s ratio >= {TOKENS_TARGET}, padding share < {PADDING_TARGET}",
            "args": {**vars(args), "json": str(args.json)},
            "sequence_lengths": lengths,
            "sampled_tokens": sampled,
            "machine": machine(args.threads),
            "results": rows,
            "memory": memory,
        },
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
