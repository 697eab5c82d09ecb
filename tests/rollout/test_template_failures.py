"""A broken action template is the world's failure, not the model's: a ``parse`` that raises or answers
outside the protocol, or an expert's ``format_action`` that writes no text, ends the episode as env_error
naming the template; the model is never told, and the episode is never trained on or scored."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from omrl.evaluation import evaluate
from omrl.hookspecs import hookimpl
from omrl.rollout import EnvPool, RolloutLimits, collect
from omrl.templates import ParsedAction
from tests.fakes import ActionTemplate, KeyEnv, Registers, ScriptedBackend
from tests.helpers import cli_exit, keys_rollout


class RaisingTemplate(ActionTemplate):
    """A template with a bug: replies starting with "[" make its parse raise."""

    def parse(self, response, env):
        if response.startswith("["):
            raise IndexError("list index out of range")
        return super().parse(response, env)


class TextTemplate(ActionTemplate):
    """Its parse returns the action as text, not a ParsedAction."""

    def parse(self, response, env):
        return "open"


class NumberActionTemplate(ActionTemplate):
    """Its parse returns a ParsedAction whose action is no text."""

    def parse(self, response, env):
        return ParsedAction(5, True)  # type: ignore[arg-type]


class MidAnswerTemplate(ActionTemplate):
    """Its answer is not the end of the reply it was given."""

    def answer(self, response):
        return response[:3]


class SilentTemplate(ActionTemplate):
    """Its format_action returns None, so an expert's reply has no text."""

    def format_action(self, action, env, thought=""):
        return None


def play(tokenizer, template, replies, tasks=(0,)):
    pool = EnvPool(KeyEnv, name="keys")
    backend = ScriptedBackend(tokenizer, lambda call, index, prompt: replies[call])
    limits = RolloutLimits(max_new_tokens=24, max_context=1024)
    return collect(pool, template, tokenizer, list(tasks), backend=backend, limits=limits), pool


def test_a_template_that_raises_on_a_reply_ends_the_episode_as_env_error(tiny_tokenizer):
    (ep,), pool = play(tiny_tokenizer, RaisingTemplate(), ["[ oops", "Action: open", "Action: take key"])
    assert ep.end_reason == "env_error" and ep.num_turns == 1
    assert ep.error == "template RaisingTemplate's parse raised IndexError: list index out of range"
    assert ep.turns[0].parse_error is None and not ep.turns[0].format_ok  # never the model's format error
    assert not any("RaisingTemplate" in str(m["content"]) for m in ep.messages)  # the model is never told
    assert pool.probe().steps == 0
    assert evaluate([ep])["env_errors"] == 1


@pytest.mark.parametrize(
    ("template", "why"),
    [
        (TextTemplate(), "template TextTemplate's parse returned a str; it must return a ParsedAction"),
        (NumberActionTemplate(), "template NumberActionTemplate's parse returned action 5; it must be text or None"),
        (
            MidAnswerTemplate(),
            "template MidAnswerTemplate's answer returned 'Act'; it must be the end of the reply it was given",
        ),
    ],
)
def test_a_template_whose_parse_answers_outside_the_protocol_ends_the_episode_as_env_error(
    tiny_tokenizer, template, why
):
    (ep,), pool = play(tiny_tokenizer, template, ["Action: open"])
    assert (ep.end_reason, ep.error) == ("env_error", why)
    assert pool.probe().steps == 0


def test_a_broken_templates_turn_is_not_counted_as_the_models_format_error(tiny_tokenizer):
    # call 0 asks both episodes (the first breaks the template, the second has no action); then the second alone
    replies = {(0, 0): "[ oops", (0, 1): "no action here", (1, 0): "Action: open", (2, 0): "Action: take key"}
    pool, limits = EnvPool(KeyEnv, name="keys"), RolloutLimits(max_new_tokens=24, max_context=1024)
    backend = ScriptedBackend(tiny_tokenizer, lambda call, index, prompt: replies[call, index])
    episodes = collect(pool, RaisingTemplate(), tiny_tokenizer, [0, 1], backend=backend, limits=limits)
    assert [ep.end_reason for ep in episodes] == ["env_error", "done"]
    assert evaluate(episodes)["format_error_rate"] == pytest.approx(1 / 3)  # the model's one bad reply of 3


def test_a_working_parse_is_untouched(tiny_tokenizer):
    (ep,), _ = play(tiny_tokenizer, RaisingTemplate(), ["Action: open", "Action: take key"])
    assert ep.won and ep.end_reason == "done" and ep.error is None


