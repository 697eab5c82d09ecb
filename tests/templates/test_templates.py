"""The built-in action templates: prompts, parsing of good, sloppy and garbage replies, round trips."""

from __future__ import annotations

import json
import time

import pytest

from omrl import registry
from omrl.chat import next_turn_ids, render
from omrl.templates import ParsedAction, Template
from omrl_plugins.templates.common import TemplateError
from tests.fakes import OneTaskEnv, tool


class FakeShop(OneTaskEnv):
    """A shop with two tools: search[keywords] and click[value]."""

    action_help = "Actions: search[keywords] or click[value]."
    tools = [
        tool("search", "Search the shop.", ["keywords"], keywords={"type": "string"}),
        tool("click", "Click a button.", ["value"], value={"type": "string"}),
    ]


class FakeRoom(OneTaskEnv):
    """A room without tools whose valid actions are known."""

    action_help = "Actions: go north, look."
    action_example = "look"

    def admissible_actions(self):
        return ["go north", "look"]


class BrokenEnv(FakeShop):
    """An env whose helpers raise: parsing must still not raise."""

    def admissible_actions(self):
        raise RuntimeError("engine crashed")

    def action_from_tool_call(self, name, arguments):
        raise RuntimeError("converter crashed")


def template(name: str) -> Template:
    return registry.templates.get(name)()


SHOP, ROOM = FakeShop(), FakeRoom()


def test_builtin_templates_register_through_the_entry_point():
    assert {"react", "xml", "tool_call"} <= set(registry.templates.names())
    for name in ("react", "xml", "tool_call"):
        assert issubclass(registry.templates.get(name), Template)
        assert registry.templates.component(name).distribution == "omrl"


