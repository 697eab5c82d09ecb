"""Peak memory of the RL update against group size and context, and what holds it.

    python benchmarks/memory_sweep.py [--groups 2 4 8 16] [--contexts 1024 2048 4096] [--quick]
                                      [--steps 1] [--threads 1] [--json out.json]

One GRPO group per cell, shaped as the update sees it: G rows of C tokens sharing their
first prompt (C/2 tokens), each continuing with C/2 tokens of its own. The shared prompt is
real text: the default job's WebShop first prompt (react system prompt, worked example, the
task's first observation) as the chat template lays it out, the system prompt and worked
example repeated or cut to length. Each row's own half alternates a reply of
``generation.max_new_tokens`` (48) trained tokens (random token ids, different per row, as
sampled replies are) with an observation of untrained tokens (real WebShop observation
tokens), sized so that ``--trained-share`` (0.2) of that half is trained. Advantages are
+1/-1 by row (GRPO's normalised outcome for half the group winning).

Each configuration runs in a fresh process (``_memory.py``): the grpo preset's model
(``smollm2-135m``, float32, CPU, gradient checkpointing on; its weights paged in, as a
rollout would have) and the recipe's optimizer (``build_optimizer``: fused AdamW), then per
step the recipe's UPDATE for one on-policy pass: ``with_shared_prefixes``
(``optim.share_prefix``) or ``micro_batches`` of ``optim.micro_batch_size`` (1) ->
``policy_forward`` -> ``policy_gradient_loss`` -> backward weighted by tokens, then the
one-process strategy's ``optimizer_step`` (clip, AdamW, gradients set to None). The
high-water mark (VmHWM) is reset before each phase and read after it, so every phase has its
own peak; the RSS after each row shows whether memory creeps with the group. Reported per
cell: the steady-state peak (a step after the first, whose pass runs with the AdamW state
held: measured with ``--steps 2``, else estimated as the first pass's peak plus the AdamW
state, within 0.25 GiB of the measured one, mostly below), the first step's peak, what the
first pass added to the RSS, and its seconds. ``--no-checkpointing-cell`` also runs one cell
with checkpointing off. Unshared cells whose estimated time (from the shared cell's) exceeds
``--unshared-budget`` seconds are skipped with a note. ``--mmap-threshold`` and ``--trim``
try the allocator fixes below; ``--show`` prints the table of a saved run.

Memory is robust to load on a shared machine; the seconds are not (a 2-core machine shared
with other jobs: take them as rough, and compare only runs made side by side).

What holds the memory (``benchmarks/results/memory_sweep.json``: the grid;
``memory_sweep_allocator.json``: two-step and allocator runs):

- Group size does not move it: rows run one at a time and each row's graph is freed by its
  backward; the RSS after each row is flat, and the peaks of G = 2..16 lie within 0.2 GiB
  with no trend.
  Sharing the prefix saves time, not memory (same peaks within 0.15 GiB at micro-batch 1).
- Model state, 2.0 GiB: 134.5M parameters (embeddings tied to the LM head) are 0.50 GiB of
  weights, 0.50 GiB of gradients during each pass, 1.00 GiB of AdamW state from the first
  optimizer step on, over 0.29 GiB of Python + torch (0.92 GiB with the model loaded). The
  first step's peak lacks the AdamW state during its pass; every later one holds all of it.
- Live activations grow with the context: with checkpointing the 30 layers' inputs
  (69 KB a token), a shared prefix's inputs and keys/values for the whole group, one layer
  recomputed in backward, the tied [49152, 576] weight's gradient pieces (113 MB each) and
  the LM head's [256, 49152] float32 chunks (48 MiB each). Measured with big blocks mapped
  (RSS ~ live memory): the pass adds 1.55 GiB at 4096 tokens, of which 0.50 is gradients.
  Checkpointing off (G=2, C=1024): the pass adds 2.84 GiB instead of 1.41.
- glibc's heap holds the rest, and it is the part that grows fastest with context: glibc
  raises its mmap threshold (up to 32 MiB) each time a mapped block is freed, so a long row's
  activations (5-25 MB each) then come from the heap, whose freed middle stays resident.
  Steady-state peak at C=4096, G=2, measured: 5.05 GiB as is, 3.72 GiB with allocations of
  4 MiB or more mapped (``--mmap-threshold 4194304``, the same as ``MALLOC_MMAP_THRESHOLD_``),
  for a pass 8-12% slower (side by side); at C=2048 3.85 -> 3.67 GiB, 1-5% slower.
  ``malloc_trim`` between phases lowers the RSS between them but not the peak.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import tempfile
import time
from pathlib import Path

import torch
from _memory import GIB, memory_status, parse_args, reset_peak, run_worker, worker_spec
from _results import default_json, save_json
from _results import machine as describe_machine
from update_throughput import job_config, load_policy

QUICK = {"groups": [2, 4], "contexts": [1024]}
ROWS_FILE = "rows.pt"
WIDTH = 28  # of a side's columns in the table


# -- the synthetic group (built once, in the parent) ---------------------------------------------
def webshop_episode(cfg):
    """One expert WebShop episode of the default job: real chat-template tokens."""
    from update_throughput import expert_episodes

    return expert_episodes(cfg, 1)[0]


def group_rows(
    episode, tokenizer, group: int, context: int, reply_tokens: int, trained_share: float, seed: int = 0
) -> dict[str, torch.Tensor]:
    """``group`` rows of ``context`` tokens: a shared first prompt of context // 2, then per row
    replies (trained) and observations (not), ``trained_share`` of the rest trained."""
    ids, mask = episode.token_ids, episode.loss_mask
    first = mask.index(1)
    prompt = ids[:first]
    starts = [i for i, t in enumerate(prompt) if t == tokenizer.convert_tokens_to_ids("<|im_start|>")]
    tail = prompt[starts[-2] :]  # the task's first observation and the assistant header
    head = prompt[: starts[-2]]  # system prompt and worked example, repeated or cut to length
    body = context // 2 - len(tail)
    if body <= 0:
        raise SystemExit(f"--contexts {context} is too short: the first observation alone has {len(tail)} tokens")
    prompt = (head * (body // len(head) + 1))[:body] + tail
    opener = tokenizer.encode("\n<|im_start|>user\n", add_special_tokens=False)
    closer = tokenizer.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    observation_pool = []  # the env's pages in this episode, without their chat markers
    for turn, nxt in zip(episode.turns, [*episode.turns[1:], None]):
        run = ids[turn.span[1] : nxt.span[0] if nxt else len(ids)]
        observation_pool += run[len(opener) : len(run) - len(closer)]
    observation_tokens = round(reply_tokens * (1 - trained_share) / trained_share)
    page_tokens = observation_tokens - len(opener) - len(closer)
    rng = torch.Generator().manual_seed(seed)
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)  # a reply ends with it, trained
    rows, masks = [], []
    own = context - len(prompt)
    for g in range(group):
        row, row_mask, k = [], [], 0
        while len(row) < own:
            reply = torch.randint(0, len(tokenizer), (reply_tokens - 1,), generator=rng).tolist() + [eos]
            at = (g * 7 + k) * page_tokens % len(observation_pool)
            observation = opener + (observation_pool * 2)[at : at + page_tokens] + closer
            row += reply + observation
            row_mask += [1] * len(reply) + [0] * len(observation)
            k += 1
        rows.append(prompt + row[:own])
        masks.append([0] * len(prompt) + row_mask[:own])
    loss_mask = torch.tensor(masks)
    signs = torch.tensor([1.0 if g % 2 else -1.0 for g in range(group)])[:, None]
    return {
        "input_ids": torch.tensor(rows),
        "attention_mask": torch.ones_like(loss_mask),
        "loss_mask": loss_mask,
        "advantages": signs * loss_mask,
    }


# -- one configuration, in a fresh process ------------------------------------------------------
def update_pass(cfg, model, batch, share_prefix: bool, trace: list) -> None:
    """The recipe's UPDATE for one on-policy pass (no optimizer step); ``trace`` gets the RSS after
    each micro-batch's backward."""
    from omrl import registry
    from omrl.training.losses import policy_gradient_loss
    from omrl.training.policy import policy_forward
    from omrl.training.rl_data import micro_batches
    from omrl.training.shared_prefix import with_shared_prefixes

    algo, size = cfg.algorithm, cfg.optim.micro_batch_size
    policy_loss_fn = registry.algorithms.get(algo.policy_loss, kind="policy_loss")
    kl_fn = registry.algorithms.get(algo.kl_estimator, kind="kl")
    temperature = cfg.generation.temperature if cfg.generation.temperature > 0 else 1.0
    tokens = float(batch["loss_mask"].sum())
    parts = (
        with_shared_prefixes(model, batch, size) if share_prefix else ((mb, None) for mb in micro_batches(batch, size))
    )
    for mb, prefix in parts:
        out = policy_forward(
            model,
            mb["input_ids"],
            mb["attention_mask"],
            temperature,
            with_entropy=True,
            token_mask=mb["loss_mask"],
            prefix=prefix,
        )
        mb.tensors["old_log_probs"] = out["log_probs"].detach()
        loss, _ = policy_gradient_loss(out, mb, algo, policy_loss_fn, kl_fn)
        (loss * (float(mb["loss_mask"].sum()) / tokens)).backward()
        trace.append(memory_status()["VmRSS"])


