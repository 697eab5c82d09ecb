"""Games of several agents (omrl.rollout.seats) with real TextArena games and the real `tiny` model: each
seat's chat is token-exact and its own, only the policy's own turns are trained, groups are per seat,
and every kind of player (policy, scripted, a fixed model, past checkpoints) can sit at a seat."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("textarena")

from omrl import registry  # noqa: E402
from omrl.backends.hf import HFBackend  # noqa: E402
from omrl.chat import render  # noqa: E402
from omrl.config.seats import SeatsConfig, parse_player, seat_players  # noqa: E402
from omrl.data.trajectory import read_episodes, write_episodes  # noqa: E402
from omrl.envs import Env, StepResult, check_seats, seat_step_problem  # noqa: E402
from omrl.errors import ConfigError, OmrlError  # noqa: E402
from omrl.models import load_model  # noqa: E402
from omrl.rollout import EnvPool, RolloutLimits  # noqa: E402
from omrl.rollout.convert import write_trajectories  # noqa: E402
from omrl.rollout.outcomes import seat_metrics, seat_outcomes, self_play_note  # noqa: E402
from omrl.rollout.seating import POLICY, SCRIPTED, PastCheckpoints, Player, check_seating  # noqa: E402
from omrl.rollout.seats import play_seats  # noqa: E402
from omrl.training.rl_data import trainable  # noqa: E402
from omrl_plugins.envs.engines.textarena_duel import TextArenaDuelEnv  # noqa: E402
from tests.helpers import mask_runs  # noqa: E402

SELF_PLAY = {"player_0": POLICY, "player_1": POLICY}


class CountingBackend(HFBackend):
    """The real hf backend, noting how many prompts each generate call was given."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches: list[int] = []

    def generate(self, prompts, params, messages=None):
        self.batches.append(len(prompts))
        return super().generate(prompts, params, messages=messages)


@pytest.fixture(scope="module")
def policy(tiny_hf):
    model, tokenizer = tiny_hf
    return CountingBackend(model, tokenizer, batch_size=16), tokenizer


@pytest.fixture(scope="module")
def react():
    return registry.templates.get("react")()


def play(
    policy, react, game, seating, *, tasks=(0, 1), group_size=2, history="keep", max_turns=0, seed=3, max_parallel=0
):
    backend, tokenizer = policy
    backend.batches.clear()
    pool = EnvPool(TextArenaDuelEnv, {"game": game}, name=f"textarena-duel:{game}")
    limits = RolloutLimits(max_new_tokens=8, max_context=2048, max_turns=max_turns, history=history)
    try:
        return play_seats(
            pool,
            react,
            tokenizer,
            list(tasks),
            seating=seating,
            backend=backend,
            limits=limits,
            group_size=group_size,
            seed=seed,
            max_parallel=max_parallel,
        )
    finally:
        pool.close()


def assert_token_exact(ep, tokenizer):
    """The trained ids are exactly the seat's sampled replies, and the whole row decodes to its own chat."""
    eos = tokenizer.eos_token_id
    assert len(ep.token_ids) == len(ep.loss_mask) == len(ep.logprobs)
    assert [(a, b) for v, a, b in mask_runs(ep.loss_mask) if v == 1] == [t.span for t in ep.turns]
    for turn in ep.turns:
        ids = ep.token_ids[slice(*turn.span)]
        assert turn.info["rollout"]["new_tokens"] == len(ids)
        body = ids[:-1] if ids[-1] == eos else ids
        assert tokenizer.decode(body, skip_special_tokens=False) == turn.response
    decoded = tokenizer.decode(ep.token_ids, skip_special_tokens=False)
    assert render(tokenizer, ep.messages).startswith(decoded)
    # every user message is what the env showed this seat: an observation some turn answered
    users = [m["content"] for m in ep.messages if m["role"] == "user"]
    assert users[1:] == [t.observation for t in ep.turns[1:]]
    assert users[0] == ep.turns[0].observation


def test_self_play_gives_each_seat_its_own_token_exact_chat(policy, react):
    episodes = play(policy, react, "SimpleNegotiation-v0-short", SELF_PLAY)
    backend, tokenizer = policy
    assert len(episodes) == 8  # 2 tasks x 2 games x 2 seats, all the policy's
    for ep in episodes:
        assert_token_exact(ep, tokenizer)
        me, other = ep.info["seat"], {"player_0": "player_1", "player_1": "player_0"}[ep.info["seat"]]
        chat = "\n".join(m["content"] for m in ep.messages)
        assert f"You are Player {me[-1]}" in chat and f"You are Player {other[-1]}" not in chat  # its own view
        assert ep.info["players"] == {"player_0": "policy", "player_1": "policy"} and ep.info["opponent"] == "policy"
        assert ep.end_reason == "done" and len(ep.turns) == {"player_0": 4, "player_1": 3}[me]  # 7 moves
    # the policy's seats of every game share each generate call: 4 games, one seat to move in each
    assert backend.batches == [4] * 7