# for each template: (env, reply, expected action, expected format_ok)
CASES = {
    "react": [
        # good
        (SHOP, "Think: find shoes first\nAct: search[red shoes]", "search[red shoes]", True),
        (SHOP, "Think:\nAct: click[Buy Now]", "click[Buy Now]", True),
        (SHOP, "Act: click[a]", "click[a]", True),  # no thought: the Act line alone
        (
            ROOM,
            "Think: need a list\nAct: bash\n```bash\nls -1 /etc | wc -l\n```",
            "bash\n```bash\nls -1 /etc | wc -l\n```",
            True,
        ),
        # sloppy
        (SHOP, "search[red shoes]", "search[red shoes]", False),
        (SHOP, "Thought: buy it\nAction: click[Buy Now]", "click[Buy Now]", False),
        (SHOP, "**Think:** ok\n**Act:** click[Buy Now]", "click[Buy Now]", False),
        (SHOP, "Think: ok Act: click[Buy Now]", "click[Buy Now]", False),
        (SHOP, "Think: ok\nAct: click[a]\nObservation: you clicked a", "click[a]", False),
        (SHOP, "Think: ok\nAct: `click[a]`", "click[a]", False),
        (SHOP, "Think: ok\nAct:\nclick[a]", "click[a]", False),
        (SHOP, "Act: click[a]\nThink: done", "click[a]", False),
        (SHOP, "I pick it. Act: click[a]", "click[a]", False),
        (ROOM, "I will look around.\nGo North", "go north", False),
        # garbage
        (SHOP, "I really do not know what to do here.", None, False),
        (SHOP, "", None, False),
        (SHOP, "Think: hmm\nAct:", None, False),
    ],
    "xml": [
        # good
        (SHOP, "<think>find shoes</think>\n<action>search[red shoes]</action>", "search[red shoes]", True),
        (SHOP, "<think></think><action>click[Buy Now]</action>", "click[Buy Now]", True),
        # sloppy
        (SHOP, "<action>click[Buy Now]</action>", "click[Buy Now]", False),
        (SHOP, "<think>ok</think><action>click[Buy Now]", "click[Buy Now]", False),
        (SHOP, "<think>ok</think><action>click[a]</action><action>click[b]</action>", "click[a]", False),
        (SHOP, "Sure! <think>ok</think><action>click[a]</action>", "click[a]", False),
        (SHOP, "<think>ok</think>\nclick[a]", "click[a]", False),
        # garbage
        (SHOP, "<think>only thinking</think>", None, False),
        (SHOP, "<think>x</think><action> </action>", None, False),
        (SHOP, "", None, False),
    ],
    "tool_call": [
        # good
        (
            SHOP,
            '<tool_call>\n{"name": "search", "arguments": {"keywords": "red shoes"}}\n</tool_call>',
            "search[red shoes]",
            True,
        ),
        (
            SHOP,
            'I should buy.\n<tool_call>{"name": "click", "arguments": {"value": "Buy Now"}}</tool_call>',
            "click[Buy Now]",
            True,
        ),
        (ROOM, '<tool_call>{"name": "act", "arguments": {"action": "go north"}}</tool_call>', "go north", True),
        # sloppy
        (SHOP, '<tool_call>{"name": "click", "arguments": {"value": "Buy Now"}}', "click[Buy Now]", False),
        (SHOP, '{"name": "click", "arguments": {"value": "Buy Now"}}', "click[Buy Now]", False),
        (SHOP, '<tool_call>{"name": "click", "arguments": "{\\"value\\": \\"a\\"}"}</tool_call>', "click[a]", False),
        (SHOP, '<tool_call>{"name": "click", "parameters": {"value": "a"}}</tool_call>', "click[a]", False),
        (SHOP, '<tool_call>{"name": "click", "arguments": {"value": 3}}</tool_call>', "click[3]", False),
        (SHOP, '<tool_call>{"name": "click", "arguments": {"value": "a"}} oops</tool_call>', "click[a]", False),
        (
            SHOP,
            '<tool_call>{"name": "click", "arguments": {"value": "a"}}</tool_call>\n'
            '<tool_call>{"name": "click", "arguments": {"value": "b"}}</tool_call>',
            "click[a]",
            False,
        ),
        (SHOP, '<tool_call>{"name": "click", "arguments": {"value": "a"}}</tool_call> and more', "click[a]", False),
        # garbage
        (SHOP, "I will click the button.", None, False),
        (SHOP, '<tool_call>{"name": "click", arguments}</tool_call>', None, False),
        (SHOP, '<tool_call>{"name": "buy", "arguments": {}}</tool_call>', None, False),
        (SHOP, '<tool_call>{"name": "click", "arguments": {"button": "a"}}</tool_call>', None, False),
        (SHOP, '<tool_call>{"name": "click", "arguments": {"value": "a", "x": 1}}</tool_call>', None, False),
        (SHOP, '<tool_call>["click", "a"]</tool_call>', None, False),
        (SHOP, '<tool_call>{"name": "click", "arguments": {"value": ["a"]}}</tool_call>', None, False),
        (ROOM, '<tool_call>{"name": "act", "arguments": {"action": "  "}}</tool_call>', None, False),
    ],
}


@pytest.mark.parametrize(
    "name, env, reply, action, format_ok", [(name, *case) for name, cases in CASES.items() for case in cases]
)
def test_parse(name, env, reply, action, format_ok):
    parsed = template(name).parse(reply, env)
    assert isinstance(parsed, ParsedAction)
    assert (parsed.action, parsed.format_ok) == (action, format_ok)
    # an error is given exactly when there is no action, and it shows the expected format
    assert (parsed.error is None) == (action is not None)
    if parsed.error:
        assert {"react": "Act:", "xml": "<action>", "tool_call": "<tool_call>"}[name] in parsed.error


def test_parse_keeps_the_thought():
    assert template("react").parse("Think: find shoes\nAct: search[x]", SHOP).thought == "find shoes"
    assert template("react").parse("Think: go up\nsearch[x]", SHOP).thought == "go up"
    assert template("xml").parse("<think> find shoes </think><action>search[x]</action>", SHOP).thought == "find shoes"
    call = '<tool_call>{"name": "search", "arguments": {"keywords": "x"}}</tool_call>'
    assert template("tool_call").parse("Let me search.\n" + call, SHOP).thought == "Let me search."
    assert template("tool_call").parse(call, SHOP).thought is None


