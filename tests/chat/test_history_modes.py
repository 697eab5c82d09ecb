"""Thinking-model chat formats, token-exact in both history modes (issue 31): every row is the ids the
backend was given for its first turn plus what was sampled and appended after it, the loss mask covers
exactly the sampled ids, and the update's log-probs of a packed, split episode equal the rollout's."""

from __future__ import annotations

import pytest
import torch

from omrl.chat import encode_text, render
from omrl.models import load_model
from omrl.rollout import EnvPool, RolloutLimits, collect
from omrl.training.policy import policy_forward
from tests.fakes import KeyEnv

from .thinking import TEMPLATES, ForcedBackend, ThinkingActionTemplate, build_qwen3_like, key_replies, update_log_probs

MODES = ("keep", "as_template")


@pytest.fixture(scope="session")
def qwen3_like(tmp_path_factory):
    """``qwen3_like(name)``: the directory of a tiny Qwen3 model with fixture template ``name``."""
    built: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in built:
            built[name] = str(build_qwen3_like(tmp_path_factory.mktemp(name), TEMPLATES[name]))
        return built[name]

    return get


def play(model_dir: str, history: str, tasks=(0, 1), group_size: int = 2):
    model, tokenizer = load_model(model_dir)
    model.eval()
    opens_think = "<think>" in render(tokenizer, [{"role": "user", "content": "x"}], add_generation_prompt=True)
    backend = ForcedBackend(model, tokenizer, key_replies(opens_think))
    pool = EnvPool(KeyEnv, {}, name="keys")
    episodes = collect(
        pool,
        ThinkingActionTemplate(),
        tokenizer,
        list(tasks),
        backend=backend,
        group_size=group_size,
        limits=RolloutLimits(max_new_tokens=64, max_context=1024, history=history),
    )
    return model, tokenizer, backend, episodes


@pytest.mark.parametrize("template", ["drops_reasoning", "keeps_answer"])
@pytest.mark.parametrize("history", MODES)
def test_every_row_is_a_backend_input_plus_what_was_sampled(qwen3_like, template, history):
    model, tokenizer, backend, episodes = play(qwen3_like(template), history)
    sampled = {tuple(p) for p in backend.prompts}
    for ep in episodes:
        assert ep.end_reason == "done" and ep.won and len(ep.turns) == 2
        rows = ep.rows()
        assert len(rows) == (1 if history == "keep" else 2)  # both templates rewrite the first reply
        trained = [0] * len(ep.token_ids)
        for turn in ep.turns:
            start = max(s for s, _ in rows if s <= turn.span[0])
            assert tuple(ep.token_ids[start : turn.span[0]]) in sampled  # what the backend was given
            reply = encode_text(tokenizer, turn.response) + [tokenizer.eos_token_id]
            assert ep.token_ids[slice(*turn.span)] == reply  # exactly what was sampled
            trained[slice(*turn.span)] = [1] * (turn.span[1] - turn.span[0])
        assert ep.loss_mask == trained


@pytest.mark.parametrize("template", ["drops_reasoning", "keeps_answer"])
def test_as_template_prompts_are_the_templates_own_render(qwen3_like, template):
    """What the model sees under as_template is exactly what deployment shows it: the full render."""
    _, tokenizer, _, episodes = play(qwen3_like(template), "as_template")
    for ep in episodes:
        for k, turn in enumerate(ep.turns):
            start = max(s for s, _ in ep.rows() if s <= turn.span[0])
            chat = ep.messages[: 2 + 2 * k]  # system, first user, then k replies and their answers
            expected = encode_text(tokenizer, render(tokenizer, chat, add_generation_prompt=True))
            assert ep.token_ids[start : turn.span[0]] == expected
        assert "Chest step 0" not in tokenizer.decode(ep.token_ids[ep.row_starts[-1] :])  # the dropped reasoning


@pytest.mark.parametrize("template", ["drops_reasoning", "keeps_answer"])
def test_keep_shows_the_earlier_reasoning_in_one_append_only_row(qwen3_like, template):
    _, tokenizer, _, episodes = play(qwen3_like(template), "keep")
    for ep in episodes:
        assert ep.row_starts == []
        text = tokenizer.decode(ep.token_ids)
        assert "Chest step 0: I should open." in text and "Chest step 1: I should take key." in text
        first = encode_text(tokenizer, render(tokenizer, ep.messages[:2], add_generation_prompt=True))
        assert ep.token_ids[: len(first)] == first


