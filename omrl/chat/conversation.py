"""Whole conversations (SFT and reward-model data) laid out as a rollout lays them out: above
:mod:`omrl.chat.history`, whose increments it strings together.

A reply's ids are the text the model would sample after the generation prompt: its
content, with its reasoning when it has some (``<think>...</think>`` in the content, or
a ``reasoning_content`` field written as the template writes it) and its structured
``tool_calls`` in the template's format, then the end-of-turn token. Between replies
come the ids :func:`omrl.chat.history.next_prompt` gives in the chosen history mode,
so SFT trains on the rows the rollout will generate in.
"""

from __future__ import annotations

from typing import Any, Sequence

from omrl.chat.encoding import encode_continued, mark_messages
from omrl.chat.history import next_prompt
from omrl.chat.increments import prompt_ids
from omrl.chat.render import Message, render
from omrl.chat.replies import REASONING_FIELDS, parse_reply, reply_shape, sampled_end
from omrl.errors import OmrlError, short_repr

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

Rows = list[tuple[list[int], list[int]]]


def conversation_rows(tokenizer, messages: Sequence[Message], history: str = "keep", **kwargs: Any) -> Rows:
    """Ids and loss mask of each row of a whole conversation (one row, except where ``as_template``
    splits). The mask is 1 on each reply's ids and its end-of-turn token, 0 elsewhere."""
    first_reply = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first_reply is None:
        raise OmrlError("conversation has no assistant message to learn from")
    messages = mark_messages(tokenizer, [reasoning_in_field(tokenizer, m, i, kwargs) for i, m in enumerate(messages)])
    ids = prompt_ids(tokenizer, messages[:first_reply], **kwargs)
    mask = [0] * len(ids)
    rows: Rows = []
    said: list[Message] = [dict(m) for m in messages[:first_reply]]  # the chat as the template is given it
    i = first_reply
    while i < len(messages):
        reply = messages[i]
        if reply.get("role") != "assistant":
            raise OmrlError(
                f"message {i} has role {reply.get('role')!r} where an assistant reply was expected "
                "(after the opening messages, each reply is followed by user or tool messages)"
            )
        text = reply_text(tokenizer, [dict(m) for m in messages[:i]], reply, **kwargs)  # as the dataset has it
        reply_ids = encode_continued(tokenizer, text)  # as it follows its generation prompt
        ids, mask = ids + reply_ids, mask + [1] * len(reply_ids)
        nxt = next((j for j in range(i + 1, len(messages)) if messages[j].get("role") == "assistant"), len(messages))
        new = [dict(m) for m in messages[i + 1 : nxt]]
        bad = next((m for m in new if m.get("role") not in ("user", "tool")), None)
        if bad is not None:
            raise OmrlError(f"a message with role {bad.get('role')!r} follows reply {i}; expected user or tool")
        if not new and nxt < len(messages):
            raise OmrlError(
                f"message {nxt} has role 'assistant' right after reply {i}; a user or tool message "
                "must come between two replies"
            )
        if not new:
            break
        # keep: the history holds the reply as sampled; as_template: as the template reads it back (its fields)
        end = sampled_end(tokenizer, text, kwargs)
        sampled = {"role": "assistant", "content": text[: len(text) - len(end)]}
        if reply.get("tool_calls"):  # what follows a call is rendered after the call itself, as the template has it
            sampled = dict(reply)
        said.append(sampled if history == "keep" else _as_read_back(tokenizer, reply, kwargs))
        increment, starts_row = next_prompt(tokenizer, history, ids, said, new, end, **kwargs)
        if starts_row:
            rows.append((ids, mask))
            ids, mask = [], []
        ids, mask = ids + increment, mask + [0] * len(increment)
        said += new
        i = nxt
    rows.append((ids, mask))
    return rows


def reasoning_in_field(tokenizer, message: Message, at: int, kwargs: dict) -> Message:
    """``message`` with its reasoning in the field the chat template reads (a dataset's ``thinking`` becomes
    ``reasoning_content`` for Qwen3, and the reverse for gpt-oss); a reply whose reasoning the template has no
    field for is an error, never dropped."""
    given = [name for name in REASONING_FIELDS if message.get(name)]
    if message.get("role") != "assistant" or not given:
        return message
    wanted = reply_shape(tokenizer, kwargs).field
    if wanted is None:
        raise OmrlError(
            f"message {at} carries reasoning in {given[0]!r}, but the chat template writes no reasoning "
            f"(it reads none of {', '.join(REASONING_FIELDS)}); put it in the content, or drop it"
        )
    out = {key: value for key, value in message.items() if key not in REASONING_FIELDS}
    out[wanted] = message[given[0]]
    return out


def _as_read_back(tokenizer, reply: Message, kwargs: dict) -> Message:
    """A dataset's reply as a server's reasoning parser would return it: reasoning written inline in the
    content moves to the field the template reads, or stays inline where it reads none (DeepSeek-R1's: the
    template itself keeps or drops it); a reply that has the field already is as given."""
    if any(reply.get(name) for name in REASONING_FIELDS) or not isinstance(reply.get("content"), str):
        return dict(reply)
    parsed = parse_reply(tokenizer, reply["content"], kwargs, sampled=False)
    return {**reply, **parsed.message}


