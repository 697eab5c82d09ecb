"""THE key property: the ids trained on are exactly the ids sampled, and no env/template token is in the mask.

Driven by a scripted backend that returns chosen ids, for the tiny tokenizer and
the real SmolLM2 tokenizer. The chosen ids include a non-canonical tokenization
(one character at a time) that a decode/re-encode would silently change, and a
turn cut at the token limit (no end-of-turn token sampled).
"""

from __future__ import annotations

import pytest

from omrl.chat import encode_conversation, render
from omrl.rollout import EnvPool, RolloutLimits, collect
from tests.fakes import ActionTemplate, KeyEnv, ScriptedBackend
from tests.helpers import mask_runs


def char_by_char(tokenizer, text: str) -> list[int]:
    """A valid but non-canonical tokenization of ``text``: each character on its own."""
    return [i for ch in text for i in tokenizer.encode(ch, add_special_tokens=False)]


@pytest.fixture
def tokenizer(builtin_tokenizer):
    return builtin_tokenizer


def play(tokenizer):
    """Four episodes (2 tasks x 2 samples) with scripted replies."""
    eos = tokenizer.eos_token_id
    rambling = char_by_char(tokenizer, "Let me think about this chest for a while, carefully and slowly")

    def reply(call: int, index: int, prompt: list[int]) -> list[int]:
        def canonical(text: str) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=False) + [eos]

        return {  # index: the live episodes of the call, in (group, sample) order
            0: [char_by_char(tokenizer, "Action: open") + [eos], rambling, canonical("hello"), [eos]],
            1: [canonical("Action: take key"), canonical("Action: dance ✓"), canonical("Action: open")],
            2: [canonical("Action: take key"), canonical("Action: take key")],
        }[call][index]

    backend = ScriptedBackend(tokenizer, reply)
    pool = EnvPool(KeyEnv, name="keys")
    episodes = collect(
        pool,
        ActionTemplate(),
        tokenizer,
        [0, 1],
        backend=backend,
        group_size=2,
        limits=RolloutLimits(max_new_tokens=16, max_context=1024, max_turns=3),
    )
    return episodes, backend, rambling


def test_masked_in_tokens_are_exactly_the_sampled_turns(tokenizer):
    episodes, backend, rambling = play(tokenizer)
    eos = tokenizer.eos_token_id
    assert backend.calls == [4, 3, 2]  # every turn: one call for all live episodes
    by_key = {(ep.group, ep.sample): ep for ep in episodes}
    first = by_key[(0, 0)]
    # the non-canonical ids survive untouched (a re-encode would have merged them)
    assert first.token_ids[slice(*first.turns[0].span)] == char_by_char(tokenizer, "Action: open") + [eos]
    assert [t.response for t in first.turns] == ["Action: open", "Action: take key"]
    assert first.won and first.end_reason == "done"
    cut = by_key[(0, 1)].turns[0]
    assert cut.span[1] - cut.span[0] == 16 and cut.info["rollout"]["truncated"]
    assert by_key[(0, 1)].token_ids[slice(*cut.span)] == rambling[:16]
    assert by_key[(0, 1)].end_reason == "max_turns" and not by_key[(0, 1)].won
    assert by_key[(0, 1)].turns[1].response == "Action: dance ✓"
    assert by_key[(1, 0)].won and by_key[(1, 0)].turns[0].action is None
    assert by_key[(1, 1)].end_reason == "empty_response"
    for ep in episodes:
        assert len(ep.token_ids) == len(ep.loss_mask) == len(ep.logprobs)
        masked_in = [run for run in mask_runs(ep.loss_mask) if run[0] == 1]
        assert [(a, b) for _, a, b in masked_in] == [t.span for t in ep.turns]
        for turn in ep.turns:
            ids = ep.token_ids[slice(*turn.span)]
            body = ids[:-1] if ids[-1] == eos else ids
            assert tokenizer.decode(body, skip_special_tokens=False) == turn.response
        assert all((lp == -0.5) == bool(m) for lp, m in zip(ep.logprobs, ep.loss_mask))
        assert ep.token_ids[: ep.prompt_length] == ep.token_ids[: ep.turns[0].span[0]]


def test_no_env_or_template_token_is_ever_in_the_mask(tokenizer):
    episodes, _, _ = play(tokenizer)
    eos = tokenizer.eos_token_id
    for ep in episodes:
        runs = mask_runs(ep.loss_mask)
        outside = [tokenizer.decode(ep.token_ids[a:b], skip_special_tokens=False) for v, a, b in runs if v == 0]
        inside = [tokenizer.decode(ep.token_ids[a:b], skip_special_tokens=False) for v, a, b in runs if v == 1]
        env_texts = [ep.instruction, ActionTemplate().system_prompt(KeyEnv())]
        env_texts += [t.observation for t in ep.turns]
        env_texts += [m["content"] for m in ep.messages if m["role"] == "user"]
        for text in env_texts:
            assert any(text in seg for seg in outside), text
            assert not any(text in seg for seg in inside), text
        # an injected end-of-turn token (after a cut turn) is masked out
        for turn in ep.turns:
            if turn.info["rollout"]["truncated"] and turn.span[1] < len(ep.token_ids):
                assert ep.token_ids[turn.span[1]] == eos and ep.loss_mask[turn.span[1]] == 0
        # the whole sequence decodes to the rendered chat (minus the text after the final turn)
        decoded = tokenizer.decode(ep.token_ids, skip_special_tokens=False)
        rendered = render(tokenizer, ep.messages)
        assert rendered.startswith(decoded)
        ended_with_eos = ep.token_ids[-1] == eos
        assert rendered[len(decoded) :] == ("\n" if ended_with_eos else tokenizer.eos_token + "\n")


def test_sft_layout_matches_the_rollout_layout(tokenizer):
    """An episode whose turns were canonically tokenized re-encodes (SFT) to the same ids and mask."""
    episodes, _, _ = play(tokenizer)
    ep = next(e for e in episodes if (e.group, e.sample) == (1, 0))
    assert ep.won
    ids, mask = encode_conversation(tokenizer, ep.messages)
    assert ids[: len(ep.token_ids)] == ep.token_ids
    assert mask[: len(ep.loss_mask)] == ep.loss_mask
