"""The cached chat-template pieces give exactly the ids of full renders, and a template they cannot
be proven for is rendered in full (omrl.chat.pieces and omrl.chat.increments, issue 16)."""

from __future__ import annotations

import random
import warnings

import pytest

from omrl import registry
from omrl.chat import encode_chat, encode_text, mark_messages, next_turn_ids, prompt_ids, render, rendered_turn_text
from omrl.chat import pieces as chat_cache
from omrl.chat.template_check import cacheable_template
from omrl.errors import OmrlError
from omrl.models import load_tokenizer
from omrl.rollout.loop import demonstration_messages

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "move",
            "description": "Move one cell.",
            "parameters": {"type": "object", "properties": {"to": {"type": "string"}}},
        },
    }
]
# bits of text whose joins stress BPE merges: whitespace runs, digits, unicode, special-token look-alikes
BITS = [
    "",
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "\r\n",
    "\u00a0",
    "word",
    "Word",
    " up",
    "down ",
    "'s",
    "123",
    "4.5",
    "...",
    "héllo",
    "世界",
    "🎉",
    "—",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<tool_call>",
    "{{ x }}",
    "{% if %}",
    "Thought:",
    "Action: up",
    "user",
    "assistant\n",
]


@pytest.fixture(params=["tiny", "smollm2"])
def tokenizer(request, tiny_model_dir, smollm2_dir):
    """A fresh tokenizer (so a fresh cache) of each built-in model."""
    return load_tokenizer(tiny_model_dir if request.param == "tiny" else smollm2_dir)


def text(rng: random.Random) -> str:
    size = rng.choice([0, 1, 2, 3, 8, 30, 30, 300])  # empty, short, long
    return "".join(rng.choice(BITS) for _ in range(size))


def full_prompt_ids(tokenizer, messages, **kwargs) -> list[int]:
    """The definition: the ids of the whole rendered opening (the messages' special-token strings kept as
    text: tests/chat/test_special_tokens.py checks that encoding against transformers)."""
    return encode_chat(
        tokenizer, render(tokenizer, mark_messages(tokenizer, messages), add_generation_prompt=True, **kwargs)
    )


def full_turn_ids(tokenizer, messages, user_content, sampled_end, **kwargs) -> list[int]:
    marked = mark_messages(tokenizer, [*messages, {"role": "user", "content": user_content}])
    return encode_chat(
        tokenizer, rendered_turn_text(tokenizer, marked[:-1], marked[-1]["content"], sampled_end, **kwargs)
    )


@pytest.mark.parametrize("seed", [0, *(pytest.param(seed, marks=pytest.mark.slow) for seed in (1, 2, 3))])  # more draws
def test_random_conversations_match_full_renders_token_for_token(tokenizer, seed):
    rng = random.Random(seed)
    for _ in range(6):
        kwargs = rng.choice([{}, {"tools": TOOLS}])
        messages = [{"role": "system", "content": text(rng)}] if rng.random() < 0.75 else []
        for _ in range(rng.randint(0, 2)):  # a worked example
            messages += [{"role": "user", "content": text(rng)}, {"role": "assistant", "content": text(rng)}]
        messages.append({"role": "user", "content": text(rng)})
        assert prompt_ids(tokenizer, messages, **kwargs) == full_prompt_ids(tokenizer, messages, **kwargs)
        for _ in range(rng.randint(1, 6)):
            messages.append({"role": "assistant", "content": text(rng)})
            observation, eos = text(rng), tokenizer.eos_token if rng.random() < 0.7 else ""
            got = next_turn_ids(tokenizer, messages, observation, eos, **kwargs)
            assert got == full_turn_ids(tokenizer, messages, observation, eos, **kwargs), (messages, observation)
            messages.append({"role": "user", "content": observation})
    # the pieces did the work: both built-in templates are provably piecewise, with and without tools
    for kwargs in ({}, {"tools": TOOLS}):
        for has_system in (True, False):
            assert chat_cache.turn_pieces(tokenizer, kwargs, has_system) is not None


def test_after_the_first_turn_nothing_is_rendered(tokenizer, monkeypatch):
    env, tpl = registry.envs.get("gridworld")(), registry.templates.get("react")()
    first = env.reset(0)
    opening = [
        {"role": "system", "content": tpl.system_prompt(env)},
        *demonstration_messages(tpl, env, env.demonstration),
        {"role": "user", "content": f"{first.instruction}\n\n{first.text}"},
    ]
    chat = [*opening, {"role": "assistant", "content": "Action: up"}]
    prompt_ids(tokenizer, opening)
    next_turn_ids(tokenizer, chat, "blocked.", tokenizer.eos_token)  # pieces derived and checked against a full render
    renders = []
    real = tokenizer.apply_chat_template
    monkeypatch.setattr(tokenizer, "apply_chat_template", lambda *a, **k: renders.append(1) or real(*a, **k))
    expected = []
    for task in range(1, 6):
        first = env.reset(task)
        other = [*opening[:-1], {"role": "user", "content": f"{first.instruction}\n\n{first.text}"}]
        observation = env.step("left").observation
        got = (
            prompt_ids(tokenizer, other),
            next_turn_ids(tokenizer, [*other, chat[-1]], observation, tokenizer.eos_token),
        )
        expected.append((other, observation, got))
    assert renders == []
    monkeypatch.undo()
    for other, observation, (opening_ids, increment) in expected:
        assert opening_ids == full_prompt_ids(tokenizer, other)
        assert increment == full_turn_ids(tokenizer, [*other, chat[-1]], observation, tokenizer.eos_token)