def release_free_memory() -> None:
    """glibc's ``malloc_trim(0)``: give the OS back the pages of freed chunks malloc keeps (tried
    as a fix between phases: it lowers the RSS between them, not the peak)."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def set_mmap_threshold(size: int) -> None:
    """glibc's ``mallopt(M_MMAP_THRESHOLD, size)``: allocations of ``size`` bytes or more get their
    own mapping, unmapped when freed (setting it also stops glibc raising it, up to 32 MiB, each
    time such a block is freed: then most activations come from the heap, whose free middle
    stays resident). The same as the environment variable ``MALLOC_MMAP_THRESHOLD_``."""
    if not ctypes.CDLL("libc.so.6").mallopt(-3, size):  # M_MMAP_THRESHOLD
        raise SystemExit(f"mallopt(M_MMAP_THRESHOLD, {size}) failed (at most 32 MiB on 64-bit glibc)")


def phase(name: str, fn, trim: bool = False) -> dict:
    """Run ``fn`` with the high-water mark lowered first: its RSS before, peak, RSS after, seconds.
    ``trim``: release the allocator's free pages first."""
    gc.collect()
    if trim:
        release_free_memory()
    before = memory_status()["VmRSS"]
    reset_peak()
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    after = memory_status()
    return {
        "phase": name,
        "rss_before": before,
        "peak": after["VmHWM"],
        "rss_after": after["VmRSS"],
        "anon_after": after["RssAnon"],
        "file_after": after["RssFile"],
        "seconds": seconds,
    }


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def memory_worker(spec_path: str) -> None:
    """One configuration in this (fresh) process; prints its report as JSON."""
    from omrl.data import Batch
    from omrl.parallel.base import Strategy
    from omrl.training.optim import build_optimizer

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(spec["threads"])
    trim = spec["trim"]
    if spec["mmap_threshold"]:
        set_mmap_threshold(spec["mmap_threshold"])
    started = memory_status()
    cfg = job_config(spec["model"], spec["overrides"])
    model, _ = load_policy(cfg, spec["checkpointing"])
    strategy = Strategy()
    optimizer = build_optimizer(model, cfg.optim, fused=strategy.fused_optimizer)
    params = [p for p in model.parameters() if p.requires_grad]
    loaded = memory_status()
    # the weights may be mapped from their file and paged in on first use; a run's rollout reads
    # them all before its first update, so they are resident before the pass here too
    with torch.no_grad():
        sum(float(p.sum()) for p in model.parameters())
    batch = Batch(dict(torch.load(spec["rows"])))
    gc.collect()
    resident = memory_status()
    phases, traces, state = [], [], {"weights": tensor_bytes(model.parameters())}
    for step in range(spec["steps"]):
        strategy.zero_grad(optimizer)
        trace: list[int] = []
        phases.append(
            phase(
                f"pass {step + 1}",
                lambda trace=trace: update_pass(cfg, model, batch, spec["share_prefix"], trace),
                trim,
            )
        )
        traces.append(trace)
        state["gradients"] = tensor_bytes(p.grad for p in params if p.grad is not None)
        phases.append(
            phase(
                f"optimizer step {step + 1}",
                lambda: strategy.optimizer_step(params, optimizer, cfg.optim.max_grad_norm),
                trim,
            )
        )
    state["adamw"] = tensor_bytes(
        v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0
    )
    print(
        json.dumps(
            {
                "rss_start": started["VmRSS"],
                "rss_loaded": resident["VmRSS"],
                "peak_loading": loaded["VmHWM"],
                "rss_loaded_file": loaded["RssFile"],
                "rss_resident_file": resident["RssFile"],
                "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_") or k == "LD_PRELOAD"},
                "phases": phases,
                "rss_after_rows": traces,
                "state_bytes": state,
                "seconds": sum(p["seconds"] for p in phases),
            }
        )
    )


