"""Games of several seats through the commands' own path: a run config's ``seats`` section, a
RolloutSession, ``omrl train`` and ``omrl eval`` (issue 55); and what cannot play seats refuses them."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from omrl.config import command_line_config
from omrl.config.options import RolloutRunConfig, TrainRunConfig
from omrl.data.trajectory import read_episodes
from omrl.errors import ConfigError, OmrlError
from omrl.rollout import PlaySpec, RolloutSession
from omrl.search import play_strategy
from omrl.training.config_checks import check_config
from omrl.training.metrics import read_metrics
from tests.helpers import cli_exit, invoke

pytest.importorskip("textarena")

GAME = "env.name=textarena-duel:TicTacToe-v0"
SMALL = ["model.name=tiny", "env.template=react", "env.max_turns=6", "generation.max_new_tokens=8"]


def config(*overrides: str, kind=RolloutRunConfig):
    return command_line_config(kind, [GAME, *SMALL, *overrides], {})


def test_a_session_seats_the_config_s_players_and_trains_only_the_policy_s_seat():
    with RolloutSession.from_config(config("seats.play.player_1=scripted", "reward.weights={process: 1}")) as session:
        played = session.play([0, 1], PlaySpec(group_size=2, seed=1))
    assert played.episodes, "the policy played no seat"
    assert {ep.info["seat"] for ep in played.episodes} == {"player_0"}
    assert {ep.info["opponent"] for ep in played.episodes} == {"scripted"}
    assert {ep.group for ep in played.episodes} <= {0, 2}  # task index * 2 seats + seat 0
    assert all(ep.info["outcome"] in ("win", "draw", "loss", "unfinished") for ep in played.episodes)
    assert set(played.env_rewards) == {"textarena-duel:TicTacToe-v0"}


def test_self_play_gives_every_seat_to_the_policy():
    with RolloutSession.from_config(config()) as session:
        episodes = session.play([0], PlaySpec(group_size=2, seed=0)).episodes
    seats = {ep.info["seat"] for ep in episodes}
    assert "player_0" in seats and {ep.info["opponent"] for ep in episodes} == {"policy"}
    assert len({ep.group for ep in episodes}) == len(seats)  # one group per seat of the one task


def test_what_cannot_play_seats_refuses_them_by_name():
    with pytest.raises(ConfigError, match="a mixture plays envs of one agent"):
        RolloutSession.from_config(config("env.name=textarena-duel:TicTacToe-v0:1,gridworld:1"))
    # a fixed model that is not there: it read as if --model were wrong
    with pytest.raises(
        OmrlError, match=r"seats.play.player_1=model:/nonexistent/dir: model '/nonexistent/dir' not found"
    ):
        RolloutSession.from_config(config("seats.play.player_1=model:/nonexistent/dir"))
    # seats given: its first env said it has no seats, and the fix that gave led to the line above
    with pytest.raises(ConfigError, match="seats.play is set, but a mixture plays envs of one agent"):
        RolloutSession.from_config(
            config("env.name=gridworld,textarena-duel:TicTacToe-v0", "seats.play.player_1=scripted")
        )
    with pytest.raises(ConfigError, match="env 'gridworld' has none"):
        RolloutSession.from_config(config("env.name=gridworld", "seats.play.player_1=scripted"))
    # rollout and eval save no checkpoints: `past` once played the model itself, silently
    with pytest.raises(ConfigError, match=r"seats.play.player_1=past plays a training run's past checkpoints"):
        RolloutSession.from_config(config("seats.play.player_1=past"))
    with RolloutSession.from_config(config("seats.play.player_1=scripted")) as session:
        with pytest.raises(ConfigError, match="strategy 'best_of_n' searches the chat of one agent"):
            play_strategy(session, [0], PlaySpec(strategy="best_of_n", budget=64))
    for setting in ("rollout.async_generation=true", "rollout.strategy=best_of_n", "algorithm.advantage=remax"):
        with pytest.raises(ConfigError, match="has seats: its games play in the batched rollout"):
            check_config(config(setting, kind=TrainRunConfig))


def test_omrl_rollout_of_self_play_shows_each_seat_and_says_its_overall_rates_mirror(tmp_path):
    played = invoke("rollout", GAME, *SMALL, "num_tasks=1", f"output={tmp_path / 'games.parquet'}")
    assert played.exit_code == 0, played.output
    said = " ".join(played.output.split())
    assert "win_rate/seat:player_0" in said and "games/vs:policy" in said
    assert "the policy played every seat of each game, so each of its wins is also one of its losses" in said


@pytest.mark.slow
def test_omrl_train_self_plays_and_omrl_eval_reports_each_seat_s_outcomes(tmp_path):
    run = tmp_path / "run"
    trained = invoke(
        "train",
        "--algo",
        "grpo",
        GAME,
        *SMALL,
        "steps=2",
        "tasks_per_step=2",
        "group_size=2",
        "eval_every=0",
        "eval_tasks=1",
        "reward.weights={process: 1}",
        f"logging.output_dir={run}",
    )
    assert trained.exit_code == 0, trained.output
    steps = read_metrics(run)
    assert len(steps) == 2 and all("win_rate/seat:player_0" in step for step in steps)
    rates = [sum(step[f"{o}_rate"] for o in ("win", "draw", "loss", "unfinished")) for step in steps]
    assert rates == pytest.approx([1.0, 1.0]) and all(step["games"] >= 1 for step in steps)
    report = tmp_path / "eval"
    evaluated = invoke("eval", GAME, *SMALL, "seats.play.player_1=scripted", "num_tasks=2", f"output_dir={report}")
    assert evaluated.exit_code == 0, evaluated.output
    metrics = json.loads((report / "report.json").read_text())["metrics"]
    assert metrics["games/vs:scripted"] >= 1 and "win_rate/seat:player_0" in metrics
    assert sum(metrics[f"{o}_rate/vs:scripted"] for o in ("win", "draw", "loss", "unfinished")) == pytest.approx(1)


@pytest.mark.slow  # two runs of three GRPO steps of games
def test_a_seated_run_stopped_and_resumed_matches_one_that_ran_through(tmp_path):
    from omrl.training.rl import run_rl
    from tests.training.helpers import stop_then_resume

    quiet = Console(file=io.StringIO())

    def train_config(out: str) -> TrainRunConfig:
        # player_1 is one of the run's own past checkpoints: after a resume it draws from the same pool
        settings = ["steps=3", "tasks_per_step=2", "group_size=2", "eval_every=0", "eval_tasks=1"]
        settings += [
            "reward.weights={process: 1}",
            "algorithm.entropy_coef=0.01",
            "logging.save_steps=1",
            f"logging.output_dir={tmp_path / out}",
        ]
        return config("seats.play.player_1=past:2", *settings, kind=TrainRunConfig)

    full = train_config("full")
    run_rl(full, console=quiet)
    killed = train_config("killed")
    stop_then_resume(killed, console=quiet)

    expected = {r["step"]: r for r in read_metrics(full.logging.output_dir)}
    resumed = read_metrics(killed.logging.output_dir)
    assert [r["step"] for r in resumed] == [1, 2, 3]
    for record in resumed:
        # the opponents: the starting model, then checkpoints named by their steps; the same draws in both runs
        opponents = sorted(k for k in record if k.startswith("games/vs:past:"))
        assert opponents == sorted(k for k in expected[record["step"]] if k.startswith("games/vs:"))
        for key in ("reward", "loss", "games", "win_rate/seat:player_0", "response_tokens", *opponents):
            assert record[key] == pytest.approx(expected[record["step"]][key], rel=1e-4, abs=1e-6), (
                record["step"],
                key,
            )


def test_a_seat_played_by_an_openai_compatible_endpoint(tiny_hf):
    """player_0 is a model behind a real HTTP server speaking the OpenAI API: its moves are sampled there
    and never kept; only the policy's seat is."""
    from omrl.backends.hf import HFBackend
    from tests.backends.fake_openai import FakeOpenAIServer

    model, tokenizer = tiny_hf
    server = FakeOpenAIServer(HFBackend(model, tokenizer), tokenizer).start()
    try:
        with RolloutSession.from_config(config(f"seats.play.player_0=openai:tiny@{server.base_url}")) as session:
            episodes = session.play([0, 1], PlaySpec(group_size=2, seed=1)).episodes
    finally:
        server.stop()
    assert len(episodes) == 4 and {ep.info["seat"] for ep in episodes} == {"player_1"}
    assert {ep.info["opponent"] for ep in episodes} == {"openai:tiny"}
    endpoint_moves = [move for ep in episodes for move in ep.info["moves"] if move[0] == "player_0"]
    calls = [path for path, _ in server.requests if path.endswith("/completions")]
    # a request a move: tiny's replies never parse, so each game's first mover forfeits on its second
    # try and the policy's seat wins without a move (an episode with nothing to train, counted as a win)
    assert len(calls) == len(endpoint_moves) == 2 * len(episodes)
    assert all(ep.info["outcome"] == "win" and not ep.turns for ep in episodes)


