"""Several envs in one rollout: naming a mixture, drawing its tasks by weight, playing its envs in one
batched rollout with each env's own settings (omrl.mixture, omrl.rollout.session)."""

from __future__ import annotations

import numpy as np
import pytest

from omrl.config import load_config
from omrl.config.options import RolloutRunConfig, TrainRunConfig
from omrl.errors import ConfigError, UnknownNameError
from omrl.mixture import EnvTask, MixedTaskOrder, is_mixture, mix_members, parse_env_spec, same_envs
from omrl.rewards import RewardError
from omrl.rollout import PlaySpec, RolloutSession
from omrl.search import play_strategy
from omrl.training.metrics import prefill_counts
from omrl.training.rl_data import TaskOrder

ARITHMETIC = "reasoning-gym:basic_arithmetic"
SMALL = ("generation.max_new_tokens=8", "generation.max_context=512")


def test_a_mixture_is_named_with_weights_and_env_names_keep_their_colons():
    assert parse_env_spec("webshop") == [("webshop", 1.0)]
    assert parse_env_spec("babyai:GoToObjS6") == [("babyai:GoToObjS6", 1.0)]
    assert parse_env_spec("gridworld:0.6, babyai:GoToObjS6:0.4") == [("gridworld", 0.6), ("babyai:GoToObjS6", 0.4)]
    cfg = load_config(TrainRunConfig, "grpo", [f"env.name=gridworld:3,{ARITHMETIC}"])
    assert is_mixture(cfg.env) and not is_mixture(load_config(TrainRunConfig, "grpo", ["env.name=gridworld"]).env)
    assert [(m.name, m.weight) for m in mix_members(cfg)] == [("gridworld", 0.75), (ARITHMETIC, 0.25)]


def test_each_env_of_a_mixture_keeps_its_own_settings_and_inherits_the_rest():
    cfg = load_config(
        TrainRunConfig,
        "grpo",
        [
            "env.max_turns=5",
            "env.demonstration=false",
            "plugins={gridworld: {size: 4}}",
            "env.mix=[{name: gridworld, max_turns: 2, reward: {goal: 2}, plugins: {gridworld: {walls: 0}}}, "
            f"{{name: '{ARITHMETIC}', weight: 3, demonstration: true}}]",
        ],
    )
    grid, arithmetic = mix_members(cfg)
    assert (grid.weight, grid.env.max_turns, grid.env.demonstration, grid.reward_weights) == (
        0.25,
        2,
        False,
        {"goal": 2},
    )
    assert grid.plugins["gridworld"] == {"size": 4, "walls": 0}  # merged over the run's block
    assert (arithmetic.env.max_turns, arithmetic.env.demonstration) == (5, True)
    assert arithmetic.reward_weights == dict(cfg.reward.weights)


@pytest.mark.parametrize(
    "setting, error, match",
    [
        (
            "env.name=gridworld:0,babyai:GoToObjS6",
            ConfigError,
            "'gridworld' has weight 0.0; a weight must be a positive",
        ),
        ("env.name=gridworld,gridworld:2", ConfigError, "'gridworld' is named twice"),
        ("env.name=gridworld,", ConfigError, "has an empty entry"),
        ("env.name=gridworld,gridwrld", UnknownNameError, "unknown env 'gridwrld'. Did you mean 'gridworld'"),
        ("env.mix=[{name: gridworld, maxturns: 1}]", ConfigError, "unknown key 'maxturns'; valid: name, weight"),
        ("env.mix=[3]", ConfigError, r"env.mix\[0\] is 3; each entry is an env name or a mapping"),
        # an entry's own keys are checked as env.* is: a max_turns of -3 played every episode for one turn
        ("env.mix=[{name: gridworld, max_turns: -3}]", ConfigError, r"env.mix\[0\].max_turns must be >= 0"),
        ("env.mix=[{name: gridworld, max_turns: 2.5}]", ConfigError, r"'env.mix\[0\].max_turns' expects int"),
        ("env.mix=[gridworld, {name: babyai:GoToObjS6, num_workers: abc}]", ConfigError, r"mix\[1\].num_workers"),
        ("env.mix=[{name: gridworld, demonstration: maybe}]", ConfigError, "'env.mix\\[0\\].demonstration' expects"),
        ("env.mix=[{name: gridworld, plugins: {gridworld: 3}}]", ConfigError, "plugins.gridworld must be a mapping"),
        ("env.mix=[{name: gridworld, reward: {goal: abc}}]", RewardError, "weight for 'goal' must be a finite number"),
        ("env.mix=[{name: gridworld, reward: {goal: .nan}}]", RewardError, "got nan"),
        (
            "env.mix=[{name: gridworld, reward: {nosuch: 1}}]",
            UnknownNameError,
            r"env.mix\[0\].reward \(gridworld\): unknown reward 'nosuch'",
        ),
        ("env.mix=['gridworld,babyai:GoToObjS6']", ConfigError, "names 2 envs; each entry names one env"),
        (
            "env.name=gridworld:1e308,babyai:GoToObjS6:1e308",
            ConfigError,
            r"weights \(gridworld:1e\+308, babyai:GoToObjS6:1e\+308\) add up past the largest number",
        ),
    ],
)
def test_a_bad_mixture_is_refused_naming_what_is_wrong(setting, error, match):
    with pytest.raises(error, match=match):
        mix_members(load_config(TrainRunConfig, "grpo", [setting]))


