"""In-rollout generation with KV reuse vs bare ``model.generate``, and a rollout step reuse on vs off, in one run.

    python benchmarks/generation_reuse.py [--threads 1] [--json out.json] [key=value ...]

Plays the first rollout step of the default job (the ``grpo`` preset: SmolLM2-135M,
WebShop, its tasks per step, group size, token limits and temperature; ``key=value``
overrides as on the command line) three times, with the same seed:

1. the rollout with the ``hf`` backend reusing KV states; every generate call's
   prompts and limits are recorded, with its seconds;
2. those very calls, turn by turn, through a bare ``model.generate`` (left-padded
   chunks of ``generation.batch_size``, same seeds): what generation costs without
   reuse. Both sample the same ids, so both do the same decoding work;
3. the rollout with reuse off (the backend's plain ``model.generate`` path).

Prints a table and writes JSON (``benchmarks/results/generation_reuse.json`` unless ``--json``):
generation seconds and prefill tokens of 1 vs 2 (target >= 2x), rollout seconds of 1 vs 3 (target
<= 0.5x), and each rollout's own peak RSS (the kernel's high-water mark, lowered to the current RSS
before it: what is resident during that rollout, the model and anything kept from before included)
and how far it rose above the RSS at its start.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from _memory import GIB, peak_while
from _results import default_json, machine, save_json

from omrl.backends.base import Backend, SamplingParams
from omrl.backends.hf import HFBackend
from omrl.config import load_config
from omrl.config.options import TrainRunConfig
from omrl.models import load_model
from omrl.rollout import PlaySpec, RolloutSession
from omrl.training.rl_data import TaskOrder


class Recorder(Backend):
    """Passes every call on to ``inner`` and keeps its prompts, params and seconds."""

    name = "recorder"

    def __init__(self, inner: HFBackend):
        super().__init__(inner.tokenizer, inner.batch_size)
        self.inner = inner
        self.calls: list[tuple[list[list[int]], SamplingParams, float]] = []

    def generate(self, prompts, params, messages=None):
        started = time.perf_counter()
        out = self.inner.generate(prompts, params, messages)
        self.calls.append(([list(p) for p in prompts], params, time.perf_counter() - started))
        return out

    def release(self, conversations=None):
        self.inner.release(conversations)


def bare_generate(
    model: Any, tokenizer: Any, prompts: Sequence[list[int]], params: SamplingParams, batch_size: int
) -> tuple[int, int]:
    """``model.generate`` on ``prompts`` as the backend chunks them (sorted by length, same seeds).

    Returns (prompt tokens prefilled, new tokens kept up to each prompt's limit).
    """
    from transformers import GenerationConfig

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    limits = params.limits(len(prompts))
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    prefilled = kept = 0
    for chunk_no, start in enumerate(range(0, len(order), batch_size)):
        chunk = order[start : start + batch_size]
        width = max(len(prompts[i]) for i in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(chunk):
            ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]) :] = 1
        sampling = (
            {"do_sample": False}
            if params.greedy
            else {"do_sample": True, "top_k": 0, "temperature": params.temperature, "top_p": params.top_p}
        )
        config = GenerationConfig(
            max_new_tokens=max(limits[i] for i in chunk),
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=pad,
            **sampling,
        )
        with torch.random.fork_rng(), torch.no_grad():
            torch.manual_seed(params.seed + chunk_no)
            out = model.generate(
                input_ids=ids.to(model.device), attention_mask=mask.to(model.device), generation_config=config
            )
        for row, i in enumerate(chunk):
            new = out[row, width:].tolist()
            end = new.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in new else len(new)
            kept += min(end, limits[i])
        prefilled += sum(len(prompts[i]) for i in chunk)
    return prefilled, kept


def play(session: RolloutSession, backend: Backend, tasks: list[Any], cfg: TrainRunConfig, seed: int):
    """One rollout step with ``backend``: (episodes, seconds)."""
    session.backend = backend
    started = time.perf_counter()
    episodes = session.play(tasks, PlaySpec(split=cfg.env.split, group_size=cfg.group_size, seed=seed)).episodes
    return episodes, time.perf_counter() - started


def measured(run):
    """``run()``'s result, with the peak RSS while it ran and how far that rose above the RSS at its start (GiB)."""
    result, start, peak = peak_while(run)
    return result, {"peak_rss_gib": peak / GIB, "rose_gib": (peak - start) / GIB}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="grpo")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    parser.add_argument("--json", type=Path, default=default_json("generation_reuse"), help="where the results go")
    parser.add_argument("overrides", nargs="*", help="key=value, as for omrl train")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    cfg = load_config(TrainRunConfig, args.preset, args.overrides)
    device = "cuda" if torch.cuda.is_available() else None  # where `omrl train` would generate
    model, tokenizer = load_model(cfg.model.name, dtype=cfg.model.dtype, device=device)
    model.eval()
    gen = cfg.generation
    # warm-up: first calls pay for lazy set-up (kernels, allocator)
    warm = HFBackend(model, tokenizer, batch_size=gen.batch_size)
    warm.generate([[tokenizer.eos_token_id] * 8], SamplingParams(max_new_tokens=4, seed=0))
    session = RolloutSession.from_config(cfg, model=model, tokenizer=tokenizer, backend=warm)
    splits = session.env_of().pool.probe()
    tasks = TaskOrder(list(splits.split_of(cfg.env.split)), cfg.seed).take(cfg.tasks_per_step)
    seed = cfg.seed * 1_000_003  # the first step's rollout seed with one process

    reuse = HFBackend(model, tokenizer, batch_size=gen.batch_size)
    recorder = Recorder(reuse)
    (on, on_seconds), memory_on = measured(lambda: play(session, recorder, tasks, cfg, seed))
    on_stats = reuse.take_stats()

    started = time.perf_counter()
    bare_prefill = bare_kept = 0
    for prompts, params, _ in recorder.calls:
        p, k = bare_generate(model, tokenizer, prompts, params, gen.batch_size)
        bare_prefill, bare_kept = bare_prefill + p, bare_kept + k
    bare_seconds = time.perf_counter() - started

    plain = HFBackend(model, tokenizer, batch_size=gen.batch_size, kv_reuse=False)
    (off, off_seconds), memory_off = measured(lambda: play(session, plain, tasks, cfg, seed))
    off_stats = plain.take_stats()

    same = all(a.token_ids == b.token_ids for a, b in zip(on, off))
    generation_on = sum(seconds for *_, seconds in recorder.calls)
    result = {
        "model": cfg.model.name,
        "env": cfg.env.name,
        "preset": args.preset,
        "threads": args.threads,
        "tasks": len(tasks),
        "group_size": cfg.group_size,
        "generate_calls": len(recorder.calls),
        "max_new_tokens": gen.max_new_tokens,
        "max_context": gen.max_context,
        "temperature": gen.temperature,
        "sampled_tokens": on_stats["decode_tokens"],
        "bare_sampled_tokens": bare_kept,
        "generation_seconds_reuse": generation_on,
        "generation_seconds_bare": bare_seconds,
        "generation_speedup": bare_seconds / generation_on,
        "prefill_computed_reuse": on_stats["prefill_computed"],
        "prefill_reused": on_stats["prefill_reused"],
        "prefill_computed_bare": bare_prefill,
        "hit_rate": on_stats["prefill_reused"] / max(1, on_stats["prefill_reused"] + on_stats["prefill_computed"]),
        "rollout_seconds_reuse_on": on_seconds,
        "rollout_seconds_reuse_off": off_seconds,
        "rollout_ratio_on_off": on_seconds / off_seconds,
        "same_episodes_on_off": same,
        "prefill_computed_reuse_off": off_stats["prefill_computed"],
        "memory_reuse_on": memory_on,
        "memory_reuse_off": memory_off,
        "machine": machine(args.threads),
    }
    print(
        f"{cfg.model.name} on {cfg.env.name} ({args.preset} preset): {len(tasks)} tasks x {cfg.group_size} "
        f"samples, {len(recorder.calls)} generate calls, {on_stats['decode_tokens']:.0f} sampled tokens, "
        f"{args.threads} threads"
    )
    print(f"  {'':34s} {'seconds':>8s} {'prefilled':>10s} {'reused':>8s} {'peak GiB':>9s} {'rose GiB':>9s}")
    print(
        f"  {'generation, reuse (in rollout)':34s} {generation_on:8.1f} {on_stats['prefill_computed']:10.0f} "
        f"{on_stats['prefill_reused']:8.0f}"
    )
    print(f"  {'generation, bare model.generate':34s} {bare_seconds:8.1f} {bare_prefill:10d} {0:8d}")
    for name, seconds, stats, memory in (
        ("rollout step, reuse on", on_seconds, on_stats, memory_on),
        ("rollout step, reuse off", off_seconds, off_stats, memory_off),
    ):
        print(
            f"  {name:34s} {seconds:8.1f} {stats['prefill_computed']:10.0f} {stats['prefill_reused']:8.0f} "
            f"{memory['peak_rss_gib']:9.2f} {memory['rose_gib']:9.2f}"
        )
    print(
        f"  generation speed-up from reuse: {result['generation_speedup']:.2f}x (target >= 2); "
        f"rollout on/off: {result['rollout_ratio_on_off']:.2f} (target <= 0.5); hit rate {result['hit_rate']:.0%}; "
        f"same episodes on/off: {same}; sampled tokens reuse/bare: {on_stats['decode_tokens']:.0f}/{bare_kept}"
    )
    save_json(args.json, result)
    print(f"  wrote {args.json}")


if __name__ == "__main__":
    main()
