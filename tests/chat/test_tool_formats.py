"""Every tool-call format the chat templates PyPI ``trl`` ships write (omrl.chat.tool_calls and
omrl.chat.tool_formats): each template's own text for a reply holding a call is named its format by
``template_format`` and read back by ``parse_tool_calls`` to the same call. The templates are found at test
time (every one whose text for such a reply names the tool), so a template trl adds is covered the day it
appears, and one whose format omrl does not read fails here by name unless NOT_READ says why."""

from __future__ import annotations

import functools
import importlib.resources
import json

import pytest
from transformers import AutoTokenizer

from omrl.chat.tool_calls import FORMATS, parse_tool_calls, template_format
from omrl.models import TINY_TOKENIZER_DIR

TEMPLATES = importlib.resources.files("trl") / "chat_templates"
NAME = "get_weather"
TOOL = {
    "type": "function",
    "function": {
        "name": NAME,
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "where": {"type": "object"},
                "note": {"type": "string"},
            },
            "required": ["city"],
        },
    },
}
ARGS = {"city": "Paris", "days": 3, "metric": True}
SECOND = {"city": "Rome", "days": -2, "metric": False}
NESTED = {
    "city": "São Paulo",
    "days": 0,
    "metric": False,
    "tags": ["rain", "wind"],
    "where": {"lat": -23.55, "name": "centro", "near": [1, 2.5], "open": True},
    "note": "a, b: {c} [d] (e)",
}
USER = {"role": "user", "content": "What is the weather like?"}
FAMILIES = {  # template name prefix -> the format its family writes (the longest prefix wins)
    "qwen2_5": "hermes",
    "qwen3": "hermes",
    "qwen3_5": "qwen3_coder",
    "qwen3_6": "qwen3_coder",
    "qwen3_8": "qwen3_coder",
    "nemotron_3": "qwen3_coder",
    "llama3": "json",
    "glm4moe": "glm45",
    "gptoss": "harmony",
    "deepseekv3": "deepseek",
    "gemma4": "gemma4",
    "diffusion_gemma": "gemma4",
    "lfm2": "pythonic",
}
NOT_READ = {  # templates that write calls in a format omrl does not read, and why
    "muse_glimmer": "Muse Glimmer's ATEM <atem:function_calls> XML, which no serving engine's parser reads yet",
    "muse_glimmer_training": "Muse Glimmer's ATEM <atem:function_calls> XML (the training variant)",
}
OPENERS = {  # where each format's first call starts, for the content check
    "hermes": "<tool_call>",
    "qwen3_coder": "<tool_call>",
    "glm45": "<tool_call>",
    "harmony": "to=functions.",
    "deepseek": "<｜tool▁calls▁begin｜>",
    "gemma4": "<|tool_call>",
    "pythonic": "<|tool_call_start|>",
}
ENDS = (  # the tokens a reply's text ends with, which the model samples as its stop and a parser never sees
    "<|im_end|>",
    "<|eot_id|>",
    "<｜end▁of▁sentence｜>",
    "<|observation|>",
    "<turn|>",
    "<|tool_response>",
    "<|return|>",
)
BREAKS = {  # how to make each format's arguments unreadable: (what the template wrote, what replaces it)
    "hermes": ('"metric": true}}', '"metric": true}'),
    "json": ('"metric": true}}', '"metric": true}'),
    "qwen3_coder": ("</parameter>", ""),
    "glm45": ("</arg_value>", ""),
    "harmony": ('"metric": true}<|call|>', '"metric": true<|call|>'),
    "deepseek": ('"metric": true}\n', '"metric": true\n'),
    "gemma4": ('Paris<|"|>', "Paris"),
    "pythonic": ("city='Paris'", "city=Paris"),
}


def tokenizer(name: str):
    tok = AutoTokenizer.from_pretrained(TINY_TOKENIZER_DIR)
    tok.chat_template = (TEMPLATES / f"{name}.jinja").read_text()
    return tok


