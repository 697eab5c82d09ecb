"""Reward functions, the reward composer and reward allocation to tokens, on hand-made episodes."""

from __future__ import annotations

import doctest
import importlib
import math
import sys
import warnings

import numpy as np
import pytest

from omrl import registry
from omrl.data import Episode, Turn
from omrl.errors import ConfigError, OmrlError, UnknownNameError
from omrl.hookspecs import hookimpl
from omrl.rewards import (
    ALLOCATION_MODES,
    RewardError,
    ZeroRewardWarning,
    allocate_rewards,
    compose_rewards,
    episode_reward,
)


def turn(
    response="Think: go\nAct: up", action="up", format_ok=True, reward=0.0, done=False, info=None, span=(0, 0)
) -> Turn:
    return Turn("obs", response, action, format_ok, reward, done, info or {}, span)


def episode(*turns: Turn, won=False, score=0.0, **fields) -> Episode:
    return Episode(
        env="fake",
        task_id=fields.pop("task_id", 0),
        split="train",
        instruction="do it",
        turns=list(turns),
        won=won,
        score=score,
        **fields,
    )


def reward(name: str):
    return registry.rewards.get(name)


def answered(action: str, **info) -> Episode:
    return episode(turn(action="look"), turn(action=action, done=True, info=info))


# --- built-in rewards ---------------------------------------------------------------------------


def test_builtin_rewards_register_through_the_entry_point():
    expected = {"goal", "format", "length_penalty", "tag_count", "exact_match", "accuracy", "bleu", "process"}
    assert expected <= set(registry.rewards.names())
    assert all(registry.rewards.component(name).distribution == "omrl" for name in expected)


@pytest.mark.parametrize("module", ["omrl.rewards", "omrl_plugins.rewards.outcome", "omrl_plugins.rewards.shaping"])
def test_docstring_examples_hold(module):
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0


def test_goal_reads_won_and_score_from_the_episode():
    won = episode(turn(), turn(done=True), won=True, score=0.2)
    partial = episode(turn(done=True), score=0.75)
    # the last step's info says 1.0, but only Episode.score/won count (what the rollout copied)
    stale_info = episode(turn(done=True, info={"score": 1.0, "won": True}), score=0.0)
    assert reward("goal")([won, partial, stale_info, episode()]) == [[0.0, 1.0], [0.75], [0.0], []]
    assert reward("goal")([won, partial], binary=True) == [[0.0, 1.0], [0.0]]


def test_format_is_per_turn_and_normalised_by_default():
    ep = episode(turn(format_ok=True), turn(format_ok=False), turn(format_ok=True), turn(format_ok=True))
    assert reward("format")([ep, episode()]) == [[0.25, 0.0, 0.25, 0.25], []]
    assert reward("format")([ep], normalize=False) == [[1.0, 0.0, 1.0, 1.0]]


def test_tag_count_gives_partial_credit_per_tag():
    ep = episode(
        turn("<think>a</think><action>up</action>"),
        turn("<think>a</think><think>b</think><action>up"),
        turn("no tags at all"),
    )
    assert reward("tag_count")([ep], template="xml", normalize=False) == [[1.0, 0.25, 0.0]]  # only <action> once
    react = episode(turn("Think: a\nAct: up"), turn("Act: up\nAct: down"), turn("ReAct: up"))
    assert reward("tag_count")([react], normalize=False) == [[1.0, 0.0, 0.0]]
    assert reward("tag_count")([react]) == [[pytest.approx(1 / 3), 0.0, 0.0]]
    assert reward("tag_count")([ep], tags=["<action>"], normalize=False) == [[1.0, 1.0, 0.0]]
    with pytest.raises(RewardError, match="template 'json'.*react, tool_call, xml"):
        reward("tag_count")([ep], template="json")


def test_length_penalty_counts_model_tokens_beyond_the_budget():
    # turn 0: 3 model tokens; turn 1: 6 tokens in its span, of which 5 are model tokens
    ep = episode(
        turn(span=(1, 4)),
        turn(span=(5, 11), done=True),
        token_ids=list(range(11)),
        loss_mask=[0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0],
    )
    assert reward("length_penalty")([ep], budget=4, per_token=0.1) == [[0.0, pytest.approx(-0.1)]]
    assert reward("length_penalty")([ep], budget=4, per_token=0.1, scope="episode") == [[0.0, pytest.approx(-0.4)]]
    assert reward("length_penalty")([ep], budget=100) == [[0.0, 0.0]]
    with pytest.raises(RewardError, match="scope 'step'.*turn, episode"):
        reward("length_penalty")([ep], scope="step")
    with pytest.raises(RewardError, match="no token ids"):
        reward("length_penalty")([episode(turn())])


