"""The rollout with omrl's own `gridworld` env, `react` template and reward components."""

from __future__ import annotations

from omrl.chat import encode_conversation
from omrl.config import command_line_config
from omrl.config.options import EvalRunConfig, RolloutRunConfig
from omrl.rollout import PlaySpec, RolloutSession, token_exact


def gridworld_config(*overrides: str) -> RolloutRunConfig:
    return command_line_config(
        RolloutRunConfig,
        [
            "env.name=gridworld",
            "env.template=react",
            "model.name=tiny",
            "reward.weights={goal: 1.0, format: 0.5}",
            *overrides,
        ],
        {},
    )


def test_expert_demonstrations_have_the_sft_layout():
    """Expert episodes re-encode (as SFT will) to exactly the ids and mask the rollout laid out."""
    with RolloutSession.from_config(gridworld_config(), expert=True) as session:
        assert session.backend is None
        episodes = session.play(session.task_ids("train", 3), PlaySpec(split="train", expert=True)).episodes
    assert all(ep.won and ep.end_reason == "done" for ep in episodes)
    for ep in episodes:
        assert all(t.format_ok and t.response.endswith(f"Act: {t.action}") for t in ep.turns)
        ids, mask = encode_conversation(session.tokenizer, ep.messages)
        assert ids[: len(ep.token_ids)] == ep.token_ids and mask[: len(ep.loss_mask)] == ep.loss_mask
        assert ep.rewards["goal"][-1] == 1.0 and len(ep.rewards["total"]) == ep.num_turns


def test_model_rollout_on_gridworld_is_token_exact_and_rewarded():
    cfg = gridworld_config("generation.max_new_tokens=6", "env.max_turns=2", "generation.batch_size=8")
    with RolloutSession.from_config(cfg) as session:
        played = session.play(session.task_ids("train", 2), PlaySpec(split="train", group_size=2, seed=0))
        episodes, tokenizer = played.episodes, session.tokenizer
    assert [(ep.group, ep.sample) for ep in episodes] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert set(played.rewards) == {"goal", "format", "total"}
    for ep in episodes:
        assert token_exact(ep) and ep.num_turns >= 1
        assert len(ep.rewards["total"]) == ep.num_turns
        for turn in ep.turns:
            ids = ep.token_ids[slice(*turn.span)]
            assert all(ep.loss_mask[i] for i in range(*turn.span))
            body = ids[:-1] if ids[-1] == tokenizer.eos_token_id else ids
            assert tokenizer.decode(body, skip_special_tokens=False) == turn.response
        assert sum(ep.loss_mask) == sum(b - a for a, b in (t.span for t in ep.turns))


def test_overriding_one_key_keeps_the_commands_section_defaults():
    cfg = command_line_config(
        EvalRunConfig,
        ["eval", "generation.max_new_tokens=5", "reward.weights={format: 1.0}"],
        {"env.name": "gridworld"},
    )
    assert (cfg.env.name, cfg.env.split, cfg.generation.temperature) == ("gridworld", "test", 0.0)
    assert cfg.generation.max_new_tokens == 5
    assert cfg.reward.weights == {"format": 1.0}  # a mapping is replaced whole, not merged with the default


def test_webshop_chats_open_with_its_worked_example_unless_turned_off():
    from omrl_plugins.envs.webshop import WebShopEnv

    for flag, expected in (("true", WebShopEnv.demonstration), ("false", ())):
        cfg = command_line_config(
            RolloutRunConfig, ["env.name=webshop", "model.name=tiny", f"env.demonstration={flag}"], {}
        )
        with RolloutSession.from_config(cfg, expert=True) as session:
            assert session.env_of().demonstration is (flag == "true")
            (ep,) = session.play(session.task_ids("test", 1), PlaySpec(split="test", expert=True)).episodes
        assert ep.won and ep.demo_messages == 2 * len(expected)
        assert ep.messages[1]["content"] == (expected[0].observation if expected else ep.turns[0].observation)
