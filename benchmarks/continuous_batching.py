"""Continuous batching against turn-by-turn batching: rollout seconds at equal work, rounds alternating.

    python benchmarks/continuous_batching.py [--rounds 3] [--threads 1] [--json out.json]

Each workload is played with ``generation.batching=turns`` (every live episode's turn in one
generate call, which runs to its longest reply) and ``continuous`` (a turn joins the decode batch as
soon as its episode is ready, :mod:`omrl.backends.hf_stream`). The two sample from one seed but not
the same ids (a turn-by-turn call shares one random stream among its rows, a continuous row has its
own), and different ids make different episodes; so the comparison is made at equal work: one
sampled rollout (temperature 1) records every reply, then each round replays those replies in both
modes, the model running every prefill and decode step as it would to sample them (the ids are taken
from the record instead of drawn; :class:`Forced`). Both modes then play the very same episodes
(checked), and the seconds compare the batching alone. Workloads:

- ``default``: the default job's rollout step (the ``grpo`` preset: SmolLM2-135M-WebShop, WebShop,
  2 tasks x 2 samples, <= 8 turns of <= 48 tokens);
- ``mixed``: episodes of mixed lengths: WebShop and gridworld in one rollout (an env mixture), 16
  different tasks, one sample each, so their replies' lengths and turn counts differ; all of them fit
  in one batch (``generation.batch_size`` 32);
- ``queued``: the same mixture with more episodes than the batch holds (32 tasks, batch size 8), as a
  GRPO step of many groups has: turn by turn, each call's rows run in chunks of 8, each chunk to its
  longest reply; continuously, a row that ends frees its slot for the next waiting turn;
- ``varied``: replies of widely varied lengths: the same mixture of 16 tasks played by SmolLM2-135M-Instruct
  (``smollm2-135m``, not fine-tuned on WebShop; the envs' worked example shown) with up to 160 tokens a
  reply, as a run starting from an instruct model samples them: some answer in a few tokens, most
  ramble to the limit, so a turn-by-turn call nearly always waits for a 160-token reply.

``--replies DIR`` keeps each workload's recorded replies in ``DIR/<workload>.json``: a run finding that
file replays it instead of sampling. With ``--model PATH`` every workload plays that model instead of
its own; together they measure a machine that lacks the model's file (a lent GPU) with a random-init
model of the same shape and tokenizer, replaying the replies the real model sampled elsewhere: the
same episodes, the same prefill and decode work (``scripts/gpu_check.sh`` does this).

``--bf16``: both modes generate under bfloat16 autocast (``bf16=true``), which on a CPU with bfloat16
instructions makes the prompts' work a smaller share of the rollout.

Each workload also gets a floor: every forward is timed, a decode step's seconds are fitted as a cost per
call, per row and per attended column (:func:`step_cost`), and the floor is the least any batching that runs
each prompt as its own forward could take: the prompts, then the longest episode's chain of decode steps
carrying every row once with no padding. ``ceiling`` (turn-by-turn seconds over the floor) is the speed-up no
such batching passes on the machine measured.

Targets (issue 54): >= 1.3x on mixed lengths, no worse on ``default``. Writes
``benchmarks/results/continuous_batching.json`` unless ``--json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from _results import default_json, machine, save_json

from omrl.backends.base import SamplingParams
from omrl.backends.hf import HFBackend
from omrl.backends.hf_reuse import wait_for
from omrl.backends.hf_stream import HFStream
from omrl.config import load_config
from omrl.config.options import TrainRunConfig
from omrl.models import load_model
from omrl.rollout import PlaySpec, RolloutSession
from omrl.training.online import setup_rollout

WORKLOADS: dict[str, list[str]] = {
    "default": [],
    "mixed": ["env.name=webshop,gridworld", "tasks_per_step=16", "group_size=1"],
    "queued": ["env.name=webshop,gridworld", "tasks_per_step=32", "group_size=1", "generation.batch_size=8"],
    "varied": [
        "model.name=smollm2-135m",
        "env.name=webshop,gridworld",
        "env.demonstration=true",
        "tasks_per_step=16",
        "group_size=1",
        "generation.max_new_tokens=160",
    ],
}

# the forward calls a rollout made, decode steps of the slot batch or a prompt's prefill: calls, rows summed over
# calls, and rows x new tokens x attended columns (padding included) summed
CALL_COUNTS = [f"{kind}_{count}" for kind in ("decode", "prefill") for count in ("calls", "rows", "attended")]
# of the decode steps' attended columns, those holding the row's own tokens (not padding); and the calls' seconds
CALL_COUNTS += ["decode_real_attended", "decode_seconds", "prefill_forward_seconds"]

Replies = dict[str, list[list[int]]]  # a turn's prompt (its ids' digest) -> the ids sampled for it, each time


def key(prompt: Any) -> str:
    """A prompt's ids as a short digest: recorded replies travel as a small file."""
    return hashlib.sha1(",".join(str(int(t)) for t in prompt).encode()).hexdigest()