def _after_opened_block(tokenizer, before: Sequence[Message], whole: str, kwargs: dict) -> str:
    """What the model samples after a generation prompt that opens a reasoning block (``<think>\\n``) for a
    reply the template writes otherwise (a tool call, an answer without reasoning): Nemotron 3 writes one after
    an empty ``<think></think>``, so the model closes the block it was given; DeepSeek-R1 and V3 write one with
    no block, so it closes the block first.
    ``''`` where the reply does not start as the generation prompt does."""
    base = render(tokenizer, before, **kwargs)
    prompt = render(tokenizer, before, add_generation_prompt=True, **kwargs)[len(base) :]
    if not whole.startswith(base) or not prompt.rstrip().endswith(THINK_OPEN):
        return ""
    reply = whole[len(base) :]
    opened = prompt.rstrip()[: -len(THINK_OPEN)]  # the prompt before the block it opens
    if reply.startswith(opened + THINK_OPEN):
        return reply[len(opened + THINK_OPEN) :]
    if reply.startswith(opened):
        return f"{THINK_CLOSE}\n\n" + reply[len(opened) :]
    return ""


def encode_conversation(tokenizer, messages: Sequence[Message], **kwargs: Any) -> tuple[list[int], list[int]]:
    """Ids and loss mask of a whole conversation as one row (``keep`` history)."""
    return conversation_rows(tokenizer, messages, "keep", **kwargs)[0]


def reply_text(tokenizer, before: Sequence[Message], reply: Message, **kwargs: Any) -> str:
    """The text the model samples for ``reply`` after ``before``'s generation prompt, end-of-turn token included.

    What the template writes for ``reply`` as the last message, after its generation prompt, up to its
    end-of-turn token: the reasoning block (Qwen3 writes an empty one when there is none), a
    ``reasoning_content`` field, structured ``tool_calls``, gpt-oss's channel header. Where the template's
    last reply does not follow its generation prompt (DeepSeek-R1's prompt opens ``<think>``, its replies
    drop it): a reply with reasoning is its content, continuing the ``<think>`` the prompt opened, then the
    end-of-turn token; one without closes the block first, as the template writes it (``</think>``).

    The messages' text is marked (:mod:`omrl.chat.encoding`): encode the result with
    :func:`omrl.chat.encoding.encode_continued` (it follows the generation prompt), which parses only the
    template's special tokens.
    """
    before, reply = mark_messages(tokenizer, before), mark_messages(tokenizer, [reply])[0]
    eos = tokenizer.eos_token or ""
    shape = reply_shape(tokenizer, kwargs)
    opened = render(tokenizer, before, add_generation_prompt=True, **kwargs)
    whole = render(tokenizer, [*before, dict(reply)], **kwargs)
    body = whole[len(opened) :] if whole.startswith(opened) else ""
    if not body and (reply.get("tool_calls") or not _has_reasoning(reply)):  # the model closes the block it was given
        body = _after_opened_block(tokenizer, before, whole, kwargs)
    stop = min((body.find(s) + len(s) for s in shape.stops or (eos,) if s and s in body), default=-1)
    if stop > 0:  # the model stops at its first stop token: a template's text after it is not sampled
        body = body[:stop]
    elif body and reply.get("tool_calls") and shape.call_end:  # GLM writes no end: its model stops at the next turn
        body += shape.call_end
    if stop > 0 or body and reply.get("tool_calls") and shape.call_end:
        reasoning = reply.get(shape.field or "")
        if isinstance(reasoning, str) and reasoning and reasoning not in body and shape.closes:
            # a final reply's reasoning the template does not write (Gemma 4 writes its thought channel only
            # beside tool calls): the model samples it where the template writes it elsewhere
            body = shape.opens + reasoning + shape.closes + body
        _check_calls_written(reply, body, len(before))
        return body
    if reply.get("tool_calls"):
        raise OmrlError(
            "the chat template does not write a reply's tool calls after its generation prompt, "
            "so the text the model would sample is unknown; `omrl check-template MODEL` shows why"
        )
    content = reply.get("content") or ""
    if reply.get("reasoning_content"):
        content = f"{THINK_OPEN}\n{reply['reasoning_content'].strip()}\n</think>\n\n{content.lstrip()}"
    if content.startswith(THINK_OPEN):
        opening = opened[len(render(tokenizer, before, **kwargs)) :]  # the generation prompt's own text
        cut = opening.rfind(THINK_OPEN)
        if cut >= 0 and not opening[cut + len(THINK_OPEN) :].strip():
            content = content[len(THINK_OPEN) :].lstrip("\n") if opening.endswith("\n") else content[len(THINK_OPEN) :]
    return content + eos


def _has_reasoning(reply: Message) -> bool:
    """Whether a dataset's reply carries reasoning: in a field, or as a block in its content."""
    content = reply.get("content")
    inline = isinstance(content, str) and (THINK_OPEN in content or THINK_CLOSE in content)
    return inline or any(reply.get(name) for name in REASONING_FIELDS)


def _check_calls_written(reply: Message, body: str, at: int) -> None:
    """Refuse a reply whose tool calls the template left out of its text (ChatML templates that write no tool
    calls render the reply as its end-of-turn token alone): SFT would learn to answer without calling."""
    functions = [call.get("function", call) for call in reply.get("tool_calls") or [] if isinstance(call, dict)]
    names = [function.get("name") for function in functions if isinstance(function, dict)]
    missing = next((name for name in names if isinstance(name, str) and name and name not in body), None)
    if missing is not None:
        raise OmrlError(
            f"message {at} calls {missing}, but the chat template does not write tool calls (it wrote "
            f"{short_repr(body)}), so SFT would learn the reply without them; write the call into the reply's "
            "content, or use a model whose template writes tool calls (`omrl check-template MODEL` shows)"
        )