CHATML_TURN = "'<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n'"
GENERATION_PROMPT = "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"


def chatml(body: str, before: str = "") -> str:
    """A ChatML template whose per-message body is ``body`` (a jinja snippet with ``m`` the message)."""
    return before + "{% for m in messages %}" + body + "{% endfor %}" + GENERATION_PROMPT


def late(condition: str) -> str:
    """A ChatML body that marks, after the content, each message where ``condition`` holds."""
    return chatml(
        "{{ '<|im_start|>' + m.role + '\\n' + m.content }}"
        "{% if " + condition + " %}{{ ' (late)' }}{% endif %}{{ '<|im_end|>\\n' }}"
    )


# each is prefix-stable (so the full render works) but its pieces are not fixed, or not provably so
UNPROVABLE = {
    "numbers its turns": chatml(
        "{{ '<|im_start|>' + m.role + '\\n' + m.content + ' #' + (loop.index|string) + '<|im_end|>\\n' }}"
    ),
    "changes past the 7th message": late("loop.index0 > 6"),
    "counts past what the probes cover": late("loop.index0 > 60"),
    "trims contents": chatml("{{ '<|im_start|>' + m.role + '\\n' + (m.content | trim) + '<|im_end|>\\n' }}"),
    "drops earlier thinking": chatml(
        "{{ '<|im_start|>' + m.role + '\\n' }}{% if m.role == 'assistant' and not loop.last %}"
        "{{ m.content.split('</think>')[-1] }}{% else %}{{ m.content }}{% endif %}{{ '<|im_end|>\\n' }}"
    ),
    "is steered by an empty message": chatml(
        "{{ '<|im_start|>' + m.role + '\\n' + m.content + ('!' if ns.empty else '') + '<|im_end|>\\n' }}"
        "{% if not m.content %}{% set ns.empty = true %}{% endif %}",
        before="{% set ns = namespace(empty=false) %}",
    ),
    "writes the date": chatml("{{ " + CHATML_TURN + " }}", before="{{ strftime_now('%Y') }}"),
    "reads contents under no name": chatml(
        "{{ '<|im_start|>' + m.role + '\\n' }}{% for key, value in m.items() %}"
        "{% if key == 'content' %}{{ value }}{% endif %}{% endfor %}"
        "{{ '<|im_end|>\\n' }}"
    ),
}


@pytest.mark.parametrize("why", sorted(UNPROVABLE))
def test_a_template_that_cannot_be_proven_piecewise_renders_in_full(tokenizer, why):
    tokenizer.chat_template = UNPROVABLE[why]
    assert chat_cache.turn_pieces(tokenizer, {}, True) is None
    rng = random.Random(why)
    messages = [{"role": "system", "content": "Play."}]
    for _ in range(5):  # a worked example long enough to pass the 7th message
        messages += [{"role": "user", "content": text(rng)}, {"role": "assistant", "content": f"x{text(rng)}x"}]
    messages.append({"role": "user", "content": "go"})
    assert prompt_ids(tokenizer, messages) == full_prompt_ids(tokenizer, messages)
    for turn in range(4):
        messages.append({"role": "assistant", "content": f"reply {turn}"})
        observation = text(rng)
        assert next_turn_ids(tokenizer, messages, observation, tokenizer.eos_token) == full_turn_ids(
            tokenizer, messages, observation, tokenizer.eos_token
        )
        messages.append({"role": "user", "content": observation})


def test_the_system_prompt_in_the_last_message_still_raises(tokenizer):
    # Mistral-style: the system prompt rides in the last user message, so earlier text changes
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m.role == 'user' %}{{ '<|im_start|>user\\n' }}"
        "{% if loop.last and messages[0].role == 'system' %}{{ messages[0].content + '\\n\\n' }}{% endif %}"
        "{{ m.content + '<|im_end|>\\n' }}{% elif m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' + m.content"
        " + '<|im_end|>\\n' }}{% endif %}{% endfor %}" + GENERATION_PROMPT
    )
    assert chat_cache.turn_pieces(tokenizer, {}, True) is None
    chat = [
        {"role": "system", "content": "Play."},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "up"},
    ]
    with pytest.raises(OmrlError, match="rewrites assistant messages"):
        next_turn_ids(tokenizer, chat, "ok", tokenizer.eos_token)


