"""``tag_count`` counts the tags of the run's action template (its ``reply_tags``, which the session passes),
not react's: an xml run's well-formed replies earn the full share; ``plugins.tag_count.template`` and
``tags`` still choose others."""

from __future__ import annotations

import pytest

from omrl import registry
from omrl.data import Episode, Turn, read_episodes
from omrl.rewards import RewardError
from omrl.rollout.session import compose_rewards
from omrl.templates import reward_options
from tests.helpers import cli_exit

XML_REPLY = "<think>go up</think>\n<action>up</action>"
REACT_REPLY = "Think: go up\nAct: up"


def template(name: str, **options):
    return registry.templates.get(name)(**options)


def episode(*responses: str) -> Episode:
    turns = [Turn("obs", text, "up", True, 0.0, False) for text in responses]
    return Episode(env="fake", task_id=0, split="train", instruction="", turns=turns)


def tag_count(ep: Episode, options: dict | None = None, run_template=None) -> list[float]:
    compose_rewards([ep], {"tag_count": 1.0}, {"tag_count": options or {}}, run_template)
    return ep.rewards["tag_count"]


def test_each_built_in_template_declares_the_tags_its_replies_hold():
    assert template("react").reply_tags == (r"^Think:", r"^Act:")
    assert template("xml").reply_tags == ("<think>", "</think>", "<action>", "</action>")
    assert template("tool_call").reply_tags == ("<tool_call>", "</tool_call>")
    assert template("tool_call", format="llama3").reply_tags == ()  # bare JSON: no tags


@pytest.mark.parametrize(
    ("name", "reply"),
    [
        ("xml", XML_REPLY),
        ("react", REACT_REPLY),
        ("tool_call", '<tool_call>\n{"name": "up", "arguments": {}}\n</tool_call>'),
    ],
)
def test_a_well_formed_reply_of_the_runs_template_earns_the_full_share(name, reply):
    assert tag_count(episode(reply, "no tags"), {"normalize": False}, template(name)) == [1.0, 0.0]


@pytest.mark.parametrize("name", ["react", "xml"])
def test_the_run_templates_tags_are_all_in_what_its_format_action_writes(name):
    run = template(name)
    assert tag_count(episode(run.format_action("up", None, "go up")), {"normalize": False}, run) == [1.0]


def test_the_template_option_and_literal_tags_still_win_over_the_runs_template():
    xml = template("xml")
    assert tag_count(episode(REACT_REPLY), {"template": "react", "normalize": False}, xml) == [1.0]
    assert tag_count(episode(XML_REPLY), {"template": "react", "normalize": False}, xml) == [0.0]
    assert tag_count(episode(XML_REPLY), {"tags": ["<action>", "<tool_call>"], "normalize": False}, xml) == [0.5]


def test_only_a_reward_that_takes_reply_tags_gets_them():
    options = reward_options(template("xml"), ["tag_count", "format", "goal"], {"format": {"normalize": False}})
    assert options == {
        "tag_count": {"reply_tags": ["<think>", "</think>", "<action>", "</action>"]},
        "format": {"normalize": False},
        "goal": {},
    }
    assert reward_options(None, ["tag_count"], {}) == {"tag_count": {}}  # no run template: react's, as called alone


def test_a_run_template_without_tags_scores_0_and_says_so_never_reacts_tags():
    llama3 = template("tool_call", format="llama3")
    with pytest.warns(UserWarning, match=r"tag_count' scores 0: this run's action template expects no tags.*tags="):
        assert tag_count(episode(REACT_REPLY, XML_REPLY), {"normalize": False}, llama3) == [0.0, 0.0]
    assert tag_count(episode(REACT_REPLY), {"tags": ["Act:"], "normalize": False}, llama3) == [1.0]


def test_a_named_template_without_tags_is_refused_naming_the_ones_with_tags(register_plugin):
    from tests.fakes import ActionTemplate, Registers

    register_plugin(Registers({}, {"untagged": ActionTemplate}), name="untagged-template")
    with pytest.raises(RewardError, match=r"template 'untagged' expects none .*one of react, tool_call, xml"):
        tag_count(episode(XML_REPLY), {"template": "untagged"})


def test_omrl_rollout_with_the_xml_template_pays_its_tags(tmp_path, capsys):
    out = tmp_path / "xml.parquet"
    words = ["rollout", "--env", "gridworld", "--template", "xml", "--expert", "--num-tasks", "2", "--model", "tiny"]
    code, stdout, stderr = cli_exit(capsys, *words, "reward.weights={tag_count: 1}", "-o", str(out))
    assert code in (0, None), stdout + stderr
    for ep in read_episodes(out):
        assert ep.turns and sum(ep.rewards["tag_count"]) == pytest.approx(1.0)  # every reply: all four tags once


# a Qwen3-style reply: reasoning that drafts the format, then the answer in it
THINKING_REACT = "<think>\nThink: maybe left?\nAct: left\nNo, up.\n</think>\n\nThink: go up\nAct: up"


def test_tags_in_a_thinking_models_reasoning_are_not_counted():
    """The react template reads the answer after a reasoning block (``Template.answer``); the rollout records
    where it starts, and ``tag_count`` counts there: the drafted lines in the reasoning are no second tags."""
    from omrl.models import load_model
    from omrl.rollout import EnvPool, RolloutLimits, collect
    from tests.chat.thinking import ForcedBackend

    model, tokenizer = load_model("tiny")
    react = template("react")
    pool = EnvPool(registry.envs.get("gridworld"), {}, name="gridworld")
    (ep,) = collect(
        pool,
        react,
        tokenizer,
        [0],
        backend=ForcedBackend(model, tokenizer, lambda call, index, prompt: THINKING_REACT),
        limits=RolloutLimits(max_new_tokens=64, max_context=2048, max_turns=1),
    )
    turn = ep.turns[0]
    assert turn.response.strip() == THINKING_REACT and turn.action == "up"
    assert turn.answer == "\n\nThink: go up\nAct: up"
    assert tag_count(ep, {"normalize": False}, react) == [1.0]
    xml = template("xml")  # its own <think> tag: a leading block is its thought, counted
    assert xml.answer(XML_REPLY) == XML_REPLY


def test_the_tool_call_template_reads_the_call_after_a_thinking_models_reasoning():
    """A reasoning block that weighs a call (``left``) before the reply makes another (``up``): the action is
    the one made, exactly formatted, and ``tag_count`` counts the answer's tags once."""
    env = registry.envs.get("gridworld")()
    tool_call = template("tool_call")
    call = '<tool_call>{{"name": "move", "arguments": {{"direction": "{}"}}}}</tool_call>'
    reply = f"<think>\nmaybe {call.format('left')}? No.\n</think>\n\n{call.format('up')}"
    parsed = tool_call.parse(reply, env)
    assert (parsed.action, parsed.format_ok) == ("up", True)
    assert tool_call.answer(reply) == f"\n\n{call.format('up')}"
    turn = Turn("obs", reply, "up", True, 0.0, False, info={"answer_from": len(reply) - len(tool_call.answer(reply))})
    ep = Episode(env="fake", task_id=0, split="train", instruction="", turns=[turn])
    assert tag_count(ep, {"normalize": False}, tool_call) == [1.0]