class Replay:
    """Hands out the recorded replies of each prompt in turn (a task's samples share their first prompt)."""

    def __init__(self, replies: Replies):
        self.replies, self.given = replies, {}

    def next(self, prompt: Any) -> list[int]:
        digest = key(prompt)
        taken = self.given.get(digest, 0)
        if len(self.replies.get(digest, ())) <= taken:
            raise SystemExit(
                f"a prompt ({len(prompt)} ids) has no recorded reply left: the replies were recorded with another "
                "tokenizer, workload or omrl; record them again (--rounds 0 --replies DIR, the file removed)"
            )
        self.given[digest] = taken + 1
        return self.replies[digest][taken]


def forced_scores(logits: torch.Tensor, picked: list[int]) -> list[float]:
    """The log-probs of the forced ids, at temperature 1 (a row's logits on the device the model is on)."""
    index = torch.tensor(picked, device=logits.device)[:, None]
    return torch.log_softmax(logits, dim=-1).gather(1, index).squeeze(1).tolist()


class Recording(HFStream):
    """A continuous stream that keeps every reply it sampled, under its prompt."""

    def __init__(self, *args: Any, record: Replies):
        super().__init__(*args)
        self.record, self.prompts = record, {}

    def submit(self, prompt, max_new_tokens, seed):
        ticket = super().submit(prompt, max_new_tokens, seed)
        self.prompts[ticket] = key(prompt)
        return ticket

    def _step(self):
        self.backend.joining = [not row.ids for row in self._rows]
        return super()._step()

    def advance(self):
        done = super().advance()
        for ticket, gen in done:
            self.record.setdefault(self.prompts.pop(ticket), []).append(list(gen.token_ids))
        return done


class ForcedStream(HFStream):
    """A continuous stream whose rows take their recorded ids (log-probs: the model's, at temperature 1)."""

    def __init__(self, *args: Any, replay: Replay):
        super().__init__(*args)
        self.replay, self.scripted = replay, {}

    def submit(self, prompt, max_new_tokens, seed):
        ticket = super().submit(prompt, max_new_tokens, seed)
        self.scripted[ticket] = self.replay.next(prompt)
        return ticket

    def _step(self):
        self.backend.joining = [not row.ids for row in self._rows]
        return super()._step()

    def pick(self, logits, rows):
        picked = [self.scripted[row.ticket][len(row.ids)] for row in rows]
        return picked, forced_scores(logits, picked)


class ForcedRows:
    """The turn-by-turn engine's row sampler, taking each row's recorded ids."""

    def __init__(self, replies: list[list[int]]):
        self.replies, self.taken = replies, [0] * len(replies)

    def __call__(self, logits, live):
        picked = []
        for row in live:
            picked.append(self.replies[row][self.taken[row]])
            self.taken[row] += 1
        return picked, forced_scores(logits, picked)


