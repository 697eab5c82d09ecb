"""Expert play of seated games (issue 55): the env's scripted player plays the seats the seating gives
the policy, its moves written by the template's ``format_action`` as the one-agent expert's are, and
those seats' episodes are token-exact SFT data that ``omrl sft`` re-encodes to the same ids and mask."""

from __future__ import annotations

import pytest

pytest.importorskip("textarena")

from omrl.chat import encode_conversation  # noqa: E402
from omrl.config import command_line_config  # noqa: E402
from omrl.config.options import RolloutRunConfig  # noqa: E402
from omrl.data import read_episodes  # noqa: E402
from omrl.envs import Env  # noqa: E402
from omrl.errors import ConfigError, OmrlError  # noqa: E402
from omrl.rollout import PlaySpec, RolloutSession  # noqa: E402
from omrl.rollout.seating import EXPERT, POLICY, SCRIPTED, check_seating, expert_seating, seating_of  # noqa: E402
from omrl.training.metrics import read_metrics  # noqa: E402
from omrl_plugins.envs.engines.textarena_duel import TextArenaDuelEnv  # noqa: E402
from tests.helpers import invoke  # noqa: E402

GAME = "textarena-duel:TicTacToe-v0"
SMALL = ["model.name=tiny", "env.template=react", "generation.max_new_tokens=8"]


def config(*overrides: str):
    return command_line_config(RolloutRunConfig, [f"env.name={GAME}", *SMALL, *overrides], {})


def expert_games(*overrides: str, tasks=(0, 1)):
    with RolloutSession.from_config(config(*overrides), expert=True) as session:
        assert session.backend is None  # no model is loaded to play the expert
        return session.play(list(tasks), PlaySpec(expert=True)).episodes, session.tokenizer


def test_expert_self_play_gives_every_seat_a_token_exact_sft_episode():
    episodes, tokenizer = expert_games()
    assert [(ep.group, ep.sample, ep.info["seat"]) for ep in episodes] == [
        (0, 0, "player_0"),
        (1, 0, "player_1"),
        (2, 0, "player_0"),
        (3, 0, "player_1"),
    ]
    for ep in episodes:
        seat = ep.info["seat"]
        assert ep.info["players"] == {"player_0": "expert", "player_1": "expert"} and ep.info["opponent"] == "expert"
        assert ep.end_reason == "done" and ep.info["outcome"] in ("win", "draw", "loss")
        # the seat's own moves, in play order, each written by react's format_action
        own = [action for mover, action in ep.info["moves"] if mover == seat]
        assert [t.response for t in ep.turns] == [f"Act: {action}" for action in own]
        assert all(t.format_ok and not t.info["invalid"] for t in ep.turns)
        # token-exact: the trained ids are exactly the replies (each ended by eos), nothing else
        trained = [(a, b) for a, b in zip(*_runs(ep.loss_mask))]
        assert trained == [t.span for t in ep.turns] and not any(ep.logprobs)
        for turn in ep.turns:
            ids = ep.token_ids[slice(*turn.span)]
            assert ids[-1] == tokenizer.eos_token_id
            assert tokenizer.decode(ids[:-1], skip_special_tokens=False) == turn.response
        # SFT re-encodes the chat to the very ids and mask the rollout laid out
        ids, mask = encode_conversation(tokenizer, ep.messages, **ep.chat_kwargs)
        assert ids[: len(ep.token_ids)] == ep.token_ids and mask[: len(ep.loss_mask)] == ep.loss_mask
        assert ep.turns[-1].reward == ep.info["seat_reward"]
    # the rules player opens in the centre, and the game both seats saw is one game
    assert episodes[0].info["moves"][0] == ["player_0", "[4]"]
    assert episodes[0].info["moves"] == episodes[1].info["moves"] and episodes[0].info["game"] == 0


def test_the_expert_plays_only_the_seats_the_seating_gives_the_policy():
    episodes, _ = expert_games("seats.play.player_1=scripted", tasks=(3,))
    assert len(episodes) == 1 and episodes[0].info["seat"] == "player_0"
    assert episodes[0].info["players"] == {"player_0": "expert", "player_1": "scripted"}
    assert expert_seating({"player_0": POLICY, "player_1": SCRIPTED}) == {"player_0": EXPERT, "player_1": SCRIPTED}


def test_a_seated_env_without_a_scripted_player_is_refused_for_expert_play():
    class NoPlayer(TextArenaDuelEnv):
        scripted_action = Env.scripted_action

    with pytest.raises(ConfigError, match="env 'no-player' has seats but no scripted player.*drop --expert"):
        seating_of(config(), NoPlayer, "no-player", None, True, False, None)
    with pytest.raises(ConfigError, match="has seats but no scripted player"):
        check_seating(expert_seating({"player_0": POLICY, "player_1": POLICY}), NoPlayer, "no-player")
    assert seating_of(config(), NoPlayer, "no-player", None, False, False, None) == {
        "player_0": POLICY,
        "player_1": POLICY,
    }  # a model may still play it


def test_a_session_built_for_the_expert_has_no_policy_to_play_a_model_game():
    with RolloutSession.from_config(config(), expert=True) as session:
        with pytest.raises(OmrlError, match="needs the policy's generation backend"):
            session.play([0], PlaySpec())


@pytest.mark.slow  # two commands, one of them a training step
def test_omrl_rollout_expert_writes_games_omrl_sft_trains_on(tmp_path):
    data = tmp_path / "expert.parquet"
    rolled = invoke("rollout", f"env.name={GAME}", *SMALL, "--expert", "--num-tasks", "2", "-o", str(data))
    assert rolled.exit_code == 0, rolled.output
    episodes = read_episodes(data)
    assert len(episodes) == 4 and {ep.info["seat"] for ep in episodes} == {"player_0", "player_1"}
    out = tmp_path / "sft"
    trained = invoke(
        "sft",
        "model.name=tiny",
        f"dataset={data}",
        "packing=false",
        "optim.micro_batch_size=4",
        "num_train_epochs=1",
        "logging.tensorboard=false",
        f"logging.output_dir={out}",
    )
    assert trained.exit_code == 0, trained.output
    (step,) = read_metrics(out)
    assert step["label_tokens"] == sum(sum(ep.loss_mask) for ep in episodes)  # exactly the expert's replies


def _runs(mask: list[int]) -> tuple[list[int], list[int]]:
    """Starts and ends of the runs of 1 in ``mask``."""
    starts = [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]
    ends = [i + 1 for i, m in enumerate(mask) if m and (i + 1 == len(mask) or not mask[i + 1])]
    return starts, ends


def test_an_expert_seat_that_never_moved_gives_no_sft_episode(tmp_path):
    """A game cut after its first move: player_1 never moved, so only player_0's chat is written, and
    ``omrl sft`` reads the file (an episode without a chat would be refused there)."""
    episodes, _ = expert_games("env.max_turns=1")
    assert [ep.info["seat"] for ep in episodes] == ["player_0", "player_0"]
    assert all(ep.turns and ep.messages and ep.info["outcome"] == "unfinished" for ep in episodes)
    out = tmp_path / "expert.parquet"
    played = invoke("rollout", "--env", GAME, "--expert", "--num-tasks", "2", "-o", str(out), *SMALL, "env.max_turns=1")
    assert played.exit_code == 0, played.output
    trained = invoke(
        "sft", "sft-tiny", "--dataset", str(out), "--output-dir", str(tmp_path / "sft"), "num_train_epochs=1"
    )
    assert trained.exit_code == 0, trained.output
