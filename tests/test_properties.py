"""Property tests (Hypothesis): template parsing and dataset loading never raise on any input.

A template's ``parse`` gets every model reply, so any string must come back as a
ParsedAction (with an error exactly when there is no action); ``load_conversations``
gets any file a user names, so any bytes must give conversations or an OmrlError
naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omrl import registry
from omrl.data.conversations import Conversation, load_conversations
from omrl.envs import Env
from omrl.errors import OmrlError
from omrl.templates import ParsedAction
from tests.fakes import OneTaskEnv, tool

TEMPLATES = ("react", "xml", "tool_call")
FAST = settings(max_examples=150, deadline=None)
SLOW = settings(max_examples=8, deadline=None)  # ~1 MB inputs
FILES = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


# -- envs a reply is parsed for ------------------------------------------------------------------


class ToolEnv(OneTaskEnv):
    """An env with tools of several argument types."""

    action_help = "Actions: search[keywords], click[value] or dial[digits, loud]."
    tools = [
        tool("search", "Search.", ["keywords"], keywords={"type": "string"}),
        tool("click", "Click.", ["value"], value={"type": "string", "enum": ["a", "b"]}),
        tool("dial", "Dial.", ["digits"], digits={"type": "integer"}, loud={"type": "boolean"}),
    ]


class RoomEnv(ToolEnv):
    """No tools; its valid actions are known."""

    action_help = "Actions: go north, look."
    action_example = "look"
    tools = []

    def admissible_actions(self):
        return ["go north", "look", "take [x]"]


class BrokenEnv(ToolEnv):
    """Every helper a template may call raises."""

    def admissible_actions(self):
        raise RuntimeError("engine crashed")

    def action_from_tool_call(self, name, arguments):
        raise RuntimeError("converter crashed")


ENVS = (ToolEnv(), RoomEnv(), BrokenEnv())


# -- replies -------------------------------------------------------------------------------------

# the pieces the templates look for, so random replies hit their branches, not just their "nothing found" path
PIECES = [
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<action>",
    "</action>",
    "<ACTION>",
    "Think:",
    "Act:",
    "Action:",
    "**Act:**",
    "Thought:",
    "Observation:",
    "\n",
    " ",
    "```",
    "`",
    "'",
    '"',
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    ":",
    ",",
    '"name"',
    '"arguments"',
    '"parameters"',
    '"search"',
    '"click"',
    '"dial"',
    '"act"',
    '"action"',
    '"keywords"',
    '"value"',
    '"digits"',
    '"loud"',
    '"a"',
    '"3"',
    "3",
    "3.5",
    "-1",
    "true",
    "null",
    '"true"',
    "\\u00e9",
    "\\ud800",
    "\\",
    "search[shoes]",
    "click[a]",
    "go north",
    "look",
    "\x00",
    "\ufffd",
    "é",
    "\u2028",
    "1" * 5000,
]
adversarial = st.lists(st.sampled_from(PIECES) | st.text(max_size=8), max_size=40).map("".join)
nested = st.builds(
    lambda prefix, unit, count, suffix: prefix + unit * count + suffix,
    st.sampled_from(
        [
            "",
            "<tool_call>",
            '<tool_call>{"name": "search", "arguments": ',
            '{"name": "dial", "arguments": {"digits": ',
            "Act: ",
            "<action>",
        ]
    ),
    st.sampled_from(["[", "{", "<", '{"a": ', "[{", '{"a": [', "<action>", "<tool_call>", "<think>"]),
    st.integers(500, 5000),
    st.sampled_from(["", "]", "}", "</tool_call>", "</action>"]),
)
invalid_utf8 = st.binary(max_size=200).map(lambda raw: raw.decode("utf-8", errors="replace"))
replies = st.text() | adversarial | nested | invalid_utf8


def check_parse(name: str, reply: str, env: Env) -> None:
    parsed = registry.templates.get(name)().parse(reply, env)
    assert isinstance(parsed, ParsedAction)
    assert (parsed.action is None) == (parsed.error is not None), parsed
    if parsed.action is not None:
        assert isinstance(parsed.action, str) and parsed.action.strip()
        parsed.action.encode("utf-8")  # writable to the trajectory files (JSON escapes must not make surrogates)
    assert isinstance(parsed.format_ok, bool)


@pytest.mark.slow
@pytest.mark.parametrize("name", TEMPLATES)
@FAST
@given(reply=replies, env=st.sampled_from(ENVS))
def test_parse_never_raises(name, reply, env):
    check_parse(name, reply, env)


@pytest.mark.parametrize("name", TEMPLATES)
@SLOW
@given(unit=adversarial.filter(bool), env=st.sampled_from(ENVS))
def test_parse_never_raises_on_a_megabyte_reply(name, unit, env):
    check_parse(name, unit * (1_000_000 // len(unit) + 1), env)


@pytest.fixture(scope="module")
def tokenizer():
    from omrl.models import load_tokenizer, resolve_model_path

    return load_tokenizer(resolve_model_path("tiny"))


@pytest.mark.slow
@pytest.mark.parametrize("name", TEMPLATES)
@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(0, 4095), max_size=60), env=st.sampled_from(ENVS))
def test_parse_never_raises_on_decoded_token_ids(tokenizer, name, ids, env):
    # random ids often split a character's UTF-8 bytes: the text then holds U+FFFD, as a model's reply can
    check_parse(name, tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False), env)


# -- dataset files -------------------------------------------------------------------------------

GOOD = {
    "conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "search[x]"}],
    "reward": 1.0,
}
json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                ["conversations", "messages", "role", "content", "from", "value", "reward", "demo_messages", "id"]
            )
            | st.text(max_size=5),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)
records = st.just(GOOD) | json_values
# valid JSON lines, then some of their bytes overwritten, or cut off
jsonl_bytes = st.lists(records, max_size=5).map(lambda rows: "".join(json.dumps(r) + "\n" for r in rows).encode())


def load_or_error(path: Path) -> None:
    """``load_conversations(path)`` gives conversations or an OmrlError naming the file, nothing else."""
    try:
        conversations = load_conversations(path)
    except OmrlError as exc:
        assert str(path) in str(exc)
        return
    assert all(isinstance(conv, Conversation) and conv.messages for conv in conversations)


def damage(data: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    """``data`` with byte ``value`` written at each (position, value) of ``edits``, then cut at ``cut``."""
    out = bytearray(data)
    for position, value in edits:
        if out:
            out[position % len(out)] = value
    return bytes(out[:cut] if cut is not None else out)


edits = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4)
cuts = st.none() | st.integers(0, 5000)


@FILES
@given(data=jsonl_bytes, edits=edits, cut=cuts, suffix=st.sampled_from([".jsonl", ".json"]))
def test_garbled_json_lines_load_or_raise_an_omrl_error(tmp_path, data, edits, cut, suffix):
    path = tmp_path / f"data{suffix}"
    path.write_bytes(damage(data, edits, cut))
    load_or_error(path)


@FILES
@given(data=st.binary(max_size=3000), suffix=st.sampled_from([".jsonl", ".json", ".parquet", ".arrow"]))
def test_random_bytes_load_or_raise_an_omrl_error(tmp_path, data, suffix):
    path = tmp_path / f"data{suffix}"
    path.write_bytes(data)
    load_or_error(path)


def _parquet(rows: list) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue().to_pybytes()


GOOD_PARQUET = _parquet([GOOD] * 5)


@FILES
@given(edits=edits, cut=cuts)
def test_damaged_parquet_loads_or_raises_an_omrl_error(tmp_path, edits, cut):
    path = tmp_path / "data.parquet"
    path.write_bytes(damage(GOOD_PARQUET, edits, cut))
    load_or_error(path)


parquet_rows = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "conversations": st.none()
            | st.just(GOOD["conversations"])
            | st.lists(st.text(max_size=5), max_size=2)
            | st.lists(
                st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "bot"]), "content": st.text()}),
                max_size=3,
            ),
            "reward": st.none() | st.floats(),
            "demo_messages": st.none() | st.integers(-2, 3),
        },
    ),
    min_size=1,
    max_size=4,
)


@FILES
@given(rows=parquet_rows)
def test_parquet_of_any_rows_loads_or_raises_an_omrl_error(tmp_path, rows):
    try:
        data = _parquet(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # rows whose column types differ: not a file anyone can write
        return
    path = tmp_path / "data.parquet"
    path.write_bytes(data)
    load_or_error(path)


# -- config overrides --------------------------------------------------------------------------------

_KEYS = st.sampled_from(
    [
        "steps",
        "group_size",
        "optim.learning_rate",
        "reward.weights",
        "env.name",
        "algorithm.gamma",
        "algo",
        "kl_coef",
        "model",
        "model.lora_target_modules",
        "plugins.webshop.x",
        "nosuch",
        "optim",
        "generation.temperature",
        "logging.save_steps",
        "",
    ]
)
_VALUES = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "{goal:1}",
            "{goal: 1}",
            "[1, 2",
            "1e-3",
            "-1",
            "null",
            "true",
            "{a: {b: c}}",
            "!!python/object:os.system",
            "&a *a",
            "'",
            "1" * 400,
            "[" * 500,
        ]
    ),
)


@FAST
@given(
    st.lists(st.one_of(st.tuples(_KEYS, _VALUES).map(lambda kv: f"{kv[0]}={kv[1]}"), st.text(max_size=30)), max_size=4)
)
def test_any_command_line_overrides_give_a_config_or_a_config_error(overrides):
    from omrl.config import load_config
    from omrl.config.options import TrainRunConfig
    from omrl.errors import ConfigError

    try:
        cfg = load_config(TrainRunConfig, "grpo", overrides)
    except ConfigError as err:
        assert str(err) and len(str(err)) < 5_000  # one readable line, not a dump of the input
    else:
        assert isinstance(cfg, TrainRunConfig)