def test_process_adds_step_rewards_and_penalises_invalid_actions():
    ep = episode(turn(reward=0.5), turn(reward=0.0, info={"invalid": True}), turn(action=None), turn(reward=1.0))
    assert reward("process")([ep]) == [[0.5, 0.0, 0.0, 1.0]]
    assert reward("process")([ep], invalid_penalty=0.2) == [[0.5, -0.2, -0.2, 1.0]]


def test_exact_match_normalises_and_unwraps_answer_actions():
    eps = [
        answered("answer[The Eiffel Tower!]", ground_truth="eiffel tower"),
        answered("finish(Paris)", answer=["London", "paris"]),
        answered("answer[Paris, France]", ground_truth="Paris"),
        episode(turn(action=None, done=True, info={"answer": "Paris"})),
        episode(),
    ]
    assert reward("exact_match")(eps) == [[0.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.0], []]


@pytest.mark.parametrize(
    "answer,truth,expected",
    [
        ("-3", "3", False),  # a sign, a point, a slash or a comma makes another number
        ("3", "-3", False),
        ("3.5", "35", False),
        ("20.24", "2024", False),
        ("1/2", "12", False),
        ("10,00", "1000", False),
        ("x = -3", "x = 3", False),
        ("\u22123", "-3", True),  # a typographic minus
        ("- 5", "-5", True),
        ("1,000", "1000", True),  # thousands grouped by commas
        ("2,024", "2024", True),
        ("+7.50", "7.5", True),
        ("$5", "5", True),
        ("1/2", "1/2", True),
        ("The Eiffel-Tower!", "eiffel tower", False),  # SQuAD's rules for words stay
        ("The Eiffel-Tower!", "eiffeltower", True),
        ("covid-19", "covid19", True),
        ("an apple, a pear.", "apple pear", True),
    ],
)
def test_exact_match_keeps_the_punctuation_that_makes_a_number(answer, truth, expected):
    assert reward("exact_match")([answered(f"answer[{answer}]", ground_truth=truth)]) == [[0.0, float(expected)]]


def test_accuracy_accepts_numbers_and_contained_phrases():
    eps = [
        answered("answer[There are 1,200 files]", answer=1200),
        answered("answer[3.50]", ground_truth="3.5"),
        answered("answer[12 or 13]", ground_truth="12"),
        answered("answer[Paris, France]", ground_truth="paris"),
        answered("answer[Parisian food]", ground_truth="paris"),
    ]
    assert [values[-1] for values in reward("accuracy")(eps)] == [1.0, 1.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize("name", ["exact_match", "accuracy", "bleu"])
def test_answer_rewards_without_a_ground_truth_raise_naming_the_reward(name):
    no_truth = answered("answer[Paris]", score=1.0)
    with pytest.raises(RewardError, match=f"reward '{name}'.*'ground_truth' or 'answer'.*'score'"):
        reward(name)([no_truth])


def test_bleu_scales_sentence_bleu_to_unit_range():
    eps = [
        answered("answer[the cat sat on the mat]", ground_truth="the cat sat on the mat"),
        answered("answer[the cat sat on a red mat today]", ground_truth="the cat sat on the mat"),
        answered("answer[completely unrelated words]", ground_truth="the cat sat on the mat"),
    ]
    perfect, partial, unrelated = (values[-1] for values in reward("bleu")(eps))
    assert perfect == 1.0 and 0.0 < partial < 1.0 and unrelated == 0.0


def test_bleu_without_sacrebleu_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "sacrebleu", None)  # makes `import sacrebleu` fail
    with pytest.raises(RewardError, match=r"omrl\[bleu\]"):
        reward("bleu")([answered("answer[x]", ground_truth="x")])


def test_episode_reward_puts_the_scalar_on_the_last_turn():
    @episode_reward
    def turns_used(ep, scale=1.0):
        """Turn count times scale."""
        return len(ep.turns) * scale

    assert turns_used([episode(turn(), turn(), turn()), episode()], scale=0.5) == [[0.0, 0.0, 1.5], []]
    assert turns_used.__doc__ == "Turn count times scale."


# --- the composer -------------------------------------------------------------------------------


