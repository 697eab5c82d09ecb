"""Token-exact conversations: a chat is built by appending chat-template increments.

The rollout never decodes and re-encodes a model turn. It keeps the sampled ids
as they are and appends, after each turn, only the ids of the text the chat
template adds for the next message (closing newline, the user's observation,
the next generation prompt). SFT builds its sequences the same way, so a model
is trained on the token layout it will later generate in.

Works for any chat template whose rendering of a longer chat starts with the
rendering of the shorter one (ChatML, Llama-3, SmolLM2, Qwen2.5); others raise.
"""

from __future__ import annotations

from typing import Any, Sequence

from omrl.errors import OmrlError

Message = dict[str, str]


def render(tokenizer, messages: Sequence[Message], add_generation_prompt: bool = False, **kwargs: Any) -> str:
    """The chat template applied to ``messages`` as text."""
    if not getattr(tokenizer, "chat_template", None):
        raise OmrlError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; "
                        "use a chat/instruct model or set tokenizer.chat_template")
    return tokenizer.apply_chat_template(list(messages), tokenize=False,
                                         add_generation_prompt=add_generation_prompt, **kwargs)


def encode_text(tokenizer, text: str) -> list[int]:
    """Token ids of a template fragment (special tokens in the text are parsed as such)."""
    return tokenizer.encode(text, add_special_tokens=False) if text else []


def prompt_ids(tokenizer, messages: Sequence[Message], **kwargs: Any) -> list[int]:
    """Ids of the opening messages (system, first user) plus the first generation prompt."""
    return encode_text(tokenizer, render(tokenizer, messages, add_generation_prompt=True, **kwargs))


def _suffix(longer: str, shorter: str, what: str) -> str:
    if not longer.startswith(shorter):
        raise OmrlError(f"the chat template is not prefix-stable ({what}): rendering a longer chat "
                        "changed earlier text, so turns cannot be appended token-exactly")
    return longer[len(shorter):]


def generation_end(tokenizer, messages: Sequence[Message], **kwargs: Any) -> str:
    """The text the template puts after the last assistant message's content (e.g. '<|im_end|>\\n')."""
    content = messages[-1]["content"]
    text = render(tokenizer, messages, **kwargs)
    # locate the content from the front: a short reply such as "end" also occurs inside "<|im_end|>"
    before = render(tokenizer, messages[:-1], add_generation_prompt=True, **kwargs) + content
    if not text.startswith(before):
        raise OmrlError("the chat template rewrites assistant messages; cannot append turns token-exactly")
    return text[len(before):]


def next_turn_ids(tokenizer, messages: Sequence[Message], user_content: str,
                  generated_eos: bool, **kwargs: Any) -> list[int]:
    """Ids to append after a model turn so the chat continues with ``user_content``.

    ``messages`` ends with the assistant turn just generated (its decoded text
    without the end-of-turn token); ``generated_eos`` says whether the sampled
    ids already end with the tokenizer's end-of-turn token. When they do not
    (the turn was cut at the token limit), the end-of-turn text is part of the
    increment, so it carries loss_mask 0 like every template token.
    """
    after = generation_end(tokenizer, messages, **kwargs)
    eos = tokenizer.eos_token or ""
    if generated_eos and eos and after.startswith(eos):
        after = after[len(eos):]
    before = render(tokenizer, messages, **kwargs)
    longer = render(tokenizer, [*messages, {"role": "user", "content": user_content}],
                    add_generation_prompt=True, **kwargs)
    return encode_text(tokenizer, after + _suffix(longer, before, "adding a user turn"))


def encode_conversation(tokenizer, messages: Sequence[Message], **kwargs: Any) -> tuple[list[int], list[int]]:
    """Ids and loss mask of a whole conversation, laid out exactly as a rollout lays it out.

    The mask is 1 on each assistant message's content ids and its end-of-turn
    token (what the model generates), 0 on everything else.
    """
    first_reply = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first_reply is None:
        raise OmrlError("conversation has no assistant message to learn from")
    ids = prompt_ids(tokenizer, messages[:first_reply], **kwargs)
    mask = [0] * len(ids)
    eos = tokenizer.eos_token or ""
    i = first_reply
    while i < len(messages):
        reply = messages[i]
        if reply["role"] != "assistant":
            raise OmrlError(f"message {i} has role {reply['role']!r} where an assistant reply was expected "
                            "(roles must alternate user/assistant after the opening messages)")
        content_ids = encode_text(tokenizer, reply["content"] + eos)
        ids += content_ids
        mask += [1] * len(content_ids)
        if i + 1 < len(messages):
            if messages[i + 1]["role"] not in ("user", "tool"):
                raise OmrlError(f"message {i + 1} has role {messages[i + 1]['role']!r}; expected user")
            inc = next_turn_ids(tokenizer, messages[: i + 1], messages[i + 1]["content"], bool(eos), **kwargs)
            ids += inc
            mask += [0] * len(inc)
        i += 2
    return ids, mask