def test_max_parallel_caps_the_games_played_at_once(policy, react):
    episodes = play(policy, react, "SimpleNegotiation-v0-short", SELF_PLAY, max_parallel=3)
    backend, tokenizer = policy
    assert len(episodes) == 8 and all(ep.end_reason == "done" and len(ep.info["moves"]) == 7 for ep in episodes)
    assert backend.batches == [3] * 7 + [1] * 7  # three games, then the fourth once they ended
    with pytest.raises(OmrlError, match="max_parallel must be >= 0"):
        play(policy, react, "SimpleNegotiation-v0-short", SELF_PLAY, max_parallel=-1)


def test_groups_are_per_game_setup_and_seat(policy, react):
    episodes = play(policy, react, "SimpleNegotiation-v0-short", SELF_PLAY, tasks=(5, 9), group_size=3)
    groups = {}
    for ep in episodes:
        groups.setdefault(ep.group, []).append(ep)
    assert sorted(groups) == [0, 1, 2, 3]  # task index * 2 + seat index
    for group, members in groups.items():
        assert {ep.task_id for ep in members} == {(5, 9)[group // 2]}
        assert {ep.info["seat"] for ep in members} == {("player_0", "player_1")[group % 2]}
        assert sorted(ep.sample for ep in members) == [0, 1, 2]
    assert [(ep.group, ep.sample) for ep in episodes] == sorted((ep.group, ep.sample) for ep in episodes)


def test_the_other_seats_tokens_are_never_trained(policy, react):
    episodes = play(policy, react, "SimpleNegotiation-v0-short", SELF_PLAY, tasks=(2,), group_size=1)
    first, second = sorted(episodes, key=lambda ep: ep.info["seat"])
    assert first.info["game"] == second.info["game"]
    _, tokenizer = policy
    for mine, theirs in ((first, second), (second, first)):
        trained = [tid for tid, m in zip(mine.token_ids, mine.loss_mask) if m]
        own = [tid for t in mine.turns for tid in mine.token_ids[slice(*t.span)]]
        assert trained == own
        theirs_sampled = sum(t.info["rollout"]["new_tokens"] for t in theirs.turns)
        assert sum(mine.loss_mask) == sum(t.info["rollout"]["new_tokens"] for t in mine.turns) != 0
        assert theirs_sampled > 0


def test_zero_sum_rewards_per_seat_and_credit_on_the_last_turn(policy, react):
    # tiny's replies never parse: the env is stepped with "", TicTacToe's player 0 forfeits on its second try
    episodes = play(policy, react, "TicTacToe-v0", SELF_PLAY)
    for ep in episodes:
        assert sum(ep.info["seat_rewards"].values()) == 0
        assert ep.info["seat_reward"] == ep.info["seat_rewards"][ep.info["seat"]]
        assert ep.info["outcome"] == {1.0: "win", -1.0: "loss", 0.0: "draw"}[ep.info["seat_reward"]]
        assert ep.won == (ep.info["outcome"] == "win") and ep.score == (ep.info["seat_reward"] + 1) / 2
    played = [ep for ep in episodes if ep.turns]
    for ep in played:
        assert ep.turns[-1].reward == ep.info["seat_reward"] and sum(t.reward for t in ep.turns[:-1]) == 0
        assert all(t.parse_error for t in ep.turns) and "could not be parsed" in ep.turns[1].observation
    assert {ep.info["seat"] for ep in played} == {"player_0"} and len(played) == 4
    assert all(ep.info["outcome"] == "loss" for ep in played)
    # player 1 never had a turn: each game still counts for it, as a win, in an episode with nothing to train
    idle = [ep for ep in episodes if not ep.turns]
    assert {ep.info["seat"] for ep in idle} == {"player_1"} and len(idle) == 4
    assert all(ep.info["outcome"] == "win" and not ep.token_ids and ep.end_reason == "done" for ep in idle)
    assert trainable(episodes) == played
    assert seat_outcomes(episodes)["seat:player_1"] == {
        "games": 4.0,
        "win": 1.0,
        "draw": 0.0,
        "loss": 0.0,
        "unfinished": 0.0,
    }


def test_against_the_scripted_player_only_the_policy_seat_is_played_out(policy, react, tmp_path):
    seating = {"player_0": SCRIPTED, "player_1": POLICY}
    episodes = play(policy, react, "TicTacToe-v0", seating)
    _, tokenizer = policy
    assert len(episodes) == 4 and {ep.info["seat"] for ep in episodes} == {"player_1"}
    for ep in episodes:
        assert_token_exact(ep, tokenizer)
        assert ep.info["opponent"] == "scripted" and ep.info["outcome"] == "loss"
        # the scripted move is context: the seat was shown it, in its first user message
        assert "Player 0 placed their symbol (O) in cell 4." in ep.messages[1]["content"]
    assert seat_outcomes(episodes) == {
        key: {"games": 4.0, "win": 0.0, "draw": 0.0, "loss": 1.0, "unfinished": 0.0}
        for key in ("all", "seat:player_1", "vs:scripted")
    }
    # an eval reads its rates back from the trajectory file: the seat, players and outcome are kept
    back = read_episodes(write_episodes(episodes, tmp_path / "seats.parquet"))
    assert [ep.info for ep in back] == [ep.info for ep in episodes]
    assert seat_metrics(back) == seat_metrics(episodes)
    assert self_play_note(seat_metrics(episodes)) is None  # against the scripted player its rates measure it
    # so does the readable JSONL beside it: which seat, who played each, which game and how it ended
    _, readable = write_trajectories(episodes, tmp_path / "written.parquet", tokenizer)
    records = [json.loads(line) for line in readable.read_text().splitlines()]
    assert [(r["seat"], r["opponent"], r["outcome"], r["game"]) for r in records] == [
        ("player_1", "scripted", "loss", ep.info["game"]) for ep in episodes
    ]
    assert all(r["players"] == {"player_0": "scripted", "player_1": "policy"} for r in records)
    assert all(
        r["seat_reward"] == -1.0 and r["seat_rewards"] == ep.info["seat_rewards"] for r, ep in zip(records, episodes)
    )


def test_a_fixed_model_plays_a_seat_and_is_never_trained(policy, react, tiny_model_dir):
    model, tokenizer = load_model(tiny_model_dir)  # a second tiny model: its own backend, its own weights
    other = CountingBackend(model, tokenizer, batch_size=16)
    seating = {"player_0": Player("model", "model:tiny", other), "player_1": POLICY}
    episodes = play(policy, react, "SimpleNegotiation-v0-short", seating)
    assert other.batches == [4] * 4 and policy[0].batches == [4] * 3  # each model's seats in calls of their own
    assert len(episodes) == 4 and all(ep.info["seat"] == "player_1" for ep in episodes)
    assert all(ep.info["opponent"] == "model:tiny" for ep in episodes)
    for ep in episodes:
        assert_token_exact(ep, policy[1])


def test_past_checkpoints_are_drawn_from_the_newest_k(policy, react, tiny_model_dir):
    loaded = []

    def load(folder):
        loaded.append(folder)
        model, tokenizer = load_model(tiny_model_dir)  # every "checkpoint" here is the tiny model
        return HFBackend(model, tokenizer, batch_size=16)

    # as a run keeps them: each checkpoint's weights in its step folder's model/ (named by the step)
    folders = [f"run/checkpoints/step-{n}/model" for n in (1, 2, 3)]
    past = PastCheckpoints(folders, last=2, load=load)
    episodes = play(
        policy, react, "SimpleNegotiation-v0-short", {"player_0": POLICY, "player_1": past}, tasks=(0, 1, 2)
    )
    drawn = {ep.info["players"]["player_1"] for ep in episodes}
    assert drawn <= {"past:step-2", "past:step-3"} and drawn
    assert sorted(loaded) == sorted(set(loaded))  # each folder loaded once
    assert {ep.info["seat"] for ep in episodes} == {"player_0"}
    past.close()
    with pytest.raises(OmrlError, match="saved none yet"):
        PastCheckpoints([], 3, load).draw(__import__("random").Random(0))


def test_as_template_history_keeps_each_seat_token_exact(react, tmp_path):
    from tests.chat.thinking import TEMPLATES, build_qwen3_like

    model, tokenizer = load_model(str(build_qwen3_like(tmp_path, TEMPLATES["keeps_answer"])))
    backend = CountingBackend(model, tokenizer, batch_size=16)
    episodes = play((backend, tokenizer), react, "SimpleNegotiation-v0-short", SELF_PLAY, history="as_template")
    assert len(episodes) == 8
    for ep in episodes:
        assert [(a, b) for v, a, b in mask_runs(ep.loss_mask) if v == 1] == [t.span for t in ep.turns]
        for (start, end), turn in zip(ep.rows(), ep.turns):
            assert start <= turn.span[0] < turn.span[1] <= end  # one turn per row: the template rewrites replies
    assert any(len(ep.rows()) > 1 for ep in episodes)


def test_a_game_cut_at_max_turns_is_unfinished(policy, react):
    episodes = play(policy, react, "SimpleNegotiation-v0", SELF_PLAY, tasks=(0,), group_size=1, max_turns=3)
    assert {ep.end_reason for ep in episodes} == {"max_turns"}
    assert all(ep.info["outcome"] == "unfinished" and ep.info["seat_reward"] == 0 for ep in episodes)
    assert seat_metrics(episodes)["unfinished_rate"] == 1.0 and seat_metrics(episodes)["games"] == 2
    # the policy on both sides: its rates mirror each other, and the note says how to measure it instead
    assert "give a seat an opponent, e.g. seats.play.player_1=scripted" in self_play_note(seat_metrics(episodes))


# -- refused seatings and declarations -----------------------------------------------------------------


def test_bad_seat_configs_are_refused_naming_what_is_valid():
    seats = ("player_0", "player_1")
    assert seat_players(SeatsConfig(), seats, "duel") == {s: parse_player(s, "policy") for s in seats}
    assert seat_players(SeatsConfig(play={"player_1": "past:5"}), seats, "duel")["player_1"].last == 5
    spec = parse_player("player_1", "openai:Qwen/Qwen3-8B@http://127.0.0.1:8000/v1")
    assert (spec.kind, spec.model, spec.base_url, spec.label) == (
        "openai",
        "Qwen/Qwen3-8B",
        "http://127.0.0.1:8000/v1",
        "openai:Qwen/Qwen3-8B",
    )
    with pytest.raises(ConfigError, match="names player_2; env 'duel' has seats player_0, player_1"):
        seat_players(SeatsConfig(play={"player_2": "scripted"}), seats, "duel")
    with pytest.raises(ConfigError, match="valid: policy, scripted, model:NAME, openai:NAME@URL, past, past:K"):
        seat_players(SeatsConfig(play={"player_1": "random"}), seats, "duel")
    with pytest.raises(ConfigError, match="at least one seat must be policy"):
        seat_players(SeatsConfig(play={"player_0": "scripted", "player_1": "model:tiny"}), seats, "duel")
    with pytest.raises(ConfigError, match="K >= 1"):
        seat_players(SeatsConfig(play={"player_1": "past:0"}), seats, "duel")
    with pytest.raises(ConfigError, match="env 'gridworld' has none"):
        seat_players(SeatsConfig(play={"player_1": "scripted"}), (), "gridworld")


def test_bad_seatings_are_refused_before_a_game_starts(policy, react):
    with pytest.raises(ConfigError, match="must name every seat and only those: player_0, player_1"):
        play(policy, react, "TicTacToe-v0", {"player_0": POLICY})
    with pytest.raises(ConfigError, match="declares no seats"):
        check_seating(SELF_PLAY, registry.envs.get("gridworld"), "gridworld")

    class NoPlayer(TextArenaDuelEnv):
        scripted_action = Env.scripted_action

    with pytest.raises(ConfigError, match="has no scripted player"):
        check_seating({"player_0": SCRIPTED, "player_1": POLICY}, NoPlayer, "no-player")


@pytest.mark.parametrize(
    "seats, why",
    [(("solo",), "two or more"), (["a", "b"], "two or more"), (("a", "a"), "a name twice"), (("a", "2b"), "bad names")],
)
def test_bad_seat_declarations_name_what_is_valid(seats, why):
    env_class = type("Declared", (TextArenaDuelEnv,), {"seats": seats})
    with pytest.raises(ConfigError, match=why) as refused:
        check_seats(env_class, "declared")
    assert "e.g. ('player_0', 'player_1')" in str(refused.value)


def test_bad_step_answers_name_the_valid_seats():
    seats = ("player_0", "player_1")
    info = {"won": False, "score": 0.0}
    assert seat_step_problem(StepResult("", 0.0, False, info, seat="player_1"), seats) is None
    assert "must be one of player_0, player_1" in seat_step_problem(StepResult("", 0.0, False, info, seat="p2"), seats)
    bad_view = StepResult("", 0.0, False, info, seat="player_0", views={"judge": "x"})
    assert "views for judge; valid seats: player_0, player_1" in seat_step_problem(bad_view, seats)
    short = StepResult("", 0.0, True, info, seat_rewards={"player_0": 1.0})
    assert "every seat a reward" in seat_step_problem(short, seats)
    big = StepResult("", 0.0, True, info, seat_rewards={"player_0": 2.0, "player_1": -2.0})
    assert "in [-1, 1]" in seat_step_problem(big, seats)


def test_a_template_that_fails_in_a_game_fails_the_game_not_the_seat(policy):
    """A broken action template is the world's failure in a game too: the game ends as env_error naming
    the template, and no seat is told its reply was empty."""

    class Raising(type(registry.templates.get("react")())):
        def parse(self, response, env):
            raise IndexError("list index out of range")

    episodes = play(policy, Raising(), "SimpleNegotiation-v0-short", SELF_PLAY, tasks=(0,), group_size=1)
    assert episodes and all(ep.end_reason == "env_error" for ep in episodes)
    assert all("Raising's parse raised IndexError" in ep.error for ep in episodes)
    assert not any("Your reply was empty" in str(m["content"]) for ep in episodes for m in ep.messages)