@pytest.mark.parametrize("template", ["drops_reasoning", "keeps_answer"])
@pytest.mark.parametrize("history", MODES)
def test_the_updates_log_probs_equal_the_rollouts(qwen3_like, template, history):
    model, tokenizer, _, episodes = play(qwen3_like(template), history)
    batch, out = update_log_probs(model, tokenizer, episodes)
    assert ("position_ids" in batch.tensors) == (history == "as_template")
    for i, ep in enumerate(episodes):
        mask = torch.tensor(ep.loss_mask, dtype=torch.bool)
        got = out["log_probs"][i, : len(ep.token_ids)][mask]
        assert torch.allclose(got, torch.tensor(ep.logprobs)[mask], atol=2e-4), (got, ep.logprobs)
    if history == "as_template":  # the packing matters: one unmasked sequence gives other numbers
        with torch.no_grad():
            flat = policy_forward(model, batch["input_ids"], batch["attention_mask"], token_mask=batch["loss_mask"])
        assert not torch.allclose(flat["log_probs"], out["log_probs"], atol=1e-3)


def test_reward_model_data_and_scores_read_each_reply_in_its_own_row(qwen3_like):
    """A split episode's rows are separate sequences for a reward model too: a process label sits in the
    row its reply was generated in, and scoring the packed episode equals scoring each row alone."""
    from omrl.rm.labels import examples
    from omrl.rm.model import RewardModel, ScoringInput, build_reward_model

    _, tokenizer, _, episodes = play(qwen3_like("drops_reasoning"), "as_template")
    found, _ = examples(episodes, "prm", "step_reward", "rollout", 4096)
    rows = {tuple(ep.token_ids[s:e]) for ep in episodes for s, e in ep.rows()}
    assert len(found) == 2 * len(episodes) and all(tuple(ex.input_ids) in rows for ex in found)
    assert all(len(ex.positions) == 1 for ex in found)  # one reply per row here
    outcome, _ = examples(episodes, "orm", "success", "rollout", 4096)
    assert len(outcome) == len(episodes) and all(tuple(ex.input_ids) in rows for ex in outcome)

    model, rm_tokenizer = build_reward_model(qwen3_like("drops_reasoning"), "prm", "mse", "step_reward")
    rm = RewardModel(model, rm_tokenizer)
    packed = rm.score_turns(episodes)
    for ep, scores in zip(episodes, packed):
        alone = rm.values(
            [ScoringInput(ep.token_ids[s:e], [t.span[1] - 1 - s]) for (s, e), t in zip(ep.rows(), ep.turns)]
        )
        assert scores == pytest.approx([rm.to_score(v[0]) for v in alone], abs=1e-4)


def test_kv_reuse_survives_the_split(qwen3_like):
    """The hf backend's KV store matches the longest cached prefix: a new row (the template's own render
    of the chat) reuses its opening, and reuse samples exactly what plain generation samples."""
    from omrl.backends.hf import HFBackend

    from .thinking import ThinkingActionTemplate

    model, tokenizer = load_model(qwen3_like("keeps_answer"))  # its prompt opens <think>: every turn splits

    def run(reuse: bool):
        backend = HFBackend(model, tokenizer, batch_size=4, kv_reuse=reuse)
        limits = RolloutLimits(max_new_tokens=10, max_context=1024, max_turns=3, history="as_template")
        episodes = collect(
            EnvPool(KeyEnv, {}, name="keys"),
            ThinkingActionTemplate(),
            tokenizer,
            [0, 1],
            backend=backend,
            group_size=2,
            seed=3,
            limits=limits,
        )
        return episodes, backend.take_stats()

    on, stats_on = run(True)
    off, stats_off = run(False)
    assert [ep.token_ids for ep in on] == [ep.token_ids for ep in off]
    assert [ep.row_starts for ep in on] == [ep.row_starts for ep in off]
    assert all(len(ep.rows()) == len(ep.turns) == 3 for ep in on)
    assert stats_on["prefill_computed"] + stats_on["prefill_reused"] == stats_off["prefill_computed"]
    assert stats_on["prefill_computed"] < 0.7 * stats_off["prefill_computed"]  # new rows reuse their openings