def test_an_opening_split_where_bpe_could_merge_is_encoded_whole(tokenizer):
    # no special tokens: the text after the shared opening starts with plain text, so no split is proven
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m.role + ':' + m.content + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}"
    )
    assert chat_cache.turn_pieces(tokenizer, {}, True) is not None
    shared = [
        {"role": "system", "content": "Play.  "},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b \n"},
    ]
    for last in ["  spaced", "\n\nlines", "word", "", " 12"]:
        messages = [*shared, {"role": "user", "content": last}]
        assert prompt_ids(tokenizer, messages) == full_prompt_ids(tokenizer, messages)
        chat = [*messages, {"role": "assistant", "content": last + " "}]
        assert next_turn_ids(tokenizer, chat, last, "") == full_turn_ids(tokenizer, chat, last, "")


def test_other_chat_shapes_render_in_full(tokenizer):
    opening = [{"role": "system", "content": "Play."}, {"role": "user", "content": "go"}]
    odd = [
        [*opening, {"role": "assistant", "content": "up", "name": "bot"}],  # a field the template might render
        [*opening, {"role": "tool", "content": "ok"}, {"role": "assistant", "content": "up"}],  # roles off the pattern
        [
            {"role": "user", "content": "go"},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "up"},
        ],
    ]
    for chat in odd:
        assert chat_cache.entry_for(tokenizer, chat, {}, "assistant") is None
        assert next_turn_ids(tokenizer, chat, "next", tokenizer.eos_token) == full_turn_ids(
            tokenizer, chat, "next", tokenizer.eos_token
        )


def test_pieces_that_a_real_turn_contradicts_are_dropped_with_a_warning(tokenizer):
    chat = [
        {"role": "system", "content": "Play."},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "up"},
    ]
    pieces = chat_cache.turn_pieces(tokenizer, {}, True)
    entry = next(iter(chat_cache._CACHES[tokenizer].entries.values()))
    entry.pieces = chat_cache.TurnPieces(
        pieces.end, pieces.before + "wrong ", pieces.after, pieces.first_before, pieces.first_after
    )
    with pytest.warns(RuntimeWarning, match="rendered differently"):
        assert next_turn_ids(tokenizer, chat, "ok", tokenizer.eos_token) == full_turn_ids(
            tokenizer, chat, "ok", tokenizer.eos_token
        )
    assert chat_cache.turn_pieces(tokenizer, {}, True) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert next_turn_ids(tokenizer, chat, "ok", tokenizer.eos_token) == full_turn_ids(
            tokenizer, chat, "ok", tokenizer.eos_token
        )


def test_encode_text_gives_transformers_ids(tokenizer):
    rng = random.Random(0)
    for _ in range(300):
        sample = text(rng)
        assert encode_text(tokenizer, sample) == (tokenizer.encode(sample, add_special_tokens=False) if sample else [])
    # a truncating call leaves the Rust tokenizer truncating; encode_text must not inherit that
    tokenizer("one two three four five", truncation=True, max_length=2)
    long = "word " * 50
    assert len(encode_text(tokenizer, long)) > 2
    assert encode_text(tokenizer, long) == tokenizer.encode(long, add_special_tokens=False)


def test_tokens_added_after_caching_are_seen(tokenizer):
    chat = [
        {"role": "system", "content": "Play."},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "up"},
    ]
    before = next_turn_ids(tokenizer, chat, "ok", tokenizer.eos_token)
    assert prompt_ids(tokenizer, chat[:2]) == full_prompt_ids(tokenizer, chat[:2])
    tokenizer.add_tokens(["assistant\n", "go"], special_tokens=True)  # changes how the cached pieces encode
    after = next_turn_ids(tokenizer, chat, "ok", tokenizer.eos_token)
    assert after != before and after == full_turn_ids(tokenizer, chat, "ok", tokenizer.eos_token)
    assert prompt_ids(tokenizer, chat[:2]) == full_prompt_ids(tokenizer, chat[:2])


@pytest.mark.parametrize(
    "source, cacheable",
    [
        ("{% for m in messages %}{{ m.content if m.content is string else '' }}{% endfor %}", True),
        ("{% for m in messages %}{{ m.get('content') }}{% endfor %}", True),
        ("{% for m in messages|selectattr('role', 'equalto', 'user') %}{{ m.content }}{% endfor %}", True),
        ("{% if messages|length > 1 %}{{ messages[0].content + '!' }}{% endif %}", True),
        ("{% for m in messages %}{{ m.get('content') | upper }}{% endfor %}", False),
        ("{% for m in messages|selectattr('content') %}{{ m.role }}{% endfor %}", False),  # picked by content
        ("{% for m in messages %}{% for part in m.content %}{{ part }}{% endfor %}{% endfor %}", False),
        ("{% for m in messages %}{% set text = m.content %}{{ text }}{% endfor %}", False),
        ("{% for m in messages %}{{ loop.previtem | tojson }}{% endfor %}", False),
        ("{% for m in messages %}{% filter upper %}{{ m.content }}{% endfilter %}{% endfor %}", False),
        ("{% for m in messages %}{% if '<think>' in m.content %}x{% endif %}{% endfor %}", False),
        ("{{ messages | tojson }}", False),
        ("{% for m in messages %}{{ m.content }}{% if loop.index > 20 %}!{% endif %}{% endfor %}", False),
    ],
)
def test_the_syntax_tree_check(source, cacheable):
    assert cacheable_template(source) is cacheable