class FakeRewards:
    """Rewards that misbehave in each way the composer must catch."""

    @hookimpl
    def register_rewards(self, register):
        register("one_per_turn", lambda episodes, value=1.0: [[value] * len(ep.turns) for ep in episodes])
        register("numpy_per_turn", lambda episodes: [np.full(len(ep.turns), 0.5) for ep in episodes])
        register("too_few_episodes", lambda episodes: [[0.0] * len(ep.turns) for ep in episodes[1:]])
        register("too_few_turns", lambda episodes: [[0.0] for ep in episodes])
        register("not_finite", lambda episodes: [[math.nan] * len(ep.turns) for ep in episodes])
        register("not_a_number", lambda episodes: [["1.0"] * len(ep.turns) for ep in episodes])
        register("past_floats", lambda episodes: [[10**400] * len(ep.turns) for ep in episodes])
        register("none_per_episode", episode_reward(lambda ep: None))
        register("won_bool", episode_reward(lambda ep: ep.won))
        register("numpy_bool", episode_reward(lambda ep: np.bool_(False)))

        def gives_up_silently(episodes):  # ends the episodes as env_error, saying nothing of why
            for ep in episodes:
                ep.end_reason, ep.error = "env_error", None
            return [[0.0] * len(ep.turns) for ep in episodes]

        register("gives_up_silently", gives_up_silently)

        def service_down(episodes):
            raise ConnectionError("the scoring service is down")

        register("service_down", service_down)


@pytest.fixture
def fake_rewards(register_plugin):
    register_plugin(FakeRewards(), name="fake-rewards")


def test_compose_stores_components_and_the_weighted_total(fake_rewards):
    eps = [
        episode(turn(format_ok=True), turn(format_ok=False, done=True), won=True),
        episode(turn(format_ok=True, done=True), score=0.5),
        episode(),
    ]
    # options as in a run config's plugins block: the env's own options are not for the rewards
    means = compose_rewards(
        eps,
        {"goal": 2.0, "format": 1.0, "one_per_turn": -0.5},
        options={"format": {"normalize": False}, "one_per_turn": {"value": 0.2}, "webshop": {"catalog": "items.json"}},
    )
    assert eps[0].rewards == {
        "goal": [0.0, 1.0],
        "format": [1.0, 0.0],
        "one_per_turn": [0.2, 0.2],
        "total": [pytest.approx(0.9), pytest.approx(1.9)],
    }
    assert eps[1].rewards["total"] == [pytest.approx(1.9)]
    assert eps[2].rewards == {"goal": [], "format": [], "one_per_turn": [], "total": []}
    assert means == pytest.approx({"goal": 0.5, "format": 2 / 3, "one_per_turn": 0.2, "total": 4.7 / 3})
    assert eps[0].total_reward == pytest.approx(2.8)


@pytest.mark.parametrize(
    "bad, message",
    [
        ("too_few_episodes", r"reward 'too_few_episodes' returned 1 lists for 2 episodes"),
        ("too_few_turns", r"reward 'too_few_turns' gave episode 1 \(env 'fake', task 7\) 1 values for its 2 turns"),
        ("not_finite", r"reward 'not_finite' gave episode 0 .* turn 0 the value nan"),
        ("not_a_number", r"reward 'not_a_number' gave episode 0 .* the value '1.0'"),
        ("past_floats", r"reward 'past_floats' gave episode 0 .* turn 0 the value 1000000"),
        ("none_per_episode", r"reward 'none_per_episode' gave episode 0 .* turn 0 the value None; expected a finite"),
        (  # where in the plugin: its author looks there first
            "service_down",
            r"reward 'service_down' raised ConnectionError: the scoring service is down \(in plugin 'fake-rewards' "
            r"\(-\) at .*test_rewards.py:\d+\)",
        ),
    ],
)
def test_compose_rejects_wrong_shapes_naming_the_reward_and_writes_nothing(fake_rewards, bad, message):
    eps = [episode(turn(done=True), won=True), episode(turn(), turn(done=True), task_id=7)]
    with pytest.raises(RewardError, match=message):
        compose_rewards(eps, {"goal": 1.0, bad: 1.0})
    assert all(ep.rewards == {} for ep in eps)


def test_finite_values_whose_weighted_total_overflows_are_refused_naming_each_part(fake_rewards):
    """It was trained on as inf, and the run blamed the gradients."""
    eps = [episode(turn(done=True), won=True)]
    with pytest.raises(RewardError, match=r"weighted reward of episode 0 .* turn 0 is inf \(goal 1 x 1 \+ "
                                          r"one_per_turn 1e\+300 x 1e\+30\): too large for a float"):  # fmt: skip
        compose_rewards(eps, {"goal": 1.0, "one_per_turn": 1e300}, {"one_per_turn": {"value": 1e30}})
    assert eps[0].rewards == {}