def test_an_expert_reply_the_template_writes_no_text_for_is_an_env_error_naming_the_template(tiny_tokenizer):
    episodes = collect(EnvPool(KeyEnv, name="keys"), SilentTemplate(), tiny_tokenizer, [0, 1], expert=True)
    assert [ep.end_reason for ep in episodes] == ["env_error", "env_error"]
    assert episodes[0].error == (
        "template SilentTemplate's format_action returned None for action 'open'; it must return the reply's text"
    )


def test_an_expert_action_that_is_no_text_is_the_envs_failure(tiny_tokenizer):
    class NumberExpertEnv(KeyEnv):
        def expert_action(self):
            return 5

    (ep,) = collect(EnvPool(NumberExpertEnv, name="keys"), ActionTemplate(), tiny_tokenizer, [0], expert=True)
    assert ep.end_reason == "env_error"
    assert ep.error == "EnvError: NumberExpertEnv.expert_action returned 5; it must be text or None"


class NoSystemTemplate(ActionTemplate):
    """Its system_prompt returns None: Jinja failed on a message without content, "a bug in omrl"."""

    def system_prompt(self, env):
        return None


class RaisingSystemTemplate(ActionTemplate):
    def system_prompt(self, env):
        raise KeyError("rules")


@pytest.mark.parametrize(
    ("template", "why"),
    [
        (NoSystemTemplate(), "template NoSystemTemplate's system_prompt returned None; it must return text"),
        (RaisingSystemTemplate(), "template RaisingSystemTemplate's system_prompt raised KeyError: 'rules'"),
    ],
)
def test_a_template_whose_system_prompt_fails_ends_the_episode_as_env_error(tiny_tokenizer, template, why):
    (ep,), pool = play(tiny_tokenizer, template, ["Action: open"])
    assert (ep.end_reason, ep.error) == ("env_error", why)
    assert not ep.turns


@pytest.mark.parametrize("expert", [False, True])
def test_omrl_rollout_with_a_broken_template_exits_2_naming_it(fake_plugins, register_plugin, tmp_path, capsys, expert):
    class AlwaysRaising(ActionTemplate):
        def parse(self, response, env):
            raise IndexError("boom in parse")

    broken = SilentTemplate if expert else AlwaysRaising
    register_plugin(Registers({}, {"broken": broken}), name="broken-template")
    words = keys_rollout(2, *(["--expert"] if expert else []), "-o", str(tmp_path / "out.parquet"))
    words[words.index("action")] = "broken"
    code, stdout, stderr = cli_exit(capsys, *words, "generation.max_new_tokens=4")
    text = " ".join((stdout + stderr).split())
    assert code == 2, text
    assert (
        "SilentTemplate's format_action returned None" if expert else "AlwaysRaising's parse raised IndexError"
    ) in text
    assert "could not be parsed" not in text
    template = "SilentTemplate" if expert else "AlwaysRaising"  # the headline too, not "failed in the env"
    assert f"every episode failed in the action template {template} (a bug in its code, not the env)" in text


class TemplatePlugin:
    """Registers one action template under a name, as a third-party plugin would."""

    def __init__(self, name, template_class):
        self.name, self.template_class = name, template_class

    @hookimpl
    def register_templates(self, register):
        register(self.name, self.template_class)


class BuggyParse(ActionTemplate):
    def parse(self, response, env):
        return {}["action"]  # a bug in the plugin's code


def test_a_training_step_a_template_bug_failed_stops_at_once_naming_the_template_and_its_line(
    tiny_model_dir, tmp_path, register_plugin, monkeypatch
):
    """It was "every episode failed in the env", played twice more after 5 s and 10 s waits, then "run again
    once the env is back": the template's code, not the world, had failed, and a replay meets it again."""
    from omrl.errors import EnvFailure
    from omrl.training.rl import run_rl
    from tests.training.helpers import gridworld_config

    waits = []
    monkeypatch.setattr("omrl.training.online_run.time.sleep", waits.append)
    register_plugin(TemplatePlugin("buggy", BuggyParse), name="buggy-template")
    cfg = gridworld_config(
        tiny_model_dir,
        tmp_path / "run",
        "env.template=buggy",
        "generation.max_new_tokens=4",
        "tasks_per_step=1",
        "group_size=2",
        "eval_tasks=0",
    )
    with pytest.raises(EnvFailure) as stopped:
        run_rl(cfg, console=Console(file=io.StringIO()))
    message = " ".join(str(stopped.value).split())
    line = BuggyParse.parse.__code__.co_firstlineno + 1
    assert waits == []  # no replay
    assert "step 1: every episode failed in the action template BuggyParse (a bug in its code, not the env)" in message
    assert f"(in plugin 'buggy-template' (-) at {__file__}:{line})" in message
    assert "fix the action template BuggyParse and run again" in message and "env is back" not in message