POKER = ["--env", "textarena-duel:KuhnPoker-v0", "--model", "tiny", "generation.max_new_tokens=8"]


@pytest.mark.parametrize("command", ["rollout", "eval"])
def test_games_another_seat_ends_before_the_policy_moves_are_said_so_not_blamed_on_the_context(
    command, tmp_path, capsys
):
    """Kuhn Poker: the tiny model at player_1 forfeits each game before the policy's seat gets a turn.
    Both commands exited 2 blaming generation.max_context ("an opening prompt of up to 0 tokens")."""
    where = ["-o", str(tmp_path / "poker.parquet")] if command == "rollout" else ["--output-dir", str(tmp_path)]
    status, out, err = cli_exit(capsys, command, *POKER, "--num-tasks", "1", *where, "seats.play.player_1=model:tiny")
    said = " ".join((out + err).split())
    assert status == 0, said
    assert "no episode got a model turn: the one episode ended (end_reason done) before the policy's seat " in said
    assert "(player_0 against model:tiny) moved" in said and "max_context" not in said
    episodes = read_episodes(tmp_path / ("poker.parquet" if command == "rollout" else "episodes.parquet"))
    assert [(ep.info["seat"], ep.end_reason, len(ep.turns)) for ep in episodes] == [("player_0", "done", 0)]


def test_a_train_run_whose_policy_never_moves_fails_naming_why_not_the_context(tmp_path, capsys):
    """A past checkpoint at player_1 forfeits every game first: the run can learn nothing, so it exits 2,
    but it said the opening prompt left no room within generation.max_context (and so did each step)."""
    run = ["steps=1", "tasks_per_step=2", "group_size=2", "eval_tasks=0", f"logging.output_dir={tmp_path}"]
    status, out, err = cli_exit(capsys, "train", "--algo", "grpo", *POKER, "seats.play.player_1=past", *run)
    said = " ".join((out + err).split())
    assert status == 2, said
    assert (
        "step 1: no episode got a model turn: all 4 episodes ended (end_reason done) before the policy's seat" in said
    )
    assert "no episode of this run got a single model turn, so nothing was learned" in said
    assert "max_context" not in said
    assert not (tmp_path / "config.json").exists()  # no final model that looks like a trained one