def test_errors_are_helpful():
    unknown = template("tool_call").parse('<tool_call>{"name": "buy", "arguments": {}}</tool_call>', SHOP).error
    assert "'buy'" in unknown and "search, click" in unknown
    missing = template("tool_call").parse('<tool_call>{"name": "click", "arguments": {}}</tool_call>', SHOP).error
    assert "'value'" in missing and "click(value: string)" in missing
    bad_json = template("tool_call").parse("<tool_call>{oops}</tool_call>", SHOP).error
    assert "not valid JSON" in bad_json
    assert SHOP.action_help in template("react").parse("no idea", SHOP).error
    assert SHOP.action_help in template("xml").parse("no idea", SHOP).error


@pytest.mark.parametrize("name", ["react", "xml", "tool_call"])
@pytest.mark.parametrize(
    "env, action", [(SHOP, "search[red running shoes]"), (SHOP, "click[Buy Now]"), (ROOM, "go north")]
)
@pytest.mark.parametrize("thought", ["", "I need to act now."])
def test_rendered_reply_round_trips(name, env, action, thought):
    tpl = template(name)
    parsed = tpl.parse(tpl.format_action(action, env, thought), env)
    assert (parsed.action, parsed.format_ok, parsed.thought) == (action, True, thought or None)
    assert (parsed.tool_call is not None) == (name == "tool_call")  # a native call, structured


@pytest.mark.parametrize("name", ["react", "xml", "tool_call"])
@pytest.mark.parametrize("env", [SHOP, ROOM])
def test_system_prompt_has_the_action_help_and_a_parsable_example(name, env):
    prompt = template(name).system_prompt(env)
    assert env.action_help in prompt
    assert len(prompt) < 600  # small models, small contexts
    example = prompt.split("Example:\n", 1)[1]
    parsed = template(name).parse(example, env)
    assert parsed.format_ok and parsed.action
    if env is ROOM:
        assert parsed.action == "look"  # the env's action_example


def test_tool_call_prompt_lists_the_tools():
    prompt = template("tool_call").system_prompt(SHOP)
    assert "search(keywords: string)" in prompt and "click(value: string)" in prompt
    assert "act(action: string)" in template("tool_call").system_prompt(ROOM)


def test_tool_call_passes_tools_in_the_function_format():
    kwargs = template("tool_call").chat_template_kwargs(SHOP)
    assert kwargs == {"tools": [{"type": "function", "function": tool} for tool in FakeShop.tools]}
    (generic,) = template("tool_call").chat_template_kwargs(ROOM)["tools"]
    assert generic["function"]["name"] == "act"
    assert generic["function"]["parameters"]["required"] == ["action"]
    assert template("react").chat_template_kwargs(SHOP) == {}


def test_tool_call_checks_argument_types_and_enums():
    class Dial(FakeShop):
        tools = [
            tool(
                "dial",
                "Dial a number.",
                ["digits", "mode"],
                digits={"type": "integer"},
                mode={"type": "string", "enum": ["tone", "pulse"]},
            )
        ]

    tpl, env = template("tool_call"), Dial()

    def parse(args):
        return tpl.parse(f"<tool_call>{json.dumps({'name': 'dial', 'arguments': args})}</tool_call>", env)

    assert (parse({"digits": 42, "mode": "tone"}).action, parse({"digits": 42, "mode": "tone"}).format_ok) == (
        "dial[42, tone]",
        True,
    )
    assert (parse({"digits": "42", "mode": "tone"}).action, parse({"digits": "42", "mode": "tone"}).format_ok) == (
        "dial[42, tone]",
        False,
    )
    assert "must be of type integer" in parse({"digits": "forty", "mode": "tone"}).error
    assert "'tone', 'pulse'" in parse({"digits": 4, "mode": "fax"}).error
    assert "must be of type integer" in parse({"digits": True, "mode": "tone"}).error


