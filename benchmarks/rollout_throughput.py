"""Rollout throughput: the batched rollout vs one episode at a time, in one run.

    python benchmarks/rollout_throughput.py [--model tiny] [--env gridworld] [--episodes 16]

Both play the same tasks with the same model, template and limits; the batched
rollout generates every live episode's turn in one backend call, the baseline
plays each episode alone (batch size 1, the per-sample loop the reference design
ran in a thread pool). Prints generated tokens per second of each and the ratio.
"""

from __future__ import annotations

import argparse
import time

import torch

from omrl import registry
from omrl.backends.hf import HFBackend
from omrl.models import load_model
from omrl.rollout import EnvPool, RolloutLimits, collect


def timed(fn):
    start = time.perf_counter()
    episodes = fn()
    seconds = time.perf_counter() - start
    tokens = sum(sum(ep.loss_mask) for ep in episodes)
    return tokens, seconds, episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--env", default="gridworld")
    parser.add_argument("--template", default="react")
    parser.add_argument("--episodes", type=int, default=16, help="tasks played (one sample each)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model)
    env_class = registry.envs.get(args.env)
    template = registry.templates.get(args.template)()
    limits = RolloutLimits(max_new_tokens=args.max_new_tokens, max_context=2048, max_turns=args.max_turns)
    pool = EnvPool(env_class, name=args.env)
    tasks = list(pool.probe().split_of("train"))[: args.episodes]
    backend = HFBackend(model, tokenizer, batch_size=len(tasks))

    # one warm-up call so neither side pays for first-call set-up
    collect(pool, template, tokenizer, tasks[:1], backend=backend, limits=RolloutLimits(max_new_tokens=4, max_turns=1))

    batched = timed(lambda: collect(pool, template, tokenizer, tasks, backend=backend, limits=limits, seed=0))
    sequential = timed(
        lambda: [
            ep
            for i, task in enumerate(tasks)
            for ep in collect(pool, template, tokenizer, [task], backend=backend, limits=limits, seed=i)
        ]
    )
    rows = [("batched", *batched), ("one at a time", *sequential)]
    print(
        f"{args.model} on {args.env}: {len(tasks)} episodes, <= {args.max_turns} turns, "
        f"<= {args.max_new_tokens} new tokens per turn, {args.threads} CPU threads"
    )
    for name, tokens, seconds, episodes in rows:
        turns = sum(ep.num_turns for ep in episodes)
        print(f"  {name:14s} {tokens:6d} tokens {turns:4d} turns {seconds:7.2f} s  {tokens / seconds:8.1f} tokens/s")
    print(
        f"  speed-up (tokens/s, batched / one at a time): {(batched[0] / batched[1]) / (sequential[0] / sequential[1]):.1f}x"
    )
    print(f"  env instances built: {pool.created}")


if __name__ == "__main__":
    main()