def test_an_episode_a_reward_ends_without_a_reason_is_named_for_the_reward(fake_rewards):
    eps = [episode(turn(done=True), won=True)]
    compose_rewards(eps, {"goal": 1.0, "gives_up_silently": 1.0})
    assert eps[0].error == "reward 'gives_up_silently': it could not score the episode"


def test_a_reward_may_give_each_episode_a_numpy_array(fake_rewards):
    eps = [episode(turn(), turn(done=True))]
    compose_rewards(eps, {"numpy_per_turn": 1.0})
    assert eps[0].rewards["numpy_per_turn"] == [0.5, 0.5] and type(eps[0].rewards["numpy_per_turn"][0]) is float


def test_compose_rejects_bad_configuration():
    eps = [episode(turn(done=True))]
    with pytest.raises(UnknownNameError, match="unknown reward 'gaol'.*Did you mean 'goal'"):
        compose_rewards(eps, {"gaol": 1.0})
    with pytest.raises(ConfigError, match="reward 'goal' does not take options.*its options: binary"):
        compose_rewards(eps, {"goal": 1.0}, options={"goal": {"strict": True}})
    with pytest.raises(ConfigError, match=r"reward 'goal' option binary='false' is invalid; valid: true or false"):
        compose_rewards(eps, {"goal": 1.0}, options={"goal": {"binary": "false"}})  # quoted: no false
    with pytest.raises(
        ConfigError, match=r"reward 'length_penalty' option budget='abc' is invalid; valid: a whole number"
    ):
        compose_rewards(eps, {"length_penalty": 1.0}, options={"length_penalty": {"budget": "abc"}})
    with pytest.raises(RewardError, match="'total' is the composed reward"):
        compose_rewards(eps, {"total": 1.0})
    with pytest.raises(RewardError, match="weight for 'goal' must be a finite number"):
        compose_rewards(eps, {"goal": float("inf")})
    with pytest.raises(RewardError, match="no reward components"):
        compose_rewards(eps, {})
    assert issubclass(RewardError, OmrlError)


