"""Native tool calling, token-exact in both history modes (issue 31): a reply's call is parsed into a
structured ``tool_calls`` entry, the env's answer goes back as a ``tool`` message where the chat
template renders one, in the model family's own format (Hermes/Qwen ``<tool_call>`` JSON, Llama 3's
bare ``{"name", "parameters"}`` object). Models without native tool calls keep text replies."""

from __future__ import annotations

import pytest
import torch

from omrl import registry
from omrl.chat import encode_chat, encode_text, mark_messages, render
from omrl.models import load_model
from omrl.rollout import EnvPool, RolloutLimits, collect
from tests.fakes import KeyEnv

from .thinking import LLAMA3_SPECIALS, TOOL_ROLE, ForcedBackend, build_qwen3_like, trl_template, update_log_probs

FAMILIES = {"hermes": (TOOL_ROLE, ((), None, None)), "llama3": ("llama3_2", LLAMA3_SPECIALS)}


@pytest.fixture(scope="module")
def family_model(tmp_path_factory):
    built: dict[str, str] = {}

    def get(fmt: str) -> str:
        if fmt not in built:
            template, specials = FAMILIES[fmt]
            template = trl_template(template) if template == "llama3_2" else template
            built[fmt] = str(build_qwen3_like(tmp_path_factory.mktemp(fmt), template, specials))
        return built[fmt]

    return get


def play(model_dir: str, fmt: str, history: str):
    model, tokenizer = load_model(model_dir)
    model.eval()
    template = registry.templates.get("tool_call")(format=fmt)
    env = KeyEnv()

    def reply(call, index, prompt):  # the call written exactly as the template writes it, after a thought
        return template.format_action("open" if call == 0 else "take key", env, f"Step {call}.")

    backend = ForcedBackend(model, tokenizer, reply)
    episodes = collect(
        EnvPool(KeyEnv, {}, name="keys"),
        template,
        tokenizer,
        [0, 1],
        backend=backend,
        limits=RolloutLimits(max_new_tokens=96, max_context=2048, history=history),
    )
    return model, tokenizer, backend, episodes


@pytest.mark.parametrize("history", ["keep", "as_template"])
@pytest.mark.parametrize("fmt", list(FAMILIES))
def test_calls_are_structured_and_answered_as_tool_messages(family_model, fmt, history):
    model, tokenizer, backend, episodes = play(family_model(fmt), fmt, history)
    prompts = {tuple(p) for p in backend.prompts}
    for ep in episodes:
        assert ep.won and [t.action for t in ep.turns] == ["open", "take key"] and all(t.format_ok for t in ep.turns)
        replies = [m for m in ep.messages if m["role"] == "assistant"]
        assert replies[0]["tool_calls"] == [
            {"type": "function", "function": {"name": "act", "arguments": {"action": "open"}}}
        ]
        assert replies[0]["content"] == "Step 0."
        assert [m["role"] for m in ep.messages[1:]] == ["user", "assistant", "tool", "assistant"]
        for turn in ep.turns:  # rows: a backend input, then exactly the sampled ids
            start = max([0, *[s for s in ep.row_starts if s <= turn.span[0]]])
            assert tuple(ep.token_ids[start : turn.span[0]]) in prompts
            assert ep.token_ids[slice(*turn.span)] == encode_text(tokenizer, turn.response) + [tokenizer.eos_token_id]
        if history == "as_template":  # each prompt is the template's own render of the structured chat
            for k, turn in enumerate(ep.turns):
                start = max([0, *[s for s in ep.row_starts if s <= turn.span[0]]])
                chat = ep.messages[: 2 + 2 * k]
                kwargs = registry.templates.get("tool_call")(format=fmt).chat_template_kwargs(KeyEnv())
                # (the system prompt's example call is text: with this tokenizer <tool_call> is special)
                assert ep.token_ids[start : turn.span[0]] == encode_chat(
                    tokenizer, render(tokenizer, mark_messages(tokenizer, chat), add_generation_prompt=True, **kwargs)
                )
        else:
            assert ep.row_starts == []
    _, out = update_log_probs(model, tokenizer, episodes)
    for i, ep in enumerate(episodes):
        mask = torch.tensor(ep.loss_mask, dtype=torch.bool)
        assert torch.allclose(
            out["log_probs"][i, : len(ep.token_ids)][mask], torch.tensor(ep.logprobs)[mask], atol=2e-4
        )


def test_the_tool_results_are_rendered_in_the_familys_tool_role(family_model):
    _, tokenizer, _, episodes = play(family_model("llama3"), "llama3", "keep")
    text = tokenizer.decode(episodes[0].token_ids)
    assert "<|start_header_id|>ipython<|end_header_id|>" in text  # Llama 3's role for tool results
    assert '{"name": "act", "parameters": {"action": "open"}}' in text


def test_a_model_without_native_tool_calls_keeps_text_and_user_answers(tiny_model_dir):
    model, tokenizer = load_model(tiny_model_dir)
    template = registry.templates.get("tool_call")()
    backend = ForcedBackend(
        model, tokenizer, lambda call, i, p: template.format_action("open" if call == 0 else "take key", KeyEnv())
    )
    [ep] = collect(
        EnvPool(KeyEnv, {}, name="keys"),
        template,
        tokenizer,
        [0],
        backend=backend,
        limits=RolloutLimits(max_new_tokens=96, history="as_template"),
    )
    assert ep.won and all("tool_calls" not in m for m in ep.messages)
    assert [m["role"] for m in ep.messages[1:]] == ["user", "assistant", "user", "assistant"]