class Forced(HFBackend):
    """The hf backend, either batching, replaying ``replies``; with ``record`` set, sampling and recording."""

    def __init__(self, *args: Any, replies: Replies, record: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.replies, self.record = replies, record
        self.replay = Replay(replies)  # one backend a rollout: each starts from the first reply of each prompt
        self.calls: dict[str, float] = dict.fromkeys(CALL_COUNTS, 0)
        self.steps: list[tuple[int, int, int, float]] = []  # each slot-batch step: rows, attended, real attended, s
        self.joining: list[bool] = []  # a continuous step's rows: which feed their prompt (set by the stream)

    def stream(self, params: SamplingParams):
        if self.batching != "continuous":
            return None
        if self.record:
            return Recording(self, self.reuse, params, self.batch_size, record=self.replies)
        return ForcedStream(self, self.reuse, params, self.batch_size, replay=self.replay)

    def _sampler(self, params, prompts):
        return ForcedRows([self.replay.next(p.tolist()) for p in prompts])

    def _forward(self, ids, positions, cache, mask=None, keep=None):
        # what the model was asked to compute, whatever it costs on this machine: where a forward costs about
        # the same at any size (a launch-bound GPU) the calls bound the time, on a CPU the rows and columns
        if keep is not None:
            self._count_ragged(cache, keep)
        else:
            kind = "decode" if mask is not None else "prefill"  # the slot batch's steps pass their mask, prompts none
            self.calls[f"{kind}_calls"] += 1
            self.calls[f"{kind}_rows"] += ids.shape[0]
            # the columns each new token attends to (read from shapes: reading a GPU tensor would wait for it)
            width = mask.shape[1] if mask is not None else cache.get_seq_length() + ids.shape[1]
            self.calls[f"{kind}_attended"] += ids.shape[0] * ids.shape[1] * width
        wait_for(self.device)
        started = time.perf_counter()
        logits = super()._forward(ids, positions, cache, mask, keep)
        wait_for(self.device)
        seconds = time.perf_counter() - started
        if keep is None and mask is None:
            self.calls["prefill_forward_seconds"] += seconds
            return logits
        self.calls["decode_seconds"] += seconds
        if keep is None:  # a slot-batch step: what the step-cost fit reads
            real = int(mask.sum())  # each row's own tokens, its new one included
            self.calls["decode_real_attended"] += real
            self.steps.append((ids.shape[0], ids.shape[0] * width, real, seconds))
        return logits

    def _count_ragged(self, cache: Any, keep: torch.Tensor) -> None:
        """A continuous step: one call whose rows are decoding rows (one id each) and joining prompts (their
        rest), each attending to its own columns only (no padding)."""
        befores = cache.layers[0].batch.lengths
        ends = [int(end) + 1 for end in keep.tolist()]
        self.calls["decode_calls"] += 1
        for joining, before, start, end in zip(self.joining, befores, [0, *ends], ends):
            kind, new = ("prefill" if joining else "decode"), end - start
            self.calls[f"{kind}_rows"] += 1
            self.calls[f"{kind}_attended"] += new * before + new * (new + 1) // 2
            if not joining:
                self.calls["decode_real_attended"] += before + 1


def rollout(session: RolloutSession, backend: HFBackend, tasks: list[Any], cfg: TrainRunConfig, seed: int):
    """One rollout step: its seconds, sampled tokens, episodes' turn counts and ids."""
    session.backend = backend
    backend.take_stats()
    started = time.perf_counter()
    episodes = session.play(tasks, PlaySpec(split=cfg.env.split, group_size=cfg.group_size, seed=seed)).episodes
    seconds = time.perf_counter() - started
    stats = backend.take_stats()
    return {
        "seconds": seconds,
        "sampled_tokens": int(stats["decode_tokens"]),
        "turns": [len(ep.turns) for ep in episodes],
        # decode steps no batching can go below: a reply's first id comes with its prompt, each further id takes a
        # step, and an episode's turns follow one another (the longest such chain of steps)
        "chain_decode_steps": max(sum(t.span[1] - t.span[0] - 1 for t in ep.turns) for ep in episodes),
        "prefill_computed": int(stats["prefill_computed"]),
        "prefill_reused": int(stats["prefill_reused"]),
        # of the rollout, seconds running prompts (the same work in both modes) and in generate calls
        "prefill_seconds": stats["prefill_seconds"],
        "generate_seconds": stats["generate_seconds"],
        **backend.calls,
    }, sorted(ep.token_ids for ep in episodes)  # a task's samples may swap replies between the modes


def step_cost(steps: list[tuple[int, int, int, float]]) -> dict[str, float]:
    """Seconds a decode step costs per ``call``, per ``row`` and per attended ``column`` (padding included), fitted
    to ``steps`` (rows, attended, real attended, seconds) by least squares with no term below 0: of the fits over each
    subset of the terms, the closest whose terms are all >= 0."""
    names = ("call", "row", "column")
    x = torch.tensor([[1.0, rows, attended] for rows, attended, _, _ in steps], dtype=torch.float64)
    y = torch.tensor([seconds for *_, seconds in steps], dtype=torch.float64)
    best: tuple[float, dict[str, float]] = (float("inf"), dict.fromkeys(names, 0.0))
    for subset in range(1, 8):
        terms = [i for i in range(3) if subset >> i & 1]
        fitted = torch.linalg.lstsq(x[:, terms], y[:, None]).solution[:, 0]
        residual = float(((x[:, terms] @ fitted - y) ** 2).sum())
        if (fitted >= 0).all() and residual < best[0]:
            cost = dict.fromkeys(names, 0.0)
            cost.update({names[i]: float(value) for i, value in zip(terms, fitted)})
            best = (residual, cost)
    return best[1]


def load_replies(path: Path) -> Replies:
    return json.loads(path.read_text())


def save_replies(path: Path, replies: Replies) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(replies))


