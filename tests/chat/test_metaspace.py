"""A SentencePiece-shaped tokenizer (Metaspace, ``prepend_scheme='first'``: Llama's and Mistral's as transformers
converts them) encodes a text's start with a '▁' that the same text inside a chat does not get: every span omrl
encodes apart (a turn's increment, a reply) must still be the ids of that span of the template's whole render."""

from __future__ import annotations

from omrl.chat import conversation_rows, encode_chat, next_prompt, prompt_ids, render
from omrl.chat.conformance import _increment_problem, conformance

from .families import metaspace_tokenizer

CHAT = [
    {"role": "user", "content": "Where is the key?"},
    {"role": "assistant", "content": "In the drawer."},
    {"role": "user", "content": "Open the door."},
    {"role": "assistant", "content": "You did open it."},
]


def own_ids(tokenizer, messages, generation=False):
    """The tokenizer's own ids of the template's render: what a row must be."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_tokenizer_marks_a_texts_start():  # the shape the tests below are about
    tokenizer = metaspace_tokenizer()
    alone, inside = (tokenizer.encode(t, add_special_tokens=False) for t in ("\nOpen", "<|im_end|>\nOpen"))
    assert tokenizer.convert_ids_to_tokens(alone)[0] == "\u2581" and alone[1:] == inside[1:]


def test_a_keep_increment_is_the_templates_own_ids_after_the_reply():
    tokenizer = metaspace_tokenizer()
    row = prompt_ids(tokenizer, CHAT[:1])
    assert row == own_ids(tokenizer, CHAT[:1], generation=True)
    whole = own_ids(tokenizer, CHAT[:2])
    row = whole[: len(whole) - 1]  # the reply sampled as the template encodes it (less the '\n' after its end)
    increment, starts_row = next_prompt(tokenizer, "keep", row, CHAT[:2], CHAT[2:3], "<|im_end|>")
    assert not starts_row
    assert row + increment == own_ids(tokenizer, CHAT[:3], generation=True)  # no '▁' before the '\n'


def test_an_sft_row_is_the_templates_own_ids():
    tokenizer = metaspace_tokenizer()
    for history in ("keep", "as_template"):
        [(ids, mask)] = conversation_rows(tokenizer, CHAT, history)
        whole = own_ids(tokenizer, CHAT)
        assert ids == whole[: len(ids)] and tokenizer.decode(whole[len(ids) :]) == "\n"
        trained = tokenizer.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)
        assert trained == "In the drawer.<|im_end|>You did open it.<|im_end|>"


def test_conformance_passes_every_case_on_it():
    results = conformance(metaspace_tokenizer())
    assert {(r.mode, r.case): r.status for r in results if r.status not in ("ok", "n/a")} == {}
    assert {r.status for r in results if r.case in ("plain", "noncanonical")} == {"ok"}


def test_the_keep_check_compares_with_the_whole_renders_ids():
    tokenizer = metaspace_tokenizer()
    expected, new = CHAT[:2], CHAT[2:3]
    full = render(tokenizer, [*expected, *new], add_generation_prompt=True)
    after = full[full.index("drawer.<|im_end|>") + len("drawer.<|im_end|>") :]
    alone = encode_chat(tokenizer, after)  # the increment encoded as a text of its own: a '▁' opens it
    whole = own_ids(tokenizer, [*expected, *new], generation=True)
    right = whole[len(own_ids(tokenizer, expected)) - 1 :]  # after the reply's end token
    assert alone != right
    text = "In the drawer.<|im_end|>"
    problem = _increment_problem(tokenizer, list(expected), list(new), text, "<|im_end|>", alone, {}, "keep", 1)
    assert problem.startswith("after reply 1 keep appends")
    assert _increment_problem(tokenizer, list(expected), list(new), text, "<|im_end|>", right, {}, "keep", 1) == ""