def test_two_names_of_one_mixture_are_the_same_envs_whatever_their_weights():
    assert same_envs(f"gridworld:0.7,{ARITHMETIC}:0.3", f"{ARITHMETIC}, gridworld")
    assert same_envs("babyai:GoToObjS6", "babyai:GoToObjS6:2")
    assert not same_envs("gridworld", f"gridworld,{ARITHMETIC}") and not same_envs(None, "gridworld")


def test_a_mixture_named_twice_is_refused():
    cfg = load_config(TrainRunConfig, "grpo", ["env.name=gridworld:1,babyai:GoToObjS6:1", "env.mix=[gridworld]"])
    with pytest.raises(ConfigError, match="name the mixture once"):
        mix_members(cfg)


def test_an_env_named_on_the_command_line_replaces_a_config_files_mixture(tmp_path):
    """`omrl rollout mix.yaml --env gridworld` plays gridworld: the YAML's env.mix was once played instead, silently."""
    config = tmp_path / "mix.yaml"
    config.write_text("env:\n  mix:\n    - {name: gridworld, weight: 1}\n    - {name: webshop, weight: 1}\n")
    for override, flags in (([], {"env.name": "textcraft"}), (["env.name=textcraft"], {})):
        cfg = load_config(RolloutRunConfig, config, override, flags)
        assert [m.name for m in mix_members(cfg)] == ["textcraft"]
    assert [m.name for m in mix_members(load_config(RolloutRunConfig, config))] == ["gridworld", "webshop"]


def _order(seed: int = 3) -> MixedTaskOrder:
    orders = {
        name: TaskOrder([EnvTask(name, "train", i) for i in range(size)], seed)
        for name, size in (("a", 5), ("b", 50), ("c", 7))
    }
    return MixedTaskOrder(orders, {"a": 0.5, "b": 0.3, "c": 0.2}, seed)


def test_the_drawn_mixture_matches_its_weights_over_many_steps():
    order = _order()
    steps = [[task.env for task in order.take(8)] for _ in range(500)]
    for step in steps:  # each step as close to the weights as 8 tasks allow: 4, 2.4 and 1.6 of them
        assert step.count("a") == 4 and step.count("b") in (2, 3) and step.count("c") in (1, 2), step
    drawn = [env for step in steps for env in step]
    for name, weight in (("a", 0.5), ("b", 0.3), ("c", 0.2)):
        share, se = drawn.count(name) / len(drawn), np.sqrt(weight * (1 - weight) / len(drawn))
        assert abs(share - weight) < 4 * se, (name, share)
    # each env's tasks come in its own shuffled passes: every task of a small env before any repeats
    a_tasks = [task.task for _ in range(1) for task in _order().take(40) if task.env == "a"]
    assert sorted(a_tasks[:5]) == list(range(5))