def call(arguments: dict, name: str = NAME) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


@functools.cache
def _tokenizer(name: str):
    return tokenizer(name)


def written(name: str, calls: tuple[tuple[str, str], ...], content: str = "") -> str | None:
    """The text template ``name`` writes for a reply holding ``calls`` ((tool name, JSON arguments) pairs),
    up to its stop token: its render of the chat with the reply, less its render of the chat before it with
    the generation prompt where the one starts with the other, else all after the user's message. Arguments go in as objects,
    or as JSON strings for a template that only takes those; None when it renders neither."""
    tok = _tokenizer(name)
    for as_text in (False, True):
        reply = {
            "role": "assistant",
            "content": content,
            "tool_calls": [call(a if as_text else json.loads(a), n) for n, a in calls],
        }
        try:
            full = tok.apply_chat_template([USER, reply], tokenize=False, tools=[TOOL])
            before = tok.apply_chat_template([USER], tokenize=False, tools=[TOOL], add_generation_prompt=True)
        except Exception:  # noqa: BLE001 - a template that takes arguments only as text, or no calls at all
            continue
        if full.startswith(before):
            return sampled(full[len(before) :])
        return sampled(full[full.rindex(USER["content"]) + len(USER["content"]) :])
    return None


def sampled(text: str) -> str:
    """A reply's text as the model samples it, up to its stop token (``ENDS``)."""
    text = text.rstrip()
    while text.endswith(ENDS):
        text = text[: -len(next(end for end in ENDS if text.endswith(end)))].rstrip()
    return text


def one(arguments: dict = ARGS, name: str = NAME, content: str = "", template: str = "") -> str | None:
    return written(template, ((name, json.dumps(arguments)),), content)


def template_names() -> list[str]:
    return sorted(p.name.removesuffix(".jinja") for p in TEMPLATES.iterdir() if p.name.endswith(".jinja"))


@functools.cache
def calling_templates() -> tuple[str, ...]:
    """Every template whose text for a reply holding a call names the tool."""
    return tuple(name for name in template_names() if NAME in (one(template=name) or ""))


#: templates that read a reply's tool_calls but write no call of it (their text alone)
WRITES_NO_CALL = {"deepseek_r1_distill", "deepseek_r1_distill_training"}


def read_templates() -> list[str]:
    """The templates whose calls omrl reads, as their text says (no render at collection: that took seconds
    on each worker; test_the_templates_read_are_those_that_write_calls holds it to the rendered list)."""
    reading = [n for n in template_names() if "tool_calls" in (TEMPLATES / f"{n}.jinja").read_text()]
    return [name for name in reading if name not in WRITES_NO_CALL and name not in NOT_READ]


def test_the_templates_read_are_those_that_write_calls():
    assert read_templates() == [name for name in calling_templates() if name not in NOT_READ]


def family_format(name: str) -> str | None:
    prefixes = [prefix for prefix in FAMILIES if name.startswith(prefix)]
    return FAMILIES[max(prefixes, key=len)] if prefixes else None


def test_every_template_that_writes_calls_writes_a_format_omrl_reads():
    names = calling_templates()
    assert len(names) >= 40 and {"qwen3", "glm4moe", "gptoss", "gemma4", "lfm2_2_5", "deepseekv3"} <= set(names)
    unread = [name for name in names if name not in NOT_READ and template_format(one(template=name), NAME) is None]
    assert not unread, f"templates writing calls in a format omrl does not read: {unread}"
    for name, why in NOT_READ.items():  # the list stays true: each still writes calls, none omrl reads
        assert name in names and template_format(one(template=name), NAME) is None, (name, why)


def test_every_template_that_reads_tool_calls_renders_a_reply_holding_one():
    reads = [name for name in template_names() if "tool_calls" in (TEMPLATES / f"{name}.jinja").read_text()]
    assert [name for name in reads if one(template=name) is None] == []


