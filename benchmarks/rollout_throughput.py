"""Rollout throughput: the batched rollout vs one episode at a time, in one run.

    python benchmarks/rollout_throughput.py [--model tiny] [--env gridworld] [--episodes 16] [--json out.json]

Both play the same tasks with the same model, template, limits and rollout seed (``--seed``); the
batched rollout generates every live episode's turn in one backend call, the baseline plays each
episode alone (batch size 1, the per-sample loop the reference design ran in a thread pool). A
turn's rows share one sampling stream, so a reply still depends on the batch it was drawn in and
the two sides' token counts differ a little: the comparison is of tokens per second.

Each side gets a backend of its own, built just before it plays, so neither finds the other's
prompts in its KV store (a warm-up call on a third, thrown-away backend pays for first-call
set-up). Prints generated tokens per second of each and the ratio, and writes the record, machine
included, to ``--json`` (default ``benchmarks/results/rollout_throughput.json``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from _results import default_json, machine, save_json

from omrl import registry
from omrl.backends.base import generation_metrics
from omrl.backends.hf import HFBackend
from omrl.models import load_model
from omrl.rollout import EnvPool, RolloutLimits, collect


def timed(play, backend: HFBackend) -> dict:
    """``play(backend)``'s generated tokens, turns, seconds and the backend's prefill counts."""
    start = time.perf_counter()
    episodes = play(backend)
    seconds = time.perf_counter() - start
    tokens = sum(sum(ep.loss_mask) for ep in episodes)
    stats = generation_metrics(backend.take_stats())
    return {
        "episodes": len(episodes),
        "tokens": tokens,
        "turns": sum(ep.num_turns for ep in episodes),
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "prefill_tokens": stats["prefill_tokens"],
        "prefill_reused": stats["prefill_reused"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--env", default="gridworld")
    parser.add_argument("--template", default="react")
    parser.add_argument("--episodes", type=int, default=16, help="tasks played (one sample each)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="the rollout seed, the same on both sides")
    parser.add_argument("--json", type=Path, default=default_json("rollout_throughput"), help="where the record goes")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model)
    env_class = registry.envs.get(args.env)
    template = registry.templates.get(args.template)()
    limits = RolloutLimits(max_new_tokens=args.max_new_tokens, max_context=2048, max_turns=args.max_turns)
    pool = EnvPool(env_class, name=args.env)
    tasks = list(pool.probe().split_of("train"))[: args.episodes]

    def fresh_backend() -> HFBackend:
        return HFBackend(model, tokenizer, batch_size=len(tasks))

    def batched(backend: HFBackend) -> list:
        return collect(pool, template, tokenizer, tasks, backend=backend, limits=limits, seed=args.seed)

    def one_at_a_time(backend: HFBackend) -> list:
        return [
            ep
            for task in tasks
            for ep in collect(pool, template, tokenizer, [task], backend=backend, limits=limits, seed=args.seed)
        ]

    # one warm-up call so neither side pays for first-call set-up; its backend (and KV store) is thrown away
    warm_up = RolloutLimits(max_new_tokens=4, max_turns=1)
    collect(pool, template, tokenizer, tasks[:1], backend=fresh_backend(), limits=warm_up, seed=args.seed)

    sides = {"batched": timed(batched, fresh_backend()), "one at a time": timed(one_at_a_time, fresh_backend())}
    speedup = sides["batched"]["tokens_per_s"] / sides["one at a time"]["tokens_per_s"]
    print(
        f"{args.model} on {args.env}: {len(tasks)} episodes, <= {args.max_turns} turns, "
        f"<= {args.max_new_tokens} new tokens per turn, seed {args.seed}, {args.threads} CPU threads"
    )
    for name, side in sides.items():
        print(
            f"  {name:14s} {side['tokens']:6d} tokens {side['turns']:4d} turns {side['seconds']:7.2f} s  "
            f"{side['tokens_per_s']:8.1f} tokens/s  prompt tokens {side['prefill_tokens']:.0f} computed, "
            f"{side['prefill_reused']:.0f} reused"
        )
    print(f"  speed-up (tokens/s, batched / one at a time): {speedup:.1f}x")
    print(f"  env instances built: {pool.created}")
    save_json(
        args.json,
        {
            "benchmark": "rollout_throughput",
            "args": {**vars(args), "json": str(args.json)},
            "machine": machine(args.threads),
            "sides": sides,
            "speedup": speedup,
            "env_instances": pool.created,
        },
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