@pytest.mark.parametrize(
    "weights, per_step",
    [({"a": 0.5, "b": 0.3, "c": 0.2}, 3), ({"a": 0.4, "b": 0.3, "c": 0.2, "d": 0.1}, 2), ({"a": 0.5, "b": 0.5}, 3)],
)
def test_the_slots_left_over_are_drawn_by_exactly_the_fractions_left_over(weights, per_step):
    # with 2+ slots left, a weighted draw without replacement skews the mix (0.519/0.265/0.216 for
    # 0.5/0.3/0.2 at 3 a step); 20,000 steps put the shares within 0.005 of the weights
    orders = {name: TaskOrder([EnvTask(name, "train", i) for i in range(4)], 0) for name in weights}
    order, steps = MixedTaskOrder(orders, weights, seed=0), 20_000
    drawn = [task.env for _ in range(steps) for task in order.take(per_step)]
    assert len(drawn) == steps * per_step
    for name, weight in weights.items():
        assert drawn.count(name) / len(drawn) == pytest.approx(weight, abs=0.005), name


def test_a_mixed_task_order_resumes_where_it_stood_and_refuses_another_mixture():
    first, second = _order(), _order()
    first.take(8), first.take(8)
    state = first.state()
    second.load_state(state)
    assert [first.take(8) for _ in range(5)] == [second.take(8) for _ in range(5)]
    other = MixedTaskOrder({"a": TaskOrder([EnvTask("a", "train", 0)], 0)}, {"a": 1.0}, 0)
    with pytest.raises(ConfigError, match="this run mixes"):
        other.load_state(state)
    with pytest.raises(ConfigError, match="of a one-env run"):
        other.load_state(TaskOrder([1], 0).state())


