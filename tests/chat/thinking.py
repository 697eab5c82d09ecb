"""Thinking-model fixtures written here: three chat templates that rewrite history as real families do,
a tiny random-init ``Qwen3ForCausalLM`` to carry them, and a backend whose replies are scripted text
but whose log-probs are the model's own (so on-policy checks compare real numbers)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from omrl.backends.base import Backend, Generation, SamplingParams
from omrl.hookspecs import hookimpl
from omrl.models.loading import TINY_LAYERS, save_random_model
from omrl.templates import ParsedAction, Template


# (a) Qwen3's rule: the <think> block of every reply before the last user message is dropped; a reply
# after it is written with its block, an empty one when it has none.
def chatml(reply: str, before: str = "", generation_prompt: str = "<|im_start|>assistant\n") -> str:
    """A ChatML template whose replies are written by the Jinja ``reply`` (the rule that tells families apart):
    every other message as it is, ``before`` ahead of the messages, ``generation_prompt`` after them."""
    return (
        "\n"
        + before
        + "{%- for m in messages -%}\n{%- if m.role == 'assistant' -%}\n"
        + reply.strip("\n")
        + "\n{%- else -%}\n{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}\n{%- endif -%}"
        + "\n{%- endfor -%}\n"
        + "{%- if add_generation_prompt -%}{{- '"
        + generation_prompt.replace("\n", "\\n")
        + "' -}}{%- endif -%}\n"
    )


DROPS_REASONING = chatml(
    r"""
{%- set content = m.content or '' -%}
{%- set reasoning = m.reasoning_content if m.reasoning_content is string else '' -%}
{%- if '</think>' in content -%}
{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\n') -%}
{%- set content = content.split('</think>')[-1].lstrip('\n') -%}
{%- endif -%}
{%- if loop.index0 > ns.last_user -%}
{{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content + '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>assistant\n' + content + '<|im_end|>\n' -}}
{%- endif -%}
""",
    before="{%- set ns = namespace(last_user=-1) -%}\n{%- for m in messages -%}{%- if m.role == 'user' -%}"
    "{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}\n",
)

# (b) DeepSeek-R1's rule: every reply keeps only its text after </think>; the generation prompt opens <think>.
KEEPS_ANSWER = chatml(
    r"""
{%- set content = m.content or '' -%}
{%- if '</think>' in content -%}{%- set content = content.split('</think>')[-1].lstrip('\n') -%}{%- endif -%}
{{- '<|im_start|>assistant\n' + content + '<|im_end|>\n' -}}
""",
    generation_prompt="<|im_start|>assistant\n<think>\n",
)

# (c) native tool calls (Hermes/Qwen format): tools in the system message, a reply's structured
# tool_calls written as <tool_call> JSON, results as `tool` messages inside <tool_response>.
TOOL_ROLE = r"""
{%- if tools -%}
{{- '<|im_start|>system\n' + (messages[0].content + '\n\n' if messages[0].role == 'system' else '') -}}
{{- '# Tools\n<tools>' -}}{%- for t in tools -%}{{- '\n' + (t | tojson) -}}{%- endfor -%}{{- '\n</tools><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'user' -%}
{{- '<|im_start|>user\n' + m.content + '<|im_end|>\n' -}}
{%- elif m.role == 'assistant' -%}
{{- '<|im_start|>assistant\n' + (m.content or '') -}}
{%- for call in (m.tool_calls or []) -%}
{%- set f = call.function if call.function else call -%}
{{- ('\n' if (m.content or not loop.first) else '') + '<tool_call>\n{"name": "' + f.name + '", "arguments": ' -}}
{{- (f.arguments if f.arguments is string else (f.arguments | tojson)) + '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif m.role == 'tool' -%}
{{- '<|im_start|>user\n<tool_response>\n' + m.content + '\n</tool_response><|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

TEMPLATES = {"drops_reasoning": DROPS_REASONING, "keeps_answer": KEEPS_ANSWER, "tool_role": TOOL_ROLE}


LLAMA3_SPECIALS = (
    ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"],
    "<|eot_id|>",
    "<|begin_of_text|>",
)


def family_tokenizer(template: str, specials: tuple = ((), None, None)):
    """omrl's tiny tokenizer with ``template`` and a model family's special tokens (end and begin of text)."""
    from transformers import AutoTokenizer

    from omrl.models import TINY_TOKENIZER_DIR

    tok = AutoTokenizer.from_pretrained(TINY_TOKENIZER_DIR)
    tok.chat_template = template.strip()
    added, eos, bos = specials
    if added:
        tok.add_special_tokens({"additional_special_tokens": list(added)})
    if eos:
        tok.eos_token = eos
    if bos:
        tok.bos_token = bos
    return tok


def update_log_probs(model, tokenizer, episodes) -> tuple:
    """The episodes as an update reads them (rewarded for ``goal``, in one batch): that batch and the policy
    forward's output on it (``log_probs`` per token), with the batch's position ids where its rows are packed."""
    from omrl.rewards import compose_rewards
    from omrl.training.policy import policy_forward
    from omrl.training.rl_data import episodes_to_batch

    compose_rewards(episodes, {"goal": 1.0})
    batch = episodes_to_batch(episodes, tokenizer.pad_token_id)
    with torch.no_grad():
        out = policy_forward(
            model,
            batch["input_ids"],
            batch["attention_mask"],
            token_mask=batch["loss_mask"],
            position_ids=batch.tensors.get("position_ids"),
        )
    return batch, out


def trl_template(name: str) -> str:
    """A real model family's chat template, from the package data of PyPI `trl`."""
    import importlib.resources

    return (importlib.resources.files("trl") / "chat_templates" / f"{name}.jinja").read_text()


def build_qwen3_like(out: Path, template: str, specials: tuple = ((), None, None)) -> Path:
    """A tiny random-init Qwen3ForCausalLM (seed 0) with omrl's tiny tokenizer (plus ``specials``) and ``template``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = family_tokenizer(template, specials)
    sizes = {"hidden_size": 64, "intermediate_size": 128, "head_dim": 16, "max_position_embeddings": 4096}
    ends = {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    config = Qwen3Config(vocab_size=len(tok), **sizes, **TINY_LAYERS, tie_word_embeddings=True, **ends)
    save_random_model(Qwen3ForCausalLM, config, tok, out)
    return out


class ForcedBackend(Backend):
    """Replies are scripted (``reply(call, index, prompt_ids) -> text``, closed with the end-of-turn token),
    their log-probs the model's own at temperature 1 given exactly the prompt ids it was handed. Every
    prompt it was given is kept in ``prompts``."""

    name = "forced"

    def __init__(self, model, tokenizer, reply: Callable[[int, int, list[int]], str]):
        super().__init__(tokenizer, batch_size=8)
        self.model, self.reply = model, reply
        self.prompts: list[list[int]] = []
        self.calls = 0

    @torch.no_grad()
    def generate(self, prompts, params: SamplingParams, messages=None) -> list[Generation]:
        out = []
        for i, prompt in enumerate(prompts):
            self.prompts.append(list(prompt))
            ids = self.tokenizer.encode(self.reply(self.calls, i, list(prompt)), add_special_tokens=False)
            ids = (ids + [self.eos_token_id])[: params.limit(i)]
            logits = self.model(input_ids=torch.tensor([list(prompt) + ids])).logits[0].float()
            picked = torch.log_softmax(logits[len(prompt) - 1 : -1], -1).gather(-1, torch.tensor(ids)[:, None])
            out.append(Generation(ids, picked[:, 0].tolist(), "stop" if ids[-1] == self.eos_token_id else "length"))
        self.calls += 1
        return out

    def update_weights(self, state_dict) -> None:
        self.model.load_state_dict(state_dict)


class ThinkingActionTemplate(Template):
    """``Action: <action>`` after an optional reasoning block: the action is read from the text after
    ``</think>`` (a thinking model's answer)."""

    def system_prompt(self, env):
        return f"Think, then act. {env.action_help}"

    def parse(self, response, env):
        answer = response.split("</think>")[-1].strip()
        if answer.startswith("Action:") and answer[len("Action:") :].strip():
            return ParsedAction(answer[len("Action:") :].strip(), True)
        return ParsedAction(None, False, error="the answer must start with `Action:`")

    def format_action(self, action, env, thought=""):
        return f"<think>\n{thought or 'I act.'}\n</think>\n\nAction: {action}"


class ThinkingPlugin:
    """The keys env (tests/fakes.py) and the thinking action template, as plugins."""

    @hookimpl
    def register_envs(self, register):
        from tests.fakes import KeyEnv

        class ReplayableKeyEnv(KeyEnv):
            deterministic = True  # searches fork it by replaying actions from reset

        register("keys", ReplayableKeyEnv)

    @hookimpl
    def register_templates(self, register):
        register("think_action", ThinkingActionTemplate)

    @hookimpl
    def register_rewards(self, register):
        def sample_index(episodes):
            """The sample's index, on the last turn: every group's rewards differ."""
            return [[0.0] * (len(ep.turns) - 1) + [float(ep.sample)] for ep in episodes]

        register("sample_index", sample_index)


def key_replies(opens_think: bool) -> Callable[[int, int, list[int]], str]:
    """Scripted replies for the keys env with real reasoning: open the chest, then take the key (a
    template whose generation prompt opens ``<think>`` gets the reply without its opening tag)."""

    def reply(call: int, index: int, prompt: list[int]) -> str:
        action = "open" if call == 0 else "take key"
        thought = f"Chest step {call}: I should {action}."
        return (
            f"{thought}\n</think>\n\nAction: {action}"
            if opens_think
            else f"<think>\n{thought}\n</think>\n\nAction: {action}"
        )

    return reply
