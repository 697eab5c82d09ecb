"""Tokenizers for the chat templates PyPI ``trl`` ships as package data, found at test time: the tiny
tokenizer with each template's structure tokens added as its family's tokenizer has them (``<|...|>``-style
strings special, Qwen-style tags such as ``<think>`` added but not special), a begin-of-text token where the
template writes one, and the end token the model stops at: the last special token the template closes a
reply with (or, where it writes none, the one that opens the next turn: GLM's ``<|user|>``)."""

from __future__ import annotations

import importlib.resources
import re
from functools import lru_cache

from transformers import AutoTokenizer

from omrl.chat.replies import leading_specials, reply_shape, special_strings
from omrl.models import TINY_TOKENIZER_DIR

TEMPLATES = importlib.resources.files("trl") / "chat_templates"
SPECIAL = re.compile(
    r"<\|[A-Za-z_0-9\"]+\|>|<\|[A-Za-z_0-9]+>|<[A-Za-z_0-9]+\|>|<｜[^｜<>]+｜>"
    r"|<(?:start|end)_of_turn>|<end_of_utterance>|<start_of_image>|<sop>"
)
ADDED = re.compile(r"</?(?:think|tool_call|tool_response|tools|arg_key|arg_value)>")


def template_names() -> list[str]:
    """Every chat template trl ships (originals and ``_training`` variants), by file name."""
    return sorted(p.name.removesuffix(".jinja") for p in TEMPLATES.iterdir() if p.name.endswith(".jinja"))


def family_tokenizer(name: str):
    source = (TEMPLATES / f"{name}.jinja").read_text()
    tokenizer = AutoTokenizer.from_pretrained(TINY_TOKENIZER_DIR)
    tokenizer.chat_template = source
    tokenizer.add_special_tokens({"additional_special_tokens": sorted(set(SPECIAL.findall(source)))})
    if ADDED.search(source):
        tokenizer.add_tokens(sorted(set(ADDED.findall(source))))
    if "bos_token" in source and tokenizer.bos_token is None:
        tokenizer.add_special_tokens({"bos_token": "<|omrl_bos|>"})
    end = _end_token(tokenizer)
    if end:
        tokenizer.eos_token = end
    return tokenizer


def _end_token(tokenizer) -> str | None:
    closing = reply_shape(tokenizer, {}).closing
    if closing:
        return closing[-1]
    chat = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "omrl answer"},
        {"role": "user", "content": "Q2"},
    ]
    try:
        text = tokenizer.apply_chat_template(chat, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that wants other content: no end token found
        return None
    after = text[text.rindex("omrl answer") + len("omrl answer") :].lstrip()
    lead = leading_specials(after, special_strings(tokenizer))
    return lead[0] if lead else None


CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def metaspace_tokenizer(template: str = CHATML):
    """A SentencePiece-shaped tokenizer, built offline: BPE under a Metaspace pre-tokenizer with
    ``prepend_scheme='first'``, as transformers converts Llama's and Mistral's (``legacy=False``): a text's
    start is encoded with a '▁' that the same text after a special token does not get. ChatML by default."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_metaspace_model(),
        bos_token="<s>",
        eos_token="<|im_end|>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tokenizer.chat_template = template
    return tokenizer


@lru_cache(maxsize=1)
def _metaspace_model_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    corpus = ["Where is the key? In the drawer. Open the door. You did open it. user assistant system\n"] * 50
    model = Tokenizer(models.BPE(unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    model.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    alphabet = [chr(c) for c in range(32, 127)] + ["\n", "\t", "\u2581"]
    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    model.train_from_iterator(
        corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=specials, initial_alphabet=alphabet)
    )
    return model.to_str()


def _metaspace_model():
    from tokenizers import Tokenizer

    return Tokenizer.from_str(_metaspace_model_json())
