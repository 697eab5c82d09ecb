"""TextArena's two-player games as seated envs: each seat's own view, rewards per seat, the scripted player."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("textarena")

from omrl import registry  # noqa: E402
from omrl.envs import check_seats, seat_reset_problem, seat_step_problem  # noqa: E402
from omrl.errors import ConfigError  # noqa: E402
from omrl_plugins.envs.engines.textarena_duel import TextArenaDuelEnv, duel_game_ids  # noqa: E402

GAMES = ("TicTacToe-v0", "KuhnPoker-v0", "SimpleNegotiation-v0")


def play_out(env: TextArenaDuelEnv, task: int, actions=None) -> tuple[list, dict[str, list[str]], dict[str, float]]:
    """A whole game of ``env``'s scripted players (``actions`` first, in order); (moves, views, seat rewards)."""
    first = env.reset(task)
    assert seat_reset_problem(first, env.seats) is None
    views = {seat: [text] for seat, text in first.views.items()}
    seat, moves, queued = first.seat, [], list(actions or [])
    while True:
        action = queued.pop(0) if queued else env.scripted_action(seat)
        result = env.step(action)
        assert seat_step_problem(result, env.seats) is None
        moves.append((seat, action, result.info["invalid"]))
        for name, text in result.views.items():
            views[name].append(text)
        if result.done:
            return moves, views, result.seat_rewards
        seat = result.seat


@pytest.mark.parametrize("game", GAMES)
@pytest.mark.parametrize("opponent", ["random", "rules"])
def test_scripted_games_end_with_zero_sum_seat_rewards(game, opponent):
    env = TextArenaDuelEnv(game, opponent=opponent)
    assert check_seats(type(env)) == ("player_0", "player_1")
    outcomes = set()
    for task in range(6):
        moves, _, rewards = play_out(env, task)
        assert set(rewards) == {"player_0", "player_1"} and sum(rewards.values()) == 0
        assert all(value in (-1.0, 0.0, 1.0) for value in rewards.values())
        assert not any(invalid for _, _, invalid in moves)  # the scripted player only plays legal moves
        outcomes.add(rewards["player_0"])
    assert outcomes  # and a game is a function of its seed
    assert play_out(env, 3) == play_out(TextArenaDuelEnv(game, opponent=opponent), 3)


def test_each_seat_sees_its_own_view_and_not_the_others():
    env = TextArenaDuelEnv("KuhnPoker-v0")
    first = env.reset(5)
    cards = env._arena.state.game_state["player_cards"]
    names = "JQK"
    assert "You are Player 0" in first.views["player_0"] and "You are Player 1" not in first.views["player_0"]
    assert f"Your card is: '{names[cards[0]]}'" in first.views["player_0"]
    assert f"Your card is: '{names[cards[1]]}'" in first.views["player_1"]
    assert f"Your card is: '{names[cards[1]]}'" not in first.views["player_0"]
    assert first.seat == "player_1" and first.text == first.views["player_1"]  # Kuhn's player 1 opens round 1
    # the negotiation's talk reaches the other seat; a seat never reads its own move back
    env = TextArenaDuelEnv("SimpleNegotiation-v0")
    env.reset(0)
    result = env.step("Hello there [Deny]")
    assert "Player 0 said: Hello there [Deny]" in result.views["player_1"]
    assert "Hello there" not in result.views["player_0"]


def test_a_second_invalid_move_in_a_row_loses_the_game():
    env = TextArenaDuelEnv("TicTacToe-v0")
    first = env.reset(0)
    again = env.step("")  # what the rollout plays for a reply that did not parse
    assert again.info["invalid"] and again.seat == first.seat and not again.done
    assert "invalid move" in again.views[first.seat]
    lost = env.step("no move here")
    assert lost.done and lost.seat_rewards == {"player_0": -1.0, "player_1": 1.0}


def test_the_rule_player_never_loses_tictactoe_to_the_random_one():
    rules, rand = (
        TextArenaDuelEnv("TicTacToe-v0", opponent="rules"),
        TextArenaDuelEnv("TicTacToe-v0", opponent="random"),
    )
    results = []
    for task in range(20):
        first = rules.reset(task)
        rand.reset(task)  # only its move choice is used, on the same board
        seat = first.seat
        while True:
            if seat == "player_1":  # the random player's move for this board
                rand._arena.state.game_state["board"] = rules._arena.state.game_state["board"]
                rand._arena.state.current_player_id = 1
                action = rand.scripted_action("player_1")
            else:
                action = rules.scripted_action("player_0")
            result = rules.step(action)
            if result.done:
                results.append(result.seat_rewards["player_0"])
                break
            seat = result.seat
    assert min(results) >= 0 and results.count(1.0) >= 10


def test_a_game_reaching_max_turns_is_a_draw():
    env = TextArenaDuelEnv("SimpleNegotiation-v0-long", max_turns=4)
    moves, views, rewards = play_out(env, 1)
    assert len(moves) == 4 and rewards == {"player_0": 0.0, "player_1": 0.0}
    assert "reached 4 moves: a draw" in views["player_0"][-1]


def test_bad_options_name_what_is_valid():
    with pytest.raises(ConfigError, match="valid: TicTacToe-v0, KuhnPoker-v0"):
        TextArenaDuelEnv("Chess-v0")
    with pytest.raises(ConfigError, match="valid: random, rules"):
        TextArenaDuelEnv(opponent="perfect")


def test_every_game_registers_under_its_own_name():
    names = registry.envs.names()
    assert "textarena-duel" in names
    for game in duel_game_ids():
        assert f"textarena-duel:{game}" in names
    env = registry.envs.get("textarena-duel:KuhnPoker-v0-short")()
    assert env.game == "KuhnPoker-v0-short" and env.seats == ("player_0", "player_1")


def test_games_leave_the_callers_random_state_alone():
    random.seed(7)
    before = random.getstate()
    play_out(TextArenaDuelEnv("KuhnPoker-v0", opponent="random"), 2)  # Kuhn shuffles and reseeds `random`
    assert random.getstate() == before
