"""Several envs in one batched rollout: does the slowest env hold the others back?

    python benchmarks/mixture_rollout.py [--latency 0.2] [--tasks 8] [--group 4] [--rounds 3] [--json out.json]

A mixture's episodes share every generate call (omrl.rollout.loop.collect_lanes), each env with its
own turn cap, and each turn steps the envs' lanes concurrently. Two cases, each played by two
policies: ``expert`` (each env's scripted expert: every reply is a valid action and costs nothing, so
the time is the envs' own) and ``model`` (the `tiny` model generating with the hf backend; its
replies are mostly not valid actions, so generation dominates). Each side is timed in every round,
the order rotating; medians reported:

- **long and short**: a slow multi-turn env (gridworld, every step ``--latency`` seconds longer, as a
  remote env's; up to 6 turns) beside a fast one-turn env (reasoning-gym's letter_counting). Peer:
  the two rollouts one after the other, which is what a run per env, or a loop over envs, costs.
  The limit: the slow env alone. Reported: mixture / sequential (lower is better) and mixture /
  slow alone (1.0 would mean the fast env rode along for free).
- **two slow envs**: two such slow gridworlds (each its own env). Peer: one after the other. If the
  lanes waited on each other's steps, a turn would take twice the latency; stepped concurrently, the
  mixture takes about as long as one of them alone. Reported: mixture / one alone.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _results import default_json, machine, save_json

from omrl import registry
from omrl.config import load_config
from omrl.config.options import RolloutRunConfig
from omrl.hookspecs import hookimpl
from omrl.plugins import load_plugins
from omrl.rollout import PlaySpec, RolloutSession

FAST = "reasoning-gym:letter_counting"


def register_slow_envs(latency: float) -> None:
    """``slow-gridworld`` and ``slow-gridworld-2``: gridworld whose every step sleeps ``latency`` s first,
    as a remote env's does (async_overlap.py serves ``slow-gridworld`` over HTTP)."""
    gridworld = registry.envs.get("gridworld")

    class SlowGridworld(gridworld):
        io_bound = True  # waits like a remote env: its pool steps its instances from threads

        def step(self, action):
            time.sleep(latency)
            return super().step(action)

    class Plugin:
        @hookimpl
        def register_envs(self, register):
            register("slow-gridworld", SlowGridworld)
            register("slow-gridworld-2", type("SlowGridworld2", (SlowGridworld,), {}))

    load_plugins().register(Plugin(), name="benchmark-slow-envs")


def session_for(envs: list[str], expert: bool) -> RolloutSession:
    entries = ", ".join(
        f"{{name: '{env}', max_turns: {1 if env == FAST else 6}, demonstration: false}}" for env in envs
    )
    cfg = load_config(
        RolloutRunConfig,
        None,
        ["model.name=tiny", "env.name=gridworld", f"env.mix=[{entries}]"]
        + ["generation.max_new_tokens=12", "generation.max_context=1024", "generation.temperature=1.0"],
    )
    return RolloutSession.from_config(cfg, expert=expert)


def timed(envs: list[str], tasks: int, group: int, seed: int, expert: bool) -> tuple[float, int]:
    """Seconds of one rollout of ``tasks`` test tasks of each env in ``envs`` (``group`` samples each),
    and the turns played (the session is built outside the timing)."""
    with session_for(envs, expert) as session:
        chosen = session.task_ids("test", tasks)
        started = time.perf_counter()
        episodes = session.play(chosen, PlaySpec(group_size=group, seed=seed, expert=expert)).episodes
        return time.perf_counter() - started, sum(ep.num_turns for ep in episodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--tasks", type=int, default=8, help="test tasks of each env")
    parser.add_argument("--group", type=int, default=4, help="samples per task")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    register_slow_envs(args.latency)
    sides = {
        "slow": ["slow-gridworld"],
        "fast": [FAST],
        "slow+fast": ["slow-gridworld", FAST],
        "slow-2": ["slow-gridworld-2"],
        "slow+slow-2": ["slow-gridworld", "slow-gridworld-2"],
    }
    result = {"machine": machine(), "settings": vars(args)}
    for policy in ("expert", "model"):
        result[policy] = measure(sides, args, expert=policy == "expert")
        for case in ("long_and_short", "two_slow"):
            ratios = result[policy][case]
            print(f"{policy}, {case}: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()), flush=True)
    path = args.json or default_json("mixture_rollout")
    save_json(path, result)
    print(f"wrote {path}")


def measure(sides: dict[str, list[str]], args: argparse.Namespace, expert: bool) -> dict:
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    turns: dict[str, int] = {}
    for round_ in range(args.rounds):
        names = list(sides)
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            took, played = timed(sides[name], args.tasks, args.group, round_, expert)
            seconds[name].append(took)
            turns[name] = played
            print(f"{'expert' if expert else 'model'} round {round_ + 1} {name}: {took:.2f} s, {played} turns")
    median = {name: statistics.median(values) for name, values in seconds.items()}
    return {
        "seconds": seconds,
        "median_s": median,
        "turns": turns,
        "long_and_short": {
            "mixture_over_sequential": median["slow+fast"] / (median["slow"] + median["fast"]),
            "mixture_over_slow_alone": median["slow+fast"] / median["slow"],
        },
        "two_slow": {
            "mixture_over_sequential": median["slow+slow-2"] / (median["slow"] + median["slow-2"]),
            "mixture_over_one_alone": median["slow+slow-2"] / max(median["slow"], median["slow-2"]),
        },
    }


if __name__ == "__main__":
    main()
