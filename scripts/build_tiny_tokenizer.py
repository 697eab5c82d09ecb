"""Build the byte-level BPE tokenizer that the built-in `tiny` model ships with.

Run once; the output in omrl/assets/tiny_tokenizer/ is committed, so `tiny` is
the same on every machine. Corpus: English text from the Python standard
library's docstrings plus the vocabulary of omrl's built-in environments.

    python scripts/build_tiny_tokenizer.py
"""

import ast
import sys
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

OUT = Path(__file__).resolve().parents[1] / "omrl" / "assets" / "tiny_tokenizer"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
CHAT_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    '{{- \'You may call these tools. Reply with <tool_call>{"name": ..., "arguments": {...}}</tool_call>.\\n\' }}'
    "{%- for tool in tools %}{{- (tool | tojson) + '\\n' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- for message in messages %}{%- if not (loop.first and message.role == 'system') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- else %}{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- endif %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
ENV_TEXT = """
Think: Act: <think> </think> <action> </action> search[ click[ buy now ] back to search next > < prev
description features reviews Instruction: WebShop [SEP] Search Price: $ Rating: N.A. Total results
i need i want i am looking for a pack of ounce count size color small medium large x-large black white
blue red green grey gray pink brown natural gluten free organic long lasting easy to use price lower than
dollars up down left right move push box goal wall floor you are at the maze grid step reward won lost
go north south east west take open close look inventory craft get the with from using
"""


def corpus() -> list[str]:
    texts = [ENV_TEXT] * 200
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py"))[:400]:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module)):
                doc = ast.get_docstring(node)
                if doc:
                    texts.append(doc)
    return texts


def main() -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4096,
        min_frequency=2,
        special_tokens=SPECIAL,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=SPECIAL[1:2],
    )
    fast.chat_template = CHAT_TEMPLATE
    OUT.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(OUT)
    print(f"wrote {OUT} ({len(fast)} tokens)", file=sys.stderr)


if __name__ == "__main__":
    main()