# -- the sweep -----------------------------------------------------------------------------------
def summarize(cell: dict) -> dict:
    """The first step's peak, the steady-state one (measured at step 2, else estimated), what the pass added."""
    phases = cell["phases"]
    first_pass, first_step = phases[0], phases[1]
    cell["peak_first_step"] = max(first_pass["peak"], first_step["peak"])
    cell["added_by_pass"] = first_pass["peak"] - first_pass["rss_before"]
    if len(phases) >= 4:
        cell["peak_steady"], cell["peak_steady_measured"] = max(p["peak"] for p in phases[2:]), True
    else:  # a later pass runs as the first did, with the AdamW state held besides
        cell["peak_steady"] = max(first_pass["peak"] + cell["state_bytes"]["adamw"], first_step["peak"])
        cell["peak_steady_measured"] = False
    cell["pass_seconds"] = first_pass["seconds"]
    return cell


def estimate_seconds(shared: dict, group: int, context: int) -> float:
    """An unshared cell's pass from its shared cell's: seconds scale with the tokens run."""
    shared_tokens = context // 2 * (group + 1)
    return shared["pass_seconds"] * group * context / shared_tokens


def sweep(args, cfg, episode, tokenizer, save) -> dict:
    results = {"cells": [], "skipped": []}
    configs = [(True, True), (False, True)]  # (share_prefix, checkpointing)
    with tempfile.TemporaryDirectory() as tmp:
        for context in args.contexts:
            for group in args.groups:
                rows_path = Path(tmp, ROWS_FILE)
                rows = group_rows(episode, tokenizer, group, context, cfg.generation.max_new_tokens, args.trained_share)
                torch.save(rows, rows_path)
                cell_configs = configs + (
                    [(True, False), (False, False)] if (group, context) == tuple(args.no_checkpointing_cell) else []
                )
                shared = None
                for share, checkpointing in cell_configs:
                    key = {
                        "group": group,
                        "context": context,
                        "share_prefix": share,
                        "gradient_checkpointing": checkpointing,
                        "trained_tokens": int(rows["loss_mask"].sum()),
                    }
                    if not share and shared is not None and args.unshared_budget:
                        estimate = estimate_seconds(shared, group, context)
                        if estimate > args.unshared_budget:
                            results["skipped"].append(
                                {
                                    **key,
                                    "estimated_pass_seconds": estimate,
                                    "why": f"estimated pass > {args.unshared_budget} s",
                                }
                            )
                            print(f"skip   G={group:2d} C={context}: unshared, estimated {estimate:.0f} s", flush=True)
                            save(results)
                            continue
                    spec = worker_spec(
                        args,
                        rows=str(rows_path),
                        share_prefix=share,
                        checkpointing=checkpointing,
                        steps=args.steps,
                        trim=args.trim,
                        mmap_threshold=args.mmap_threshold,
                    )
                    report = run_worker(__file__, spec, Path(tmp, "spec.json"), timeout=args.timeout)
                    if "timed_out" in report:
                        results["skipped"].append({**key, "why": f"ran past --timeout {args.timeout} s"})
                        continue
                    cell = summarize({**key, **report})
                    if share and checkpointing:
                        shared = cell
                    results["cells"].append(cell)
                    print(
                        f"done   G={group:2d} C={context} share={share!s:5s} ckpt={checkpointing!s:5s} "
                        f"peak {cell['peak_first_step'] / GIB:.2f} GiB, {cell['seconds']:.0f} s",
                        flush=True,
                    )
                    save(results)
    return results


