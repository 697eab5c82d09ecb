"""Which leaf a strategy answers with, where it decides what eval counts: never an episode the env
failed in over a real loss, its own rule even when the budget ends a roll-out, and a win as soon as
one is found."""

from __future__ import annotations

import pytest

from omrl.config import load_config
from omrl.config.options import EvalRunConfig
from omrl.evaluation import evaluate
from omrl.mixture import EnvTask
from omrl.rollout import PlaySpec, RolloutSession
from omrl.search import play_strategy
from omrl.search.fork import ForkError
from omrl.search.report import chosen_episodes, search_metrics
from omrl.search.sweep import cell_summary
from tests.fakes import ScriptedBackend, by_call
from tests.search.test_strategies import actions, search


def boom_or_smash(tokenizer):
    """Chest 0: the first sample of a call makes the env raise, the second smashes the chest (a
    real loss); the other chests: open, then take the key (won)."""

    def reply(call, i, prompt):
        if "chest 0" in tokenizer.decode(prompt):
            return "Action: boom" if i % 2 == 0 else "Action: smash"
        return "Action: open" if call == 0 else "Action: take key"

    return reply


@pytest.mark.parametrize(
    "strategy, options",
    [
        ("best_of_n", {"n": 2, "select": "env_reward"}),
        ("best_of_n", {"n": 2, "select": "logprob"}),
        ("best_of_n", {"n": 2, "select": "majority"}),
        ("beam", {"width": 1, "branch": 2, "stop_on_win": False, "select": "logprob"}),
        ("beam", {"width": 1, "branch": 2}),
        ("dfsdt", {"branch": 2}),
    ],
)
def test_a_real_loss_is_answered_over_an_env_error(tiny_tokenizer, strategy, options):
    """An env_error answer is left out of success, so choosing it over the loss beside it would
    count the task as not played and raise the success rate (here to 1.0)."""
    trees = search(
        tiny_tokenizer,
        ScriptedBackend(tiny_tokenizer, boom_or_smash(tiny_tokenizer)),
        strategy,
        options,
        tasks=(0, 1, 2, 3),
    )
    assert sorted(leaf.end for leaf in trees[0].leaves()) == ["done", "env_error"]
    assert actions(trees[0].chosen()) == ["smash"]
    assert evaluate(chosen_episodes(trees))["success_rate"] == 0.75


def test_mcts_answers_by_its_own_rule_when_the_budget_ends_a_roll_out(tiny_tokenizer):
    """Root candidates: open (goes on), smash, smash; the roll-out from open looks until the budget
    is spent. MCTS answers with a finished episode, not the budget-cut roll-out."""
    backend = ScriptedBackend(
        tiny_tokenizer, by_call(["Action: open", "Action: smash", "Action: smash"], ["Action: look"])
    )
    (tree,) = search(tiny_tokenizer, backend, "mcts", {"branch": 3, "iterations": 8}, budget=48)
    assert tree.exhausted and tree.best is not None
    assert actions(tree.chosen()) == ["smash"] and tree.chosen().end == "done"


class SureOfLooking(ScriptedBackend):
    """Scripted replies; the model is unsure of "take key" (log-prob -3 a token), sure of the rest."""

    def generate(self, prompts, params, messages=None):
        out = super().generate(prompts, params, messages)
        for gen in out:
            unsure = "take key" in self.tokenizer.decode(gen.token_ids)
            gen.logprobs = [-3.0 if unsure else -0.1] * len(gen.token_ids)
        return out


def test_dfsdt_stops_at_a_win_its_scorer_ranked_below_a_sibling(tiny_tokenizer):
    # root: open, open; below the first: take key (won) and look; then look forever
    backend = SureOfLooking(
        tiny_tokenizer,
        by_call(["Action: open", "Action: open"], ["Action: take key", "Action: look"], ["Action: look"]),
    )
    (tree,) = search(tiny_tokenizer, backend, "dfsdt", {"branch": 2, "scorer": "logprob"})
    assert backend.calls == [2, 2]  # no expansion after the one that found the win
    assert actions(tree.chosen()) == ["open", "take key"] and tree.chosen().won


def test_search_figures_leave_out_answers_the_env_failed_in_as_eval_does(tiny_tokenizer):
    """Chest 0 fails in the env on every chain, chests 1-3 are won: eval, the search metrics and a
    sweep cell all say 3 of 3 measured tasks were won, and one task failed in the env."""

    def reply(call, i, prompt):
        if "chest 0" in tiny_tokenizer.decode(prompt):
            return "Action: boom"
        return "Action: open" if call == 0 else "Action: take key"

    trees = search(tiny_tokenizer, ScriptedBackend(tiny_tokenizer, reply), "best_of_n", {"n": 2}, tasks=(0, 1, 2, 3))
    assert evaluate(chosen_episodes(trees))["success_rate"] == 1.0
    metrics = search_metrics(trees)
    assert metrics["success_rate"] == metrics["mean_score"] == 1.0 and metrics["env_errors"] == 1
    cell = cell_summary(trees, budget=None, seconds=1.0)
    assert (cell["success_rate"], cell["success_se"], cell["tasks"], cell["env_errors"]) == (1.0, 0.0, 4, 1)


def test_an_env_of_a_mixture_the_strategy_cannot_search_fails_before_any_env_is_searched(chest_plugins, tiny_tokenizer):
    """chest-plain cannot fork, so beam cannot search it: that is said before chest's searches run,
    not after them (hours, on a long eval, all thrown away)."""
    cfg = load_config(
        EvalRunConfig,
        None,
        ["env.name=chest,chest-plain", "env.template=chest-action", "model.name=tiny", "generation.temperature=1"],
    )
    backend = ScriptedBackend(tiny_tokenizer, lambda call, i, prompt: "Action: look")
    tasks = [EnvTask("chest", "test", 0), EnvTask("chest-plain", "test", 0)]
    with RolloutSession.from_config(cfg, backend=backend) as session:
        with pytest.raises(ForkError, match="env 'chest-plain' .* cannot copy one"):
            play_strategy(session, tasks, PlaySpec(split="test", strategy="beam"))
    assert backend.calls == []


def test_a_path_the_budget_cut_is_no_answer_over_a_finished_one_however_it_scored():
    """Beam answered with a cut path whose partial rewards beat a finished loss: the env's score as an oracle."""
    from omrl.data.trajectory import Turn
    from omrl.search.tree import Node
    from omrl_plugins.strategies.common import pick_answer
    from tests.helpers import an_episode

    def node(end, rewards):
        turns = [Turn("o", "r", "a", True, reward, False) for reward in rewards]
        return Node(id=len(rewards), parent=None, episode=an_episode(turns=turns), messages=[], answering="", end=end)

    lost, cut = node("done", [0.0, 0.0]), node("budget", [0.5, 0.5, 0.5])
    assert pick_answer([cut, lost]) is lost and pick_answer([lost, cut]) is lost
    assert pick_answer([cut]) is cut  # nothing finished: the cut path is all there is