def measure(
    name: str, rounds: int, cfg: TrainRunConfig, model: Any, tokenizer: Any, bf16: bool, replies_file: Path | None
) -> dict[str, Any]:
    session, order, _ = setup_rollout(cfg, model, tokenizer)
    tasks = order.take(cfg.tasks_per_step)  # the first step's tasks, as a run draws them
    seed = cfg.seed * 1_000_003
    replayed = replies_file is not None and replies_file.exists()
    replies: Replies = load_replies(replies_file) if replayed else {}
    gen = cfg.generation

    def backend(mode: str, record: bool = False) -> Forced:
        return Forced(
            model, tokenizer, batch_size=gen.batch_size, kv_cache_mb=gen.kv_cache_mb, batching=mode,
            replies=replies, record=record, bf16=bf16,
        )  # fmt: skip

    if replayed:
        recorded, _ = rollout(session, backend("continuous"), tasks, cfg, seed)  # also warms the device up
        print(f"  {name:8s} replaying {replies_file}: {recorded['sampled_tokens']} tokens, turns {recorded['turns']}")
    else:
        recorded, _ = rollout(session, backend("continuous", record=True), tasks, cfg, seed)
        print(f"  {name:8s} recorded {recorded['sampled_tokens']} sampled tokens, turns {sorted(recorded['turns'])}")
        if replies_file is not None:
            save_replies(replies_file, replies)
    if rounds == 0:
        return {"overrides": WORKLOADS[name], "sampled_tokens": recorded["sampled_tokens"], "turns": recorded["turns"]}
    runs: dict[str, list[dict[str, Any]]] = {"turns": [], "continuous": []}
    steps: list[tuple[int, int, int, float]] = []  # every decode step of every round, both modes
    same: list[bool] = []
    for round_no in range(rounds):
        order_of_modes = ("turns", "continuous") if round_no % 2 == 0 else ("continuous", "turns")
        ids = {}
        for mode in order_of_modes:
            played = backend(mode)
            run, ids[mode] = rollout(session, played, tasks, cfg, seed)
            steps.extend(played.steps)
            runs[mode].append(run)
            print(
                f"  {name:8s} round {round_no + 1} {mode:10s} {run['seconds']:7.1f} s "
                f"(generating {run['generate_seconds']:.1f} s, of it prompts {run['prefill_seconds']:.1f} s)",
                flush=True,
            )
        same.append(ids["turns"] == ids["continuous"])
    med = {mode: statistics.median(r["seconds"] for r in runs[mode]) for mode in runs}
    # what a decode step costs here, fitted over every step: per call, per row, per attended column
    cost = step_cost(steps)
    # the least any batching that runs a prompt as its own forward could take: the prompts (the same work in both
    # modes; their faster median), then the fewest decode steps (the longest chain) carrying every row once, each
    # attending to its own columns alone (no padding)
    prompts = min(statistics.median(r["prefill_seconds"] for r in runs[mode]) for mode in runs)
    least = {
        "call": recorded["chain_decode_steps"],
        "row": recorded["decode_rows"],
        "column": recorded["decode_real_attended"],
    }
    floor = prompts + sum(cost[term] * least[term] for term in least)
    return {
        "overrides": WORKLOADS[name],
        "replies": f"replayed from {replies_file}" if replayed else "sampled by this model",
        "episodes": len(tasks) * cfg.group_size,
        "max_new_tokens": gen.max_new_tokens,
        "sampled_tokens": recorded["sampled_tokens"],
        "turns": sorted(recorded["turns"]),
        "reply_lengths": sorted(len(r) for rs in replies.values() for r in rs),
        "runs": runs,
        "median_seconds": med,
        "same_episodes_each_round": same,
        "speedup": med["turns"] / med["continuous"],  # >1: continuous is faster
        "step_cost": cost,
        "floor_seconds": floor,
        "ceiling": med["turns"] / floor,  # the speed-up no such batching can pass on this machine
        "speedup_per_round": [t["seconds"] / c["seconds"] for t, c in zip(runs["turns"], runs["continuous"])],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="grpo")
    parser.add_argument("--rounds", type=int, default=3, help="0: record the replies (--replies) only")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    parser.add_argument("--bf16", action="store_true", help="both modes under bfloat16 autocast (bf16=true)")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--replies", type=Path, help="DIR: replay DIR/<workload>.json where present, else record it")
    parser.add_argument("--model", help="play every workload on this model (a name or a directory)")
    parser.add_argument("--json", default=str(default_json("continuous_batching")), help="where the results go")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else None
    result: dict[str, Any] = {"preset": args.preset, "rounds": args.rounds, "bf16": args.bf16}
    loaded: dict[str, tuple[Any, Any]] = {}  # a workload may play another model than the preset's
    for name in args.workloads:
        overrides = WORKLOADS[name] + ([f"model.name={args.model}"] if args.model else [])
        cfg = load_config(TrainRunConfig, args.preset, overrides)
        if cfg.model.name not in loaded:
            loaded.clear()  # one model in memory at a time
            loaded[cfg.model.name] = load_model(cfg.model.name, dtype=cfg.model.dtype, device=device)
            loaded[cfg.model.name][0].eval()
        model, tokenizer = loaded[cfg.model.name]
        replies_file = args.replies / f"{name}.json" if args.replies else None
        measured = measure(name, args.rounds, cfg, model, tokenizer, args.bf16, replies_file)
        result[name] = {"model": cfg.model.name, **measured}
        r = result[name]
        if args.rounds:  # else the replies were recorded only
            print(
                f"{name}: {r['episodes']} episodes, {r['sampled_tokens']} sampled tokens; median seconds a rollout: "
                f"turns {r['median_seconds']['turns']:.1f}, continuous {r['median_seconds']['continuous']:.1f}: "
                f"{r['speedup']:.2f}x (per round {', '.join(f'{x:.2f}' for x in r['speedup_per_round'])}); "
                f"same episodes in both modes: {all(r['same_episodes_each_round'])}",
                flush=True,
            )
            c = r["step_cost"]
            print(
                f"  a decode step here: {c['call'] * 1e3:.1f} ms + {c['row'] * 1e3:.2f} ms a row + "
                f"{c['column'] * 1e6:.2f} us an attended column; floor {r['floor_seconds']:.1f} s (the prompts, then "
                f"{r['runs']['turns'][0]['chain_decode_steps']} chained steps carrying every row, no padding): no "
                f"batching that runs prompts as their own forwards passes {r['ceiling']:.2f}x here",
                flush=True,
            )
            turns, continuous = r["runs"]["turns"][0], r["runs"]["continuous"][0]
            print(
                "  forward calls, turns/continuous: "
                + ", ".join(f"{count} {turns[count]:.6g}/{continuous[count]:.6g}" for count in CALL_COUNTS),
                flush=True,
            )
        result["machine"] = machine(args.threads)
        save_json(args.json, result)  # after each workload: a run stopped later keeps what it measured
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
