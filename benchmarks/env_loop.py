"""Rollout-loop overhead: ``omrl.rollout.collect`` with an instant policy vs the bare env in a plain loop.

    python benchmarks/env_loop.py [--envs gridworld webshop] [--episodes 32] [--rounds 5] [--clock cpu]
                                  [--json out.json]

Peer (the limit): the env itself, stepped in a plain Python loop (``reset``, then ``step``
with the same actions) with nothing around it. The rollout loop plays the very same
episodes through ``collect`` with a policy that costs nothing: a Backend that answers every
prompt at once with the token ids of a prepared reply (the template's ``format_action`` of the
next scripted action, then the end-of-turn token). So whatever ``collect`` spends beyond the
bare loop is the loop's own work: chat-template increments, decoding and parsing replies,
bookkeeping of the episode's tokens, the env pool.

Scripts: ``expert`` replays, for each task, the actions the env's scripted expert takes
(recorded beforehand, outside the timing, so neither side pays for the expert's own
search); ``fixed`` repeats one valid action until the env's turn cap (gridworld: ``up``,
blocked or not). Both sides play identical step counts (checked).

Ratio = bare seconds per episode-step / loop seconds per episode-step, measured in each round
with the sides alternating (their order rotates every round), reported as min and median
over rounds. Target: >= 0.95. When the median ratio misses it, one extra loop pass runs under
cProfile and the costliest functions (own time) are printed and saved. Times are wall-clock;
``--clock cpu`` takes the process's CPU time instead, far steadier on a machine that others
load (every side runs on this one thread).

A third side, ``bare+tok``, is the bare loop plus the token work no LLM rollout can skip:
decoding each reply's ids and encoding each observation's text (the reset's and every
step's), with the loop's own encoder (``omrl.chat.encode_text``) and decoder call. It is the
true floor: its ratio to the loop (``floor ratio``) says how close the loop is to what any
token-exact rollout must do. When the env steps in tens of microseconds, encoding one
observation costs more than the step itself, so even a loop with no overhead of its own
reaches at most bare / bare+tok, well below 0.95; on a miss the output says so per env.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import statistics
import time
from pathlib import Path
from typing import Sequence

import torch
from _results import default_json, machine, save_json

from omrl import registry
from omrl.backends.base import Backend, Generation, SamplingParams
from omrl.chat import encode_text
from omrl.envs import Env, create_env
from omrl.models import load_tokenizer
from omrl.rollout import EnvPool, RolloutLimits, collect

TARGET = 0.95
FIXED_ACTIONS = {"gridworld": "up"}  # one action that is always valid (the env itself may still refuse the move)


class ReplayPolicy(Backend):
    """A policy that costs nothing: each episode's next reply is ready as token ids before it is asked for.

    ``replies[i]`` holds the reply ids, turn by turn, of the i-th episode ``collect`` starts.
    An episode is recognised by its chat (``collect`` passes each live episode's message
    list, the same list object on every turn); a new chat takes the next script in start
    order, which is task order when every episode starts at once (``max_parallel=0``).
    """

    name = "replay"

    def __init__(self, tokenizer, replies: Sequence[Sequence[list[int]]]):
        super().__init__(tokenizer, batch_size=max(1, len(replies)))
        self.replies = replies
        self._episodes: dict[int, list] = {}  # id(messages) -> [script index, turn, messages (kept alive)]

    def generate(self, prompts, params: SamplingParams, messages=None) -> list[Generation]:
        out = []
        for chat in messages:
            slot = self._episodes.get(id(chat))
            if slot is None:
                slot = self._episodes[id(chat)] = [len(self._episodes), 0, chat]
            ids = self.replies[slot[0]][slot[1]]
            slot[1] += 1
            out.append(Generation(ids, [0.0] * len(ids), "stop"))
        return out

    def release(self, conversations=None) -> None:
        if conversations is None:  # collect ended: the next call starts the scripts over
            self._episodes = {}


def expert_script(env: Env, task: int, cap: int) -> list[str]:
    """The actions the env's scripted expert takes in ``task`` (at most ``cap``)."""
    env.reset(task)
    actions: list[str] = []
    while len(actions) < cap:
        action = env.expert_action()
        if action is None:
            break
        actions.append(action)
        if env.step(action).done:
            break
    return actions


def bare_pass(env: Env, tasks: Sequence[int], scripts: Sequence[Sequence[str]]) -> int:
    """Play every script on one env instance in a plain loop; returns the steps taken."""
    steps = 0
    for task, script in zip(tasks, scripts):
        env.reset(task)
        for action in script:
            steps += 1
            if env.step(action).done:
                break
    return steps