class CountingBackend:
    """Wraps a backend and records how many prompts, and of which envs' episodes, each generate call had."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def generate(self, prompts, params, messages=None):
        self.calls.append([m[0]["content"][:40] for m in messages])
        return self.inner.generate(prompts, params, messages=messages)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_every_env_plays_in_one_batched_rollout_with_its_own_turn_cap_and_rewards(tiny_model_dir):
    cfg = load_config(
        RolloutRunConfig,
        None,
        [
            f"model.name={tiny_model_dir}",
            *SMALL,
            f"env.mix=[{{name: gridworld, max_turns: 3, reward: {{goal: 1, format: 0.5}}}}, '{ARITHMETIC}']",
        ],
    )
    with RolloutSession.from_config(cfg) as session:
        assert session.mixture and session.env_names == ["gridworld", ARITHMETIC]
        session.backend = spy = CountingBackend(session.backend)
        tasks = session.task_ids("test", 2)
        assert [(t.env, t.split) for t in tasks] == [("gridworld", "test")] * 2 + [(ARITHMETIC, "test")] * 2
        spy.take_stats()
        played = session.play(tasks, PlaySpec(group_size=2, seed=1))
        episodes, stats = played.episodes, spy.take_stats()
    assert [(ep.env, ep.group, ep.sample) for ep in episodes] == [
        (env, group, sample) for group, env in enumerate(["gridworld"] * 2 + [ARITHMETIC] * 2) for sample in range(2)
    ]
    assert len(spy.calls[0]) == 8 and len(set(spy.calls[0])) == 2  # both envs' episodes share the first call
    assert max(ep.num_turns for ep in episodes if ep.env == "gridworld") <= 3
    assert all(ep.num_turns == 1 for ep in episodes if ep.env == ARITHMETIC)  # the env's own cap
    assert all(ep.split == "test" for ep in episodes)
    grid = [ep for ep in episodes if ep.env == "gridworld"]
    assert all(set(ep.rewards) == {"goal", "format", "total"} for ep in grid)
    assert all(set(ep.rewards) == {"goal", "total"} for ep in episodes if ep.env == ARITHMETIC)
    format_mean = sum(sum(ep.rewards["format"]) for ep in grid) / len(grid)
    assert played.env_rewards["gridworld"]["format"] == pytest.approx(format_mean)
    assert played.rewards["format"] == pytest.approx(format_mean)  # over the envs that reward it
    # each turn records what the engine prefilled for it: per env, they add up to the backend's counts
    per_env = [prefill_counts([ep for ep in episodes if ep.env == env]) for env in ("gridworld", ARITHMETIC)]
    assert sum(c["prefill_tokens"] for c in per_env) == stats["prefill_computed"] > 0
    assert sum(c["prefill_reused"] for c in per_env) == stats["prefill_reused"] > 0  # later turns reuse KV


def test_an_env_of_a_mixture_draws_from_its_own_split(tiny_model_dir):
    cfg = load_config(
        RolloutRunConfig,
        None,
        [f"model.name={tiny_model_dir}", *SMALL, f"env.mix=[gridworld, {{name: '{ARITHMETIC}', split: test}}]"],
    )
    with RolloutSession.from_config(cfg, expert=True) as session:
        tasks = session.task_ids("train", 1)  # the run's split: each env's own
        assert [(t.env, t.split) for t in tasks] == [("gridworld", "train"), (ARITHMETIC, "test")]
        assert {t.split for t in session.task_ids("test", 1)} == {"test"}  # another split: as asked
        episodes = session.play(tasks, PlaySpec(expert=True)).episodes
    assert [(ep.env, ep.split) for ep in episodes] == [("gridworld", "train"), (ARITHMETIC, "test")]


def test_a_search_on_a_mixture_searches_each_env_and_keeps_the_tasks_order(tiny_model_dir):
    cfg = load_config(
        RolloutRunConfig,
        None,
        [f"model.name={tiny_model_dir}", *SMALL, "env.max_turns=2", f"env.name={ARITHMETIC}:1,gridworld:1"],
    )
    with RolloutSession.from_config(cfg) as session:
        tasks = [EnvTask("gridworld", "test", 1_000_000), EnvTask(ARITHMETIC, "test", 1_000_000)]
        tasks += [EnvTask("gridworld", "test", 1_000_001)]
        played = play_strategy(session, tasks, PlaySpec(split="test", strategy="best_of_n", budget=40))
        trees, episodes = played.trees, played.episodes
    assert [(tree.group, tree.task_id) for tree in trees] == [(0, 1_000_000), (1, 1_000_000), (2, 1_000_001)]
    assert {ep.group: ep.env for ep in episodes} == {0: "gridworld", 1: ARITHMETIC, 2: "gridworld"}
    assert set(played.env_rewards) == {"gridworld", ARITHMETIC}


def test_in_process_envs_step_on_the_loop_s_thread_and_io_bound_ones_on_their_own():
    import threading

    from omrl.rollout.loop import per_pool

    class Pool:
        def __init__(self, io_bound):
            self.io_bound = io_bound

    engine, another, server = Pool(False), Pool(False), Pool(True)
    items = [engine, server, another, engine, server]
    seen = per_pool(items, lambda pool: pool, lambda pool, some: [threading.current_thread().name] * len(some))
    here = threading.current_thread().name
    # an in-process engine may keep process-wide random state: never stepped from another thread
    assert seen[0] == seen[2] == seen[3] == here
    assert seen[1] == seen[4] != here  # a server's waits overlap the others'
    assert per_pool(items, lambda pool: pool, lambda pool, some: [id(pool)] * len(some)) == [id(p) for p in items]


def test_a_mixtures_reward_means_leave_out_the_episodes_that_measured_nothing():
    """docs: env_error episodes count in no mean; across envs and across dynamic sampling's draws too."""
    from omrl.data import Episode, Turn
    from omrl.rollout.session import SessionEnv
    from omrl.training.dynamic_sampling import merged_draws

    def episode(env, won, failed=False):
        turn = Turn("o", "Act: x", "x", True, 0.0, True)
        ep = Episode(env=env, task_id=0, split="train", instruction="", turns=[turn], won=won, score=float(won))
        if failed:
            ep.end_reason, ep.error = "env_error", "its server went down"
        return ep

    envs = [SessionEnv(name, None, None, "train", reward_weights={"goal": 1.0}) for name in ("a", "b")]
    session = RolloutSession(envs, tokenizer=None, backend=None, limits=None, mixture=True)
    won_a = [episode("a", True), episode("a", True)]
    played = session.compose([*won_a, episode("a", False, failed=True), episode("a", False, failed=True)])
    assert played.env_rewards["a"]["goal"] == 1.0
    both = session.compose([*won_a, episode("a", False, failed=True), *[episode("b", False) for _ in range(4)]])
    assert both.rewards["goal"] == pytest.approx(2 / 6)  # 6 episodes measured, 2 won: not 2 / 7
    drawn = merged_draws([played, session.compose([episode("b", False)])])
    assert drawn.rewards["goal"] == pytest.approx(2 / 3)  # the first draw's 2 failed episodes left out