@pytest.mark.parametrize("name", read_templates())
def test_a_templates_call_is_named_its_format_and_read_back(name):
    text = one(template=name)
    fmt = template_format(text, NAME)
    assert fmt in FORMATS
    assert fmt == (family_format(name) or fmt), f"{name} writes {fmt}, its family {family_format(name)}"
    reply = parse_tool_calls(text, [TOOL], fmt)
    assert [(a.status, a.name, a.arguments) for a in reply.attempts] == [("ok", NAME, ARGS)], text
    assert reply.content == ("" if fmt == "json" else text[: text.index(OPENERS[fmt])].strip())


@pytest.mark.parametrize("name", read_templates())
def test_nested_values_and_text_with_separators_are_read_back(name):
    text = one(NESTED, template=name)
    reply = parse_tool_calls(text, [TOOL], template_format(text, NAME))
    assert [(a.status, a.arguments) for a in reply.attempts] == [("ok", NESTED)], text


ONE_CALL_PER_REPLY = {"gptoss", "gptoss_training", "llama3_1", "llama3_2"}  # their templates write only the first
DROPS_TEXT_BESIDE_A_CALL = {"llama3_1", "llama3_2"}


def test_the_templates_that_write_one_call_or_drop_text_are_the_known_ones():
    two = {
        n
        for n in read_templates()
        if "Rome" in (written(n, ((NAME, json.dumps(ARGS)), (NAME, json.dumps(SECOND)))) or "")
    }
    assert set(read_templates()) - two == ONE_CALL_PER_REPLY
    with_text = {n for n in read_templates() if "Let me check." in one(content="Let me check.", template=n)}
    assert set(read_templates()) - with_text == DROPS_TEXT_BESIDE_A_CALL


@pytest.mark.parametrize("name", sorted(set(read_templates()) - ONE_CALL_PER_REPLY))
def test_two_calls_in_one_reply_are_two_attempts(name):
    text = written(name, ((NAME, json.dumps(ARGS)), (NAME, json.dumps(SECOND))))
    reply = parse_tool_calls(text, [TOOL], template_format(text, NAME))
    assert [(a.status, a.arguments) for a in reply.attempts] == [("ok", ARGS), ("ok", SECOND)], text


@pytest.mark.parametrize("name", sorted(set(read_templates()) - DROPS_TEXT_BESIDE_A_CALL))
def test_the_text_before_a_call_is_the_content(name):
    text = one(content="Let me check.", template=name)
    fmt = template_format(text, NAME)
    reply = parse_tool_calls(text, [TOOL], fmt)
    assert [a.status for a in reply.attempts] == ["ok"]
    assert "Let me check." in reply.content and OPENERS[fmt] not in reply.content


@pytest.mark.parametrize("name", read_templates())
def test_a_call_cut_inside_its_arguments_is_unclosed(name):
    text = one(template=name)
    fmt = template_format(text, NAME)
    cut = text[: text.index("Paris") + len("Paris")]
    reply = parse_tool_calls(cut, [TOOL], fmt)
    # a JSON object and gpt-oss's last message end where the text ends (a server's parser gets the reply
    # without its stop token): cut inside, their arguments are not JSON
    assert [a.status for a in reply.attempts] == ["invalid_json" if fmt in ("json", "harmony") else "unclosed"]
    assert reply.content == cut and not reply.calls


@pytest.mark.parametrize("name", read_templates())
def test_arguments_that_do_not_read_are_invalid(name):
    text = one(template=name)
    fmt = template_format(text, NAME)
    old, new = BREAKS[fmt]
    assert old in text, (fmt, text)
    reply = parse_tool_calls(text.replace(old, new, 1), [TOOL], fmt)
    assert [a.status for a in reply.attempts] == ["invalid_json"] and not reply.calls