def tokens_pass(env: Env, tasks: Sequence[int], scripts: Sequence[Sequence[str]], replies, tokenizer) -> int:
    """The bare loop plus the unavoidable token work, done as the loop does it: decode every reply,
    encode every observation (with ``omrl.chat.encode_text``, the loop's own encoder)."""
    steps = 0
    for task, script, ids in zip(tasks, scripts, replies):
        first = env.reset(task)
        encode_text(tokenizer, f"{first.instruction}\n\n{first.text}")
        for action, reply in zip(script, ids):
            steps += 1
            tokenizer.decode(reply[:-1], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            result = env.step(action)
            encode_text(tokenizer, result.observation)
            if result.done:
                break
    return steps


def loop_pass(
    pool: EnvPool,
    template,
    tokenizer,
    tasks: Sequence[int],
    policy: ReplayPolicy,
    limits: RolloutLimits,
    demonstration: bool,
) -> int:
    """Play the same scripts through ``collect``; returns the env steps taken."""
    episodes = collect(pool, template, tokenizer, tasks, backend=policy, limits=limits, demonstration=demonstration)
    return sum(1 for ep in episodes for turn in ep.turns if turn.action is not None)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def timed(fn, clock=time.perf_counter) -> tuple[float, int]:
    gc.collect()
    start = clock()
    steps = fn()
    return clock() - start, steps


def profile_top(fn, count: int) -> list[dict]:
    """Run ``fn`` under cProfile; the ``count`` functions with the most own time."""
    profiler = cProfile.Profile()
    profiler.enable()
    fn()
    profiler.disable()
    stats = pstats.Stats(profiler, stream=io.StringIO())
    total = sum(row[2] for row in stats.stats.values())  # own times add up to the whole run
    rows = []
    for (path, line, func), (_, calls, own, cumulative, _) in stats.stats.items():
        rows.append(
            {
                "function": f"{Path(path).name}:{line}({func})",
                "calls": calls,
                "own_s": own,
                "cumulative_s": cumulative,
                "own_share": own / total if total else 0.0,
            }
        )
    rows.sort(key=lambda row: row["own_s"], reverse=True)
    return rows[:count]


def cumulative_of(fn, names: Sequence[str]) -> dict[str, float]:
    """Cumulative seconds spent in each of the named functions (``file:function``) during ``fn``."""
    profiler = cProfile.Profile()
    profiler.enable()
    start = time.perf_counter()
    fn()
    whole = time.perf_counter() - start
    profiler.disable()
    stats = pstats.Stats(profiler, stream=io.StringIO())
    out = {"whole": whole}
    for (path, _, func), (_, _, _, cumulative, _) in stats.stats.items():
        key = f"{Path(path).name}:{func}"
        if key in names:
            out[key] = out.get(key, 0.0) + cumulative
    return out


# the loop's own parts, by the function that does them (cumulative time under cProfile)
PARTS = (
    "loop.py:_start",
    "live.py:record_reply",
    "live.py:continue_chat",
    "pool.py:step_many",
    "live.py:record_step",
    "render.py:next_turn_ids",
    "render.py:prompt_ids",
    "live.py:_parse",
)


def bench_env(name: str, script_kind: str, args, tokenizer) -> dict:
    env_class = registry.envs.get(name)
    template = registry.templates.get(args.template)()
    pool = EnvPool(env_class, name=name)
    probe = pool.probe()
    tasks = [int(t) for t in list(probe.split_of("train"))[: args.episodes]]
    cap = int(probe.max_turns)
    if script_kind == "expert":
        scripts = [expert_script(probe, task, cap) for task in tasks]
    else:
        scripts = [[FIXED_ACTIONS[name]] * cap for _ in tasks]
    eos = int(tokenizer.eos_token_id)
    encoded: dict[str, list[int]] = {}
    for script in scripts:
        for action in script:
            if action not in encoded:
                text = template.format_action(action, probe)
                encoded[action] = tokenizer.encode(text, add_special_tokens=False) + [eos]
    replies = [[encoded[a] for a in script] for script in scripts]
    policy = ReplayPolicy(tokenizer, replies)
    limits = RolloutLimits(
        max_new_tokens=max(len(ids) for ids in encoded.values()), max_context=args.max_context, max_turns=cap
    )
    bare_env = create_env(env_class, {}, name)

    def run_bare() -> int:
        return bare_pass(bare_env, tasks, scripts)

    def run_tokens() -> int:
        return tokens_pass(bare_env, tasks, scripts, replies, tokenizer)

    def run_loop() -> int:
        return loop_pass(pool, template, tokenizer, tasks, policy, limits, args.demonstration)

    sides = [("bare", run_bare), ("bare+tok", run_tokens), ("loop", run_loop)]
    for _, fn in sides:  # warm-up: envs built, caches filled, nothing first-call on any side
        fn()
    rounds = []
    for r in range(args.rounds):
        order = sides[r % 3 :] + sides[: r % 3]
        got = {side: timed(fn, CLOCKS[args.clock]) for side, fn in order}
        counts = {side: steps for side, (_, steps) in got.items()}
        if len(set(counts.values())) != 1:
            raise SystemExit(f"{name}/{script_kind}: the sides took different step counts: {counts}")
        bare_s, tok_s, loop_s = got["bare"][0], got["bare+tok"][0], got["loop"][0]
        rounds.append(
            {
                "bare_s": bare_s,
                "bare_tok_s": tok_s,
                "loop_s": loop_s,
                "steps": counts["loop"],
                "ratio": bare_s / loop_s,
                "floor_ratio": tok_s / loop_s,
            }
        )
    ratios = [r["ratio"] for r in rounds]
    steps = rounds[0]["steps"]
    row = {
        "env": name,
        "script": script_kind,
        "episodes": len(tasks),
        "steps": steps,
        "bare_us_per_step": 1e6 * statistics.median(r["bare_s"] for r in rounds) / steps,
        "bare_tok_us_per_step": 1e6 * statistics.median(r["bare_tok_s"] for r in rounds) / steps,
        "loop_us_per_step": 1e6 * statistics.median(r["loop_s"] for r in rounds) / steps,
        "ratio_min": min(ratios),
        "ratio_median": statistics.median(ratios),
        "floor_ratio_median": statistics.median(r["floor_ratio"] for r in rounds),
        "rounds": rounds,
    }
    row["met"] = row["ratio_median"] >= TARGET
    if not row["met"] and args.profile_top:
        row["profile_top"] = profile_top(run_loop, args.profile_top)
        row["profile_parts_s"] = cumulative_of(run_loop, PARTS)
    pool.close()
    bare_env.close()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["gridworld", "webshop"])
    parser.add_argument(
        "--scripts",
        nargs="+",
        default=["expert", "fixed"],
        choices=["expert", "fixed"],
        help="fixed is only played by envs with a FIXED_ACTIONS entry",
    )
    parser.add_argument("--episodes", type=int, default=32, help="tasks per pass (one episode each)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating bare/loop rounds")
    parser.add_argument("--model", default="smollm2-135m", help="whose tokenizer and chat template the loop uses")
    parser.add_argument("--template", default="react")
    parser.add_argument(
        "--max-context", type=int, default=32768, help="large, so no episode is cut short and both sides step alike"
    )
    parser.add_argument(
        "--no-demonstration",
        dest="demonstration",
        action="store_false",
        help="leave the env's worked example out of the chat (the default job has it)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="cpu: the process's CPU time, steadier than wall time on a machine others share "
        "(every side runs on one thread: the built-in envs step in the calling thread)",
    )
    parser.add_argument("--profile-top", type=int, default=15, help="functions listed on a miss (0: no profile)")
    parser.add_argument("--json", type=Path, default=default_json("env_loop"), help="where the results go")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.model)
    results = []
    for name in args.envs:
        for kind in args.scripts:
            if kind == "fixed" and name not in FIXED_ACTIONS:
                continue
            results.append(bench_env(name, kind, args, tokenizer))

    print(
        f"rollout loop (collect, instant scripted policy) vs bare env loop; {args.episodes} episodes a pass, "
        f"{args.rounds} alternating rounds, {args.clock} clock, tokenizer {args.model}, template {args.template}, "
        f"demonstration {'on' if args.demonstration else 'off'}"
    )
    print(
        f"{'env':10s} {'script':7s} {'steps':>6s} {'bare us/step':>13s} {'bare+tok us':>12s} "
        f"{'loop us/step':>13s} {'ratio min':>10s} {'ratio med':>10s} {'floor ratio':>12s}  target >= {TARGET}"
    )
    for row in results:
        print(
            f"{row['env']:10s} {row['script']:7s} {row['steps']:6d} {row['bare_us_per_step']:13.1f} "
            f"{row['bare_tok_us_per_step']:12.1f} {row['loop_us_per_step']:13.1f} {row['ratio_min']:10.3f} "
            f"{row['ratio_median']:10.3f} {row['floor_ratio_median']:12.3f}  {'met' if row['met'] else 'MISSED'}"
        )
    missed = [row for row in results if not row["met"]]
    if missed:
        print(
            "\nthe token work bounds the ratio: a token-exact loop must decode each reply and encode each "
            "observation,\nso its ratio can reach at most bare / bare+tok; floor ratio = bare+tok / loop is how "
            "close it gets to that"
        )
    for row in missed:
        bare, floor, loop = row["bare_us_per_step"], row["bare_tok_us_per_step"], row["loop_us_per_step"]
        print(
            f"  {row['env']}/{row['script']}: token work {floor - bare:.1f} us/step vs the env's step {bare:.1f}: "
            f"best possible ratio {bare / floor:.3f}; the loop's own work beyond it {loop - floor:+.1f} us/step "
            f"(floor ratio {row['floor_ratio_median']:.3f})"
        )
    for row in results:
        if "profile_top" not in row:
            continue
        parts = row["profile_parts_s"]
        print(f"\nprofile of one loop pass, {row['env']}/{row['script']} (cProfile adds overhead; shares matter):")
        print("  by part (cumulative s): " + ", ".join(f"{k} {v:.3f}" for k, v in parts.items()))
        print(f"  {'own s':>8s} {'share':>6s} {'calls':>8s}  function")
        for item in row["profile_top"]:
            print(f"  {item['own_s']:8.4f} {item['own_share']:6.1%} {item['calls']:8d}  {item['function']}")
    save_json(
        args.json,
        {
            "benchmark": "env_loop",
            "target": f"ratio >= {TARGET}",
            "args": {**vars(args), "json": str(args.json)},
            "machine": machine(args.threads),
            "results": results,
        },
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