def test_tool_call_renders_actions_of_envs_with_their_own_conversion():
    class Grid(FakeShop):
        tools = [tool("move", "Move one cell.", ["direction"], direction={"type": "string", "enum": ["up", "down"]})]

        def action_from_tool_call(self, name, arguments):
            return arguments["direction"] if name == "move" else name

    tpl, env = template("tool_call"), Grid()
    reply = tpl.format_action("down", env)
    assert json.loads(reply.split("\n")[1]) == {"name": "move", "arguments": {"direction": "down"}}
    assert tpl.parse(reply, env) == ParsedAction(
        "down", True, tool_call={"type": "function", "function": {"name": "move", "arguments": {"direction": "down"}}}
    )
    assert '"direction": "up"' in tpl.system_prompt(env)  # the example uses the enum's first value
    with pytest.raises(TemplateError, match="'left'"):
        tpl.format_action("left", env)


def test_tool_call_cannot_render_an_action_no_tool_expresses():
    with pytest.raises(TemplateError, match="search\\(keywords: string\\)"):
        template("tool_call").format_action("go north", SHOP)


WEIRD = [
    "<tool_call>",
    "</tool_call>",
    "{",
    "Act:",
    "<action>",
    "<think>",
    "Think:\n\n",
    "\x00\ufffd",
    "[]" * 50,
    '<tool_call>{"name": 1}</tool_call>',
    '<tool_call>{"name": "click", "arguments": 5}</tool_call>',
    '<tool_call>{"name": "click", "arguments": {"value": "a"}}</tool_call>',
    "click[a]",
]


@pytest.mark.parametrize("name", ["react", "xml", "tool_call"])
def test_parse_never_raises_even_when_the_env_does(name):
    for reply in WEIRD:
        parsed = template(name).parse(reply, BrokenEnv())
        assert isinstance(parsed, ParsedAction)
        assert (parsed.action is None) == (parsed.error is not None)
    rejected = template("tool_call").parse(WEIRD[-2], BrokenEnv())
    assert rejected.action is None and "converter crashed" in rejected.error


def test_tool_call_with_the_tiny_models_chat_template(tiny_model_dir):
    from omrl.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    tpl = template("tool_call")
    kwargs = tpl.chat_template_kwargs(SHOP)
    reply = tpl.format_action("search[red shoes]", SHOP, "Search first.")
    messages = [
        {"role": "system", "content": tpl.system_prompt(SHOP)},
        {"role": "user", "content": "Buy red shoes."},
        {"role": "assistant", "content": reply},
    ]
    text = render(tokenizer, messages, **kwargs)
    assert json.dumps(kwargs["tools"][0]) in text  # the chat template rendered the tools
    assert tpl.system_prompt(SHOP) in text
    # the reply survives the chat template, and the conversation continues token-exactly with tools on
    start = text.index("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")
    assistant = text[start : text.index("<|im_end|>", start)]
    assert tpl.parse(assistant, SHOP) == ParsedAction(
        "search[red shoes]",
        True,
        "Search first.",
        tool_call={"type": "function", "function": {"name": "search", "arguments": {"keywords": "red shoes"}}},
    )
    increment = tokenizer.decode(next_turn_ids(tokenizer, messages, "Results: ...", "", **kwargs))
    assert increment.startswith("<|im_end|>") and "Results: ..." in increment


class Phone(FakeShop):
    """A shop with one integer-argument tool: dial[digits]."""

    tools = [tool("dial", "Dial a number.", ["digits"], digits={"type": "integer"})]


def dial(args: str) -> str:
    return f'<tool_call>{{"name": "dial", "arguments": {args}}}</tool_call>'