def test_compose_warns_when_a_whole_batch_scores_zero():
    losers = [episode(turn(done=True), task_id=i) for i in range(8)]
    with pytest.warns(ZeroRewardWarning, match="all rewards are 0 over 8 episodes of fake .*check the env's score"):
        compose_rewards(losers, {"goal": 1.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compose_rewards(losers[:7], {"goal": 1.0})  # too few to tell
        compose_rewards(losers, {"goal": 0.0})  # nothing is trained on
        compose_rewards(losers[:7] + [episode(turn(done=True), won=True)], {"goal": 1.0})
        failed = [episode(turn(done=True), task_id=i) for i in range(8)]
        for ep in failed:  # the env failed: no reward measured anything, so this is no zero-reward batch
            ep.end_reason = "env_error"
        compose_rewards(failed, {"goal": 1.0})
        turnless = [episode(task_id=i, won=True) for i in range(8)]  # games another seat ended before a move
        compose_rewards(losers[:7] + turnless, {"goal": 1.0})  # they scored nothing: 7 scored, too few to tell


# --- allocation to tokens -----------------------------------------------------------------------

#            prompt | turn 0 | obs  | turn 1  | obs | turn 2 (+ an unmasked end token)
MASK = [0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 0]
SPANS = [(3, 5), (7, 10), (11, 14)]


def three_turns(totals: list[float], spans=SPANS, mask=MASK) -> Episode:
    turns = [turn(span=span, done=i == len(spans) - 1) for i, span in enumerate(spans)]
    return episode(
        *turns, token_ids=list(range(100, 100 + len(mask))), loss_mask=list(mask), rewards={"total": list(totals)}
    )


def test_last_token_puts_the_sum_on_the_last_model_token():
    assert allocate_rewards(three_turns([0.5, -0.25, 1.0]), "last_token") == [0.0] * 12 + [1.25, 0.0]


def test_per_turn_puts_each_reward_on_its_turns_last_model_token():
    expected = [0, 0, 0, 0, 0.5, 0, 0, 0, 0, -0.25, 0, 0, 1.0, 0]
    assert allocate_rewards(three_turns([0.5, -0.25, 1.0]), "per_turn") == expected


def test_uniform_positive_spreads_a_positive_sum_and_blames_a_negative_one_on_the_last_token():
    spread = allocate_rewards(three_turns([0.5, -0.25, 1.0]), "uniform_positive")
    share = 1.25 / 7
    assert spread == pytest.approx([0, 0, 0, share, share, 0, 0, share, share, share, 0, share, share, 0])
    assert allocate_rewards(three_turns([0.0, 0.0, -1.0]), "uniform_positive") == [0.0] * 12 + [-1.0, 0.0]


def test_discounted_walks_turns_backwards():
    values = allocate_rewards(three_turns([0.5, -0.25, 1.0]), "discounted", gamma=0.5)
    last, middle, first = 1.25 / 2, 1.25 * 0.5**2 / 3, 1.25 * 0.5**2 * 0.5**3 / 2
    assert values == pytest.approx([0, 0, 0, first, first, 0, 0, middle, middle, middle, 0, last, last, 0])
    # with gamma 1 every turn's tokens carry the whole reward: the episode sum is not preserved
    assert sum(allocate_rewards(three_turns([0.5, -0.25, 1.0]), "discounted")) == pytest.approx(3 * 1.25)


@pytest.mark.parametrize("mode", ["last_token", "uniform_positive", "per_turn"])
@pytest.mark.parametrize("totals", [[0.5, -0.25, 1.0], [0.0, -2.0, 0.5], [0.0, 0.0, 0.0]])
def test_sums_are_preserved_and_only_model_tokens_get_rewards(mode, totals):
    values = allocate_rewards(three_turns(totals), mode)
    assert len(values) == len(MASK)
    assert sum(values) == pytest.approx(sum(totals))
    assert all(v == 0.0 for v, m in zip(values, MASK) if not m)


def test_a_turn_without_model_tokens_hands_its_reward_back():
    empty_middle = three_turns([0.5, 0.25, 1.0], spans=[(3, 5), (5, 5), (7, 10)], mask=[0, 0, 0, 1, 1, 0, 0, 1, 1, 1])
    assert allocate_rewards(empty_middle, "per_turn") == [0, 0, 0, 0, 0.75, 0, 0, 0, 0, 1.0]
    empty_first = three_turns([0.5, 0.25, 1.0], spans=[(3, 3), (3, 5), (7, 10)], mask=[0, 0, 0, 1, 1, 0, 0, 1, 1, 1])
    assert allocate_rewards(empty_first, "per_turn") == [0, 0, 0, 0.5, 0.25, 0, 0, 0, 0, 1.0]  # first model token
    no_tokens = three_turns([1.0, 1.0, 1.0], mask=[0] * 14)
    assert allocate_rewards(no_tokens, "last_token") == [0.0] * 14


def test_allocation_rejects_bad_input():
    with pytest.raises(
        RewardError, match="unknown reward allocation 'first_token'; valid: " + ", ".join(ALLOCATION_MODES)
    ):
        allocate_rewards(three_turns([0, 0, 1]), "first_token")
    with pytest.raises(RewardError, match=r"gamma must be a number in \[0, 1\]"):
        allocate_rewards(three_turns([0, 0, 1]), "discounted", gamma=1.5)
    with pytest.raises(RewardError, match="call omrl.rewards.compose_rewards"):
        allocate_rewards(episode(turn()), "last_token")
    with pytest.raises(RewardError, match="2 total rewards for 3 turns"):
        allocate_rewards(three_turns([0, 1]), "last_token")
    with pytest.raises(RewardError, match=r"span \(11, 15\)"):
        allocate_rewards(three_turns([0, 0, 1], spans=[(3, 5), (7, 10), (11, 15)]), "per_turn")
    with pytest.raises(RewardError, match=r"span \(4, 6\); spans must be \[start, end\) in order"):
        allocate_rewards(three_turns([0, 0, 1], spans=[(3, 5), (4, 6), (11, 14)]), "per_turn")
    short_mask = three_turns([0, 0, 1])
    short_mask.loss_mask.pop()
    with pytest.raises(RewardError, match="13 loss-mask values for 14 token ids"):
        allocate_rewards(short_mask, "per_turn")


def test_compose_then_allocate_end_to_end():
    ep = three_turns([0.0, 0.0, 0.0])
    ep.rewards = {}
    ep.won = True
    ep.turns[0].format_ok = False
    compose_rewards([ep], {"goal": 1.0, "format": 0.3})
    assert ep.rewards["total"] == pytest.approx([0.0, 0.1, 1.1])
    assert sum(allocate_rewards(ep, "uniform_positive")) == pytest.approx(1.2)


def test_an_episode_reward_may_return_whether_the_episode_was_won(fake_rewards):
    """A bool (or numpy's) counts as 1.0 or 0.0, as it did before the composer named a None or a text."""
    won = [episode(turn(done=True), won=True), episode(turn(done=True))]
    compose_rewards(won, {"won_bool": 1.0, "numpy_bool": 1.0})
    assert [ep.rewards["total"] for ep in won] == [[1.0], [0.0]]