def print_table(results: dict, args) -> None:
    cells = {(c["group"], c["context"], c["share_prefix"], c["gradient_checkpointing"]): c for c in results["cells"]}
    skipped = {(s["group"], s["context"], s["share_prefix"]): s for s in results["skipped"]}

    def part(group, context, share, checkpointing=True):
        cell = cells.get((group, context, share, checkpointing))
        if cell is None:
            s = skipped.get((group, context, share))
            why = (
                ""
                if s is None
                else (
                    f"skipped, est. {s['estimated_pass_seconds']:.0f} s"
                    if "estimated_pass_seconds" in s
                    else "skipped, timed out"
                )
            )
            return f"{why:^{WIDTH}s}"
        steady = f"{cell['peak_steady'] / GIB:.2f}{'' if cell['peak_steady_measured'] else '*'}"
        return (
            f"{steady:>6s} {cell['peak_first_step'] / GIB:5.2f} {cell['added_by_pass'] / GIB:6.2f} "
            f"{cell['pass_seconds']:6.0f}"
        ).ljust(WIDTH)

    loaded = results["cells"][0]["rss_loaded"] / GIB if results["cells"] else float("nan")
    print(
        f"\nRL update memory (GiB of RSS), {args.model} float32 CPU, model loaded = {loaded:.2f} GiB, "
        f"{args.threads} thread(s):\npeak = a step after the first (the pass with the AdamW state held: "
        f"* = estimated as 1st pass peak + AdamW state), 1st = the first step's peak (pass, then AdamW step), "
        f"added = the first pass's peak - the RSS before it, s = its seconds"
    )
    head = f"{'peak':>6s} {'1st':>5s} {'added':>6s} {'s':>6s}".ljust(WIDTH)
    print(f"{'G':>3s} {'C':>5s} | {'shared prefix (ckpt on)':^{WIDTH}s} | {'unshared (ckpt on)':^{WIDTH}s}")
    print(f"{'':9s} | {head} | {head}")
    for context in args.contexts:
        for group in args.groups:
            print(f"{group:3d} {context:5d} | {part(group, context, True)} | {part(group, context, False)}")
    group, context = args.no_checkpointing_cell
    if (group, context, True, False) in cells:
        print(
            f"{group:3d} {context:5d} | {part(group, context, True, False)} | {part(group, context, False, False)}"
            "  <- gradient checkpointing off"
        )
    if results["cells"]:
        cell = max(results["cells"], key=lambda c: len(c["phases"]))
        state = cell["state_bytes"]
        print(
            f"\nstate (GiB): weights {state['weights'] / GIB:.2f}, gradients {state['gradients'] / GIB:.2f}, "
            f"AdamW {state['adamw'] / GIB:.2f}; process before loading {cell['rss_start'] / GIB:.2f}, "
            f"loading peak {cell['peak_loading'] / GIB:.2f}"
        )
        print(f"phases of G={cell['group']} C={cell['context']} share={cell['share_prefix']}:")
        for p in cell["phases"]:
            print(
                f"  {p['phase']:18s} before {p['rss_before'] / GIB:5.2f}  peak {p['peak'] / GIB:5.2f}  "
                f"after {p['rss_after'] / GIB:5.2f}  {p['seconds']:6.1f} s"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--groups", type=int, nargs="+", default=[2, 4, 8, 16], help="rows sharing a first prompt")
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 2048, 4096], help="tokens per row")
    parser.add_argument("--quick", action="store_true", help=f"only {QUICK}")
    parser.add_argument(
        "--steps",
        type=int,
        default=1,
        help="update steps per configuration (2: the steady-state peak is measured, not estimated)",
    )
    parser.add_argument("--trained-share", type=float, default=0.2, help="share of each row's own tokens trained")
    parser.add_argument(
        "--unshared-budget",
        type=float,
        default=180.0,
        help="skip an unshared cell whose pass would take longer (s, estimated; 0: never skip)",
    )
    parser.add_argument(
        "--no-checkpointing-cell",
        type=int,
        nargs=2,
        default=[2, 1024],
        metavar=("G", "C"),
        help="the cell also run with gradient checkpointing off",
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before a configuration is given up")
    parser.add_argument(
        "--trim", action="store_true", help="release the allocator's free pages (malloc_trim) before each phase"
    )
    parser.add_argument(
        "--mmap-threshold",
        type=int,
        default=0,
        metavar="BYTES",
        help="allocations this large or larger get their own mapping (glibc mallopt; 0: glibc's default)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--json",
        type=Path,
        help="where the results go, rewritten after every configuration "
        "(default: benchmarks/results/memory_sweep.json; with --quick, only when given)",
    )
    parser.add_argument("--show", metavar="JSON", help="only print the table of a saved (maybe partial) run")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the grpo preset")
    args = parse_args(parser, memory_worker)
    if args is None:
        return
    if args.show:
        saved = json.loads(Path(args.show).read_text())
        print_table(saved, argparse.Namespace(**saved["args"]))
        return
    if args.quick:
        args.groups, args.contexts = QUICK["groups"], QUICK["contexts"]
    elif args.json is None:
        args.json = default_json("memory_sweep")
    if not 0 < args.trained_share < 1:
        raise SystemExit(f"--trained-share must be in (0, 1), got {args.trained_share}")
    if args.steps < 1:
        raise SystemExit(f"--steps must be >= 1, got {args.steps}")

    from omrl.models import load_tokenizer

    cfg = job_config(args.model, args.overrides)
    tokenizer = load_tokenizer(cfg.model.name)
    episode = webshop_episode(cfg)
    machine = describe_machine(args.threads)
    config = {
        "model": args.model,
        "dtype": cfg.model.dtype,
        "micro_batch_size": cfg.optim.micro_batch_size,
        "reply_tokens": cfg.generation.max_new_tokens,
        "trained_share": args.trained_share,
    }

    def save(results: dict) -> None:
        if args.json is None:
            return
        save_json(
            args.json,
            {
                "benchmark": "memory_sweep",
                "args": {k: str(v) if k == "json" else v for k, v in vars(args).items() if k != "memory_worker"},
                "config": config,
                "machine": machine,
                **results,
            },
        )

    results = sweep(args, cfg, episode, tokenizer, save)
    save(results)
    print_table(results, args)


if __name__ == "__main__":
    main()