@pytest.mark.parametrize(
    "reply, problem",
    [
        ("<tool_call>" + "[" * 1000, "not valid JSON (nested too deeply)"),
        ('<tool_call>{"name": "dial", "arguments": {"digits": ' + "[" * 5000, "not valid JSON (nested too deeply)"),
        ("{" + '"a": {' * 3000, "not valid JSON (nested too deeply)"),
        (dial('{"digits": ' + "1" * 5000 + "}"), "not valid JSON (Exceeds the limit (4300 digits)"),
        (dial('{"digits": "' + "1" * 5000 + '"}'), "must be of type integer, got '111111"),
        (dial("[" * 500 + "]" * 500), '"arguments" must be a JSON object, got [[[[...]]]].'),
    ],
)
def test_tool_call_replies_that_break_python_json_are_parse_errors(reply, problem):
    parsed = template("tool_call").parse(reply, Phone())
    assert parsed.action is None and problem in parsed.error
    assert len(parsed.error) < 400  # the bad value is cut, not echoed back at full length


def test_tool_call_json_escapes_of_lone_surrogates_give_writable_actions():
    parsed = template("tool_call").parse(
        '<tool_call>{"name": "act", "arguments": {"action": "go \\ud800"}}</tool_call>', ROOM
    )
    assert parsed.action == "go \ufffd"
    parsed.action.encode("utf-8")


@pytest.mark.parametrize(
    "name, unit", [("xml", "<action>"), ("xml", "<think>"), ("tool_call", "<tool_call>"), ("react", "Think:\n")]
)
def test_parse_time_is_linear_in_replies_of_repeated_unclosed_tags(name, unit):
    reply = unit * (200_000 // len(unit))
    start = time.perf_counter()
    parsed = template(name).parse(reply, SHOP)
    assert time.perf_counter() - start < 2  # lazy regexes rescanning from every tag took about a minute
    assert parsed.action is None and parsed.error


def test_a_thinking_models_reasoning_block_before_the_react_answer_is_set_aside():
    """Qwen3 and DeepSeek-R1 open every reply with <think>...</think>: react reads the answer after it."""
    tpl = template("react")
    reply = "<think>\nThe goal is up.\n</think>\n\n" + tpl.format_action("search[red running shoes]", SHOP, "Look.")
    parsed = tpl.parse(reply, SHOP)
    assert (parsed.action, parsed.format_ok, parsed.thought) == ("search[red running shoes]", True, "Look.")


# a thinking family's reply as its model samples it after the generation prompt, the answer last
REASONING_FIRST = {
    "qwen3": "<think>\nThe goal is near.\n</think>\n\n{answer}",  # the reply opens the block
    "deepseek_r1": "The goal is near.\n</think>\n\n{answer}",  # the generation prompt opened <think>
    "gpt_oss": "<|channel|>analysis<|message|>The goal is near.<|end|><|start|>assistant<|channel|>final<|message|>"
    "{answer}",
    "gpt_oss_final_only": "<|channel|>final<|message|>{answer}",
}


@pytest.mark.parametrize(
    "name, family",
    # xml's own tag is <think>: a Qwen3 block before its answer reads as two think blocks, as before
    [("react", family) for family in REASONING_FIRST] + [("xml", f) for f in REASONING_FIRST if f != "qwen3"],
)
def test_a_well_formed_answer_after_a_thinking_familys_reasoning_is_well_formed(name, family):
    tpl = template(name)
    reply = REASONING_FIRST[family].format(answer=tpl.format_action("click[Buy Now]", SHOP, "Buy it."))
    parsed = tpl.parse(reply, SHOP)
    assert (parsed.action, parsed.format_ok, parsed.thought) == ("click[Buy Now]", True, "Buy it.")


@pytest.mark.parametrize("name, answer", [("react", "\nAct: click[a]"), ("xml", "<action>click[a]</action>")])
def test_reasoning_never_closed_is_read_with_its_answer_as_before(name, answer):
    """A reply that never closes its reasoning (cut at the token limit) has no answer to set apart."""
    for opened in ("The goal is near.", "<|channel|>analysis<|message|>The goal is near."):
        parsed = template(name).parse(opened + answer, SHOP)
        assert (parsed.action, parsed.format_ok) == ("click[a]", False)
