"""Chat-template options per run (``chat.template_kwargs``): every render of a rollout and of SFT reads them,
a name the template never reads is refused by name, and `omrl eval` of a run reuses the run's."""

from __future__ import annotations

import copy

import pytest
import yaml

from omrl.chat import render
from omrl.chat.template_check import check_template_options
from omrl.cli.settings import settings_as_trained, trained_settings
from omrl.config import load_config
from omrl.config.options import EvalRunConfig
from omrl.data.conversations import Conversation
from omrl.errors import OmrlError
from omrl.rollout import RolloutLimits
from omrl.training.packing import tokenize_conversations
from tests.fakes import ScriptedBackend
from tests.helpers import play_keys

from .families import family_tokenizer

GREETING = "{% if greeting is defined %}{{ '<|im_start|>system\\n' + greeting + '<|im_end|>\\n' }}{% endif %}"


@pytest.fixture
def greeting_tokenizer(tiny_tokenizer):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = GREETING + tokenizer.chat_template
    return tokenizer


def test_a_name_the_template_does_not_read_is_refused_with_those_it_reads():
    tokenizer = family_tokenizer("qwen3")
    check_template_options(tokenizer, {"enable_thinking": False})
    with pytest.raises(OmrlError, match=r"enable_thinkng, which the chat template does not read.*enable_thinking"):
        check_template_options(tokenizer, {"enable_thinkng": False})


def test_the_options_a_template_reads_leave_out_the_fields_of_its_messages():
    tokenizer = family_tokenizer("qwen3")  # it reads message.content and reasoning_content, and enable_thinking
    with pytest.raises(OmrlError, match=r"the options it reads: enable_thinking$"):
        check_template_options(tokenizer, {"enable_thinkng": False})


def test_a_rollout_renders_every_prompt_with_the_runs_options(greeting_tokenizer):
    backend = ScriptedBackend(
        greeting_tokenizer, lambda call, index, prompt: ["Action: open", "Action: take key"][call]
    )
    episodes = play_keys(
        greeting_tokenizer,
        backend,
        limits=RolloutLimits(max_new_tokens=24, max_context=1024, template_kwargs={"greeting": "Hello, agent."}),
    )
    [episode] = episodes
    text = greeting_tokenizer.decode(episode.token_ids)
    assert text.count("Hello, agent.") == 1 and episode.end_reason == "done"
    first = render(greeting_tokenizer, episode.messages[:2], add_generation_prompt=True, greeting="Hello, agent.")
    assert text.startswith(first)


def test_sft_renders_with_the_options_and_a_thinking_field_reaches_the_template():
    tokenizer = family_tokenizer("qwen3")
    chat = [
        {"role": "user", "content": "Find the key."},
        {"role": "assistant", "content": "open drawer 1", "thinking": "It may be in drawer 1."},
    ]
    [row], _, _ = tokenize_conversations(tokenizer, [Conversation(chat, "test")], 512)
    trained = tokenizer.decode([t for t in row.labels if t != -100])
    assert "It may be in drawer 1." in trained  # the field a dataset named `thinking` is the template's own
    [off], _, _ = tokenize_conversations(
        tokenizer,
        [Conversation(chat[:1] + [{"role": "assistant", "content": "hi"}], "t")],
        512,
        "keep",
        {"enable_thinking": False},
    )
    assert "<think>\n\n</think>" in tokenizer.decode(off.input_ids)  # Qwen3 with thinking off opens an empty block


def test_a_thinking_field_on_a_template_without_reasoning_is_an_error(tiny_tokenizer):
    chat = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "thinking": "R"}]
    with pytest.raises(OmrlError, match="message 1 carries reasoning in 'thinking'.*writes no reasoning"):
        tokenize_conversations(tiny_tokenizer, [Conversation(chat, "t")], 512)


def test_eval_of_a_run_reuses_its_template_options_in_any_env(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    config = {
        "env": {"name": "gridworld", "template": "react"},
        "chat": {"history": "as_template", "template_kwargs": {"enable_thinking": False}},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    trained = trained_settings(str(run), "webshop")  # another env: the chat settings still hold
    assert trained == {"chat.history": "as_template", "chat.template_kwargs": {"enable_thinking": False}}
    cfg = load_config(EvalRunConfig, None, [f"model.name={run}"])
    printed = []
    settings_as_trained(
        cfg, [], trained, type("Console", (), {"print": lambda self, line, **_: printed.append(line)})()
    )
    assert cfg.chat.template_kwargs == {"enable_thinking": False} and cfg.chat.history == "as_template"
    assert "chat.template_kwargs" in printed[0]
