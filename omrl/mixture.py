"""Several envs in one run: naming a mixture, each env's own settings, and drawing tasks by weight.

A mixture is named one way, read from either place:

- ``env.name`` with commas, each env with an optional weight after its last colon:
  ``--env webshop:0.5,textcraft:0.3,gridworld:0.2`` (no weight: 1; weights are normalised);
- ``env.mix`` in YAML, a list whose entries may also set the env's own ``split``, ``template``,
  ``max_turns``, ``demonstration``, ``num_workers``, ``reward`` (reward weights) and ``plugins``
  (merged over the run's ``plugins`` block); whatever an entry leaves out is the run's.

A single env (``--env webshop``) is no mixture: everything runs exactly as before. A mixture's
tasks are :class:`EnvTask` values (env, split, task id), so a GRPO group, which is the samples of
one task, never mixes envs; :class:`MixedTaskOrder` draws each step's tasks by weight, seeded and
resumable.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from omrl import registry
from omrl.config.schema import from_dict
from omrl.errors import ConfigError
from omrl.rewards import check_weights

#: the keys an ``env.mix`` entry may set (besides ``name`` and ``weight``), and where they go
MEMBER_ENV_KEYS = ("split", "template", "max_turns", "demonstration", "num_workers")
MEMBER_KEYS = ("name", "weight", *MEMBER_ENV_KEYS, "reward", "plugins")


class EnvTask(NamedTuple):
    """One task of a mixture: which env, which split, which task id of that env."""

    env: str
    split: str
    task: int


@dataclass(frozen=True)
class MixMember:
    """One env of a mixture with its weight (normalised over the mixture) and its own settings."""

    name: str
    weight: float
    env: Any  # an EnvConfig: the run's, with this env's own keys set
    reward_weights: dict[str, float]
    plugins: dict[str, dict[str, Any]]


def parse_env_spec(text: str) -> list[tuple[str, float]]:
    """``"webshop:0.5,gridworld"`` -> ``[("webshop", 0.5), ("gridworld", 1.0)]``: a weight is what follows
    the last colon when it reads as a number (env names like ``babyai:GoTo`` keep their colon)."""
    out = []
    for part in (piece.strip() for piece in text.split(",")):
        if not part:
            raise ConfigError(f"env {text!r} has an empty entry; write env names (with :weight) between commas")
        name, weight = part, 1.0
        head, colon, tail = part.rpartition(":")
        if colon:
            try:
                name, weight = head, float(tail)
            except ValueError:
                pass  # part of the name
        out.append((name, weight))
    return out


def same_envs(first: Any, second: Any) -> bool:
    """Whether two ``env.name`` values name the same envs, weights and order aside (``a:0.7,b`` and ``b,a``)."""
    try:
        return sorted(n for n, _ in parse_env_spec(first)) == sorted(n for n, _ in parse_env_spec(second))
    except (ConfigError, AttributeError):  # not a name at all
        return False


def is_mixture(env_cfg: Any) -> bool:
    """Whether the env section names a mixture (several envs, a weight, or ``env.mix``) rather than one env."""
    return bool(env_cfg.mix) or _names_a_mixture(env_cfg.name)


def _names_a_mixture(name: str) -> bool:
    return parse_env_spec(name) != [(name, 1.0)]


def mix_members(cfg: Any) -> list[MixMember]:
    """The run's envs, weights normalised; one member of weight 1 for a single env. Refuses an unknown
    env, a weight that is not a positive number, an env named twice, or an unknown per-env key."""
    env_cfg = cfg.env
    run_weights = dict(cfg.reward.weights)
    run_plugins = dict(getattr(cfg, "plugins", {}) or {})
    if env_cfg.mix and _names_a_mixture(env_cfg.name):
        raise ConfigError("name the mixture once: env.mix, or a list in env.name (webshop:0.5,gridworld:0.5), not both")
    entries = [_entry(item, i) for i, item in enumerate(env_cfg.mix)] or [
        {"name": name, "weight": weight} for name, weight in parse_env_spec(env_cfg.name)
    ]
    names = [entry["name"] for entry in entries]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"env {twice[0]!r} is named twice in the mixture; name each env once, with one weight")
    total = 0.0
    for entry in entries:
        weight = entry["weight"]
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
            raise ConfigError(f"env {entry['name']!r} has weight {weight!r}; a weight must be a positive number")
        total += weight
    if not math.isfinite(total):  # each weight finite, their sum not: normalising would give 0s and NaNs
        weights = ", ".join(f"{entry['name']}:{entry['weight']!r}" for entry in entries)
        raise ConfigError(
            f"the mixture's weights ({weights}) add up past the largest number; weights are normalised, "
            "so give smaller ones in the same ratios (e.g. 1 and 1)"
        )
    members = []
    for index, entry in enumerate(entries):
        registry.envs.get(entry["name"])  # unknown: names the valid ones
        env = _member_env(env_cfg, entry, f"env.mix[{index}]")
        plugins = {**run_plugins, **{k: {**run_plugins.get(k, {}), **v} for k, v in entry.get("plugins", {}).items()}}
        weights = entry.get("reward", run_weights)
        if "reward" in entry:
            check_weights(weights, f"env.mix[{index}].reward ({entry['name']})")
        members.append(MixMember(entry["name"], entry["weight"] / total, env, dict(weights), plugins))
    return members


def _member_env(env_cfg: Any, entry: dict[str, Any], where: str) -> Any:
    """The env section of one mixture entry: the run's, with the entry's own keys checked by the same
    types and ranges as ``env.*`` (a max_turns of -3 would end every episode after one turn)."""
    own = {key: entry[key] for key in MEMBER_ENV_KEYS if key in entry}
    env = from_dict(type(env_cfg), own, where, base=dataclasses.replace(env_cfg, name=entry["name"], mix=[]))
    # the keys the entry sets; what it inherits is the run's env.*, checked as such
    if "max_turns" in own and env.max_turns < 0:
        raise ConfigError(f"{where}.max_turns must be >= 0 (0: the env's own cap), got {env.max_turns}")
    if "num_workers" in own and env.num_workers < 1:
        raise ConfigError(f"{where}.num_workers must be >= 1 (threads stepping the env), got {env.num_workers}")
    return env


def member_config(cfg: Any, member: MixMember) -> Any:
    """The run config as a one-env run of ``member``: its env section, reward weights and plugin options."""
    out = dataclasses.replace(
        cfg, env=member.env, reward=dataclasses.replace(cfg.reward, weights=member.reward_weights)
    )
    if hasattr(cfg, "plugins"):
        out = dataclasses.replace(out, plugins=member.plugins)
    return out


def task_of(episode: Any, mixed: bool) -> Any:
    """The task an episode played, as its run names tasks: an :class:`EnvTask` in a mixture, else the id."""
    return EnvTask(episode.env, episode.split, int(episode.task_id)) if mixed else episode.task_id


def _entry(item: Any, index: int) -> dict[str, Any]:
    """One ``env.mix`` entry checked: a mapping with a name, known keys, a weight (default 1)."""
    if isinstance(item, str):
        named = parse_env_spec(item)
        if len(named) != 1:
            raise ConfigError(
                f"env.mix[{index}] is {item!r}, which names {len(named)} envs; each entry names one env "
                "(a list of entries, or the mixture in env.name)"
            )
        return {"name": named[0][0], "weight": named[0][1]}
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise ConfigError(
            f"env.mix[{index}] is {item!r}; each entry is an env name or a mapping with a name, "
            f"e.g. {{name: gridworld, weight: 0.5, max_turns: 8}}"
        )
    unknown = sorted(set(item) - set(MEMBER_KEYS))
    if unknown:
        raise ConfigError(
            f"env.mix[{index}] ({item['name']}) has unknown key {unknown[0]!r}; valid: {', '.join(MEMBER_KEYS)}"
        )
    for key in ("reward", "plugins"):
        if key in item and not isinstance(item[key], dict):
            raise ConfigError(f"env.mix[{index}].{key} must be a mapping, got {item[key]!r}")
    for plugin, options in item.get("plugins", {}).items():
        if not isinstance(options, dict):
            raise ConfigError(
                f"env.mix[{index}].plugins.{plugin} must be a mapping of that plugin's options, got {options!r}"
            )
    return {"weight": 1.0, **item}


@dataclass
class MixedTaskOrder:
    """Each take gives every env ``floor(weight * count)`` of the slots and draws the rest so that each
    env gets one more with exactly its fraction left over (systematic sampling), then shuffles the
    slots (seeded by the run's seed and the count of takes so far); each slot takes its env's next
    task from that env's own seeded shuffle (:class:`~omrl.training.rl_data.TaskOrder`).
    So a step's mix is as close to the weights as whole tasks allow, and over many steps it matches
    them. ``draws`` and every env's position go into checkpoints (:meth:`state`), so a resumed run
    draws what it would have."""

    orders: dict[str, Any]  # env name -> TaskOrder of EnvTask
    weights: dict[str, float]
    seed: int
    draws: int = 0

    def take(self, count: int) -> list[EnvTask]:
        names = list(self.orders)
        rng = np.random.default_rng([self.seed, 0x6D1C, self.draws])
        self.draws += 1
        share = np.array([self.weights[name] for name in names], dtype=np.float64)
        expected = share / share.sum() * count
        slots = np.floor(expected).astype(int)
        left = count - int(slots.sum())
        if left:
            slots += np.bincount(_systematic_picks(expected - slots, left, rng), minlength=len(names))
        picks = rng.permutation(np.repeat(np.arange(len(names)), slots))
        drawn = {i: iter(self.orders[names[i]].take(int(slots[i]))) for i in range(len(names)) if slots[i]}
        return [next(drawn[i]) for i in picks.tolist()]

    def state(self) -> dict[str, Any]:
        return {"task_draws": self.draws, "task_orders": {k: [o.epoch, o.cursor] for k, o in self.orders.items()}}

    def load_state(self, state: dict[str, Any]) -> None:
        if "task_orders" not in state or set(state["task_orders"]) != set(self.orders):
            raise ConfigError(
                f"the checkpoint's task order is for envs {sorted(state.get('task_orders', {})) or 'of a one-env run'}, "
                f"this run mixes {sorted(self.orders)}; resume with the envs the run was started with"
            )
        self.draws = int(state["task_draws"])
        for name, (epoch, cursor) in state["task_orders"].items():
            self.orders[name].epoch, self.orders[name].cursor = int(epoch), int(cursor)


def _systematic_picks(fractions: np.ndarray, left: int, rng: np.random.Generator) -> np.ndarray:
    """``left`` distinct indices, index ``i`` drawn with probability ``fractions[i]`` exactly (each is
    below 1 and they add up to ``left``): the points ``u, u+1, ...`` for one uniform ``u`` fall in the
    running sum of the fractions. A weighted draw without replacement would not give these odds once
    two or more slots are left (weights 0.5/0.3/0.2 at 3 tasks a step drew 0.519/0.265/0.216)."""
    bounds = np.cumsum(fractions)
    bounds *= left / bounds[-1]  # rounding must not leave the last point past the end
    return np.searchsorted(bounds, rng.random() + np.arange(left), side="right")