@pytest.mark.parametrize("name", read_templates())
def test_a_call_to_a_tool_not_offered_is_an_unknown_tool(name):
    text = one(name="get_forecast", template=name)
    reply = parse_tool_calls(text, [TOOL], template_format(one(template=name), NAME))
    assert [(a.status, a.name) for a in reply.attempts] == [("unknown_tool", "get_forecast")]
    assert set(reply.calls[0].arguments) == set(ARGS)  # the call still reaches the agent, which answers it
    # (values written as text stay text: no schema says what they are)


@pytest.mark.parametrize("fmt", [fmt for fmt in FORMATS if fmt != "json"])
def test_a_reply_without_a_call_is_its_text(fmt):
    text = "It is sunny in Paris; no tool to=functions.none is needed [ok(x=1)] {a:1}."
    reply = parse_tool_calls(text, [TOOL], fmt)
    assert reply.attempts == () and reply.content == text


@pytest.mark.parametrize(
    "fmt, text, expected",
    [
        ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n", "unclosed"),
        ("qwen3_coder", "<tool_call>\n<function=>\n</function>\n</tool_call>", "missing_name"),
        ("qwen3_coder", '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>', "invalid_json"),
        ("glm45", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris", "unclosed"),
        ("glm45", "<tool_call>\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>", "missing_name"),
        ("harmony", "<|channel|>commentary to=functions. <|constrain|>json<|message|>{}<|call|>", "missing_name"),
        ("harmony", "<|channel|>commentary to=functions.get_weather <|constrain|>json", "unclosed"),
        ("deepseek", "<｜tool▁calls▁begin｜>", "unclosed"),
        ("deepseek", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n{}", "unclosed"),
        ("gemma4", '<|tool_call>call:{city:<|"|>Paris<|"|>}<tool_call|>', "missing_name"),
        ("gemma4", "<|tool_call>call:get_weather{city:Paris}<tool_call|>", "invalid_json"),
        ("pythonic", "<|tool_call_start|>[get_weather('Paris')]<|tool_call_end|>", "invalid_json"),
        ("pythonic", "<|tool_call_start|>[x.get_weather(city='Paris')]<|tool_call_end|>", "missing_name"),
        ("pythonic", "<|tool_call_start|>[get_weather(city=__import__('os'))]<|tool_call_end|>", "invalid_json"),
        ("pythonic", "<|tool_call_start|>" + "[" * 5000 + "<|tool_call_end|>", "invalid_json"),
        ("gemma4", "<|tool_call>call:get_weather" + "{a:" * 5000 + "<tool_call|>", "invalid_json"),
    ],
)
def test_each_formats_failures_get_their_status(fmt, text, expected):
    assert [a.status for a in parse_tool_calls(text, [TOOL], fmt).attempts] == [expected]


def test_an_xml_value_that_does_not_read_as_its_type_stays_text_and_is_bad():
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\n3\n</parameter>\n<parameter=days>\nthree\n"
    [attempt] = parse_tool_calls(text + "</parameter>\n</function>\n</tool_call>", [TOOL], "qwen3_coder").attempts
    assert (attempt.status, attempt.arguments) == ("bad_arguments", {"city": "3", "days": "three"})


def test_harmony_reads_the_recipient_after_the_channel_and_skips_analysis():
    text = (
        "<|channel|>analysis<|message|>I could send to=functions.get_weather a call.<|end|>"
        '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}'
        "<|call|>"
    )
    reply = parse_tool_calls(text, [TOOL], "harmony")
    assert [(a.status, a.arguments) for a in reply.attempts] == [("ok", {"city": "Oslo"})]
    assert reply.content == "<|channel|>analysis<|message|>I could send to=functions.get_weather a call.<|end|>"


def test_a_format_none_reads_is_none():
    assert template_format("[TOOL_CALLS]get_weather[ARGS]{}", NAME) is None
    assert template_format("Call get_weather yourself.", NAME) is None
