"""TextArena's two-player games with a seat per player (pip install 'omrl[textarena]').

Registered as ``textarena-duel`` (option ``game``) and once per game as ``textarena-duel:<game>``.
Games that run offline: ``TicTacToe-v0``, ``KuhnPoker-v0`` (3 rounds; ``-short`` 5, ``-medium`` 9,
``-long`` 15, ``-extreme`` 25) and ``SimpleNegotiation-v0`` (10 turns; ``-short`` 6, ``-long`` 30).

Seats ``player_0`` and ``player_1`` are TextArena's players 0 and 1. Each seat sees its own rules
(its mark, its cards, its resources' values), the game's messages meant for it and, in the
negotiation, what the other player said; never the other seat's private view. As in TextArena a
seat's first invalid move is answered and played again, a second in a row loses the game. Seat
rewards are TextArena's: +1 win, -1 loss, 0 draw; a game that reaches ``max_turns`` moves is a draw.

The env's own player (``scripted_action``): ``opponent="random"`` plays a random legal move;
``"rules"`` plays TicTacToe by win, block, centre, corner, then random, Kuhn Poker by its card
(bet or call a king, check or fold a jack, check or call a queen) and the negotiation by accepting
only offers that raise its own inventory's value. Task ids are the games' seeds: ``train``
0..99,999, ``test`` 1,000,000..1,000,499; a game and the scripted player's random choices depend on
the seed alone, and the caller's ``random`` module is untouched.
"""

from __future__ import annotations

import random
from typing import Any

from omrl.envs import Env, Observation, StepResult
from omrl.errors import ConfigError
from omrl_plugins.envs.engines.common import PrivateRandom, RangeSplits, check_running, require
from omrl_plugins.envs.engines.textarena import new_arena

#: each game's TextArena variants ("" is ``<Game>-v0`` itself)
DUEL_VARIANTS: dict[str, tuple[str, ...]] = {
    "TicTacToe": ("",),
    "KuhnPoker": ("", "short", "medium", "long", "extreme"),
    "SimpleNegotiation": ("", "short", "long"),
}
SEATS = ("player_0", "player_1")
SPLITS = {"train": range(0, 100_000), "test": range(1_000_000, 1_000_500)}
OPPONENTS = ("random", "rules")
SPEECH_GAMES = ("SimpleNegotiation",)  # games whose moves carry talk: the other seat reads them
RESOURCES = ("Wheat", "Wood", "Sheep", "Brick", "Ore")


def duel_game_ids() -> list[str]:
    """Every two-player TextArena env id omrl plays offline: ``TicTacToe-v0``, ``KuhnPoker-v0-short``, ..."""
    return [
        f"{game}-v0" + (f"-{variant}" if variant else "")
        for game, variants in DUEL_VARIANTS.items()
        for variant in variants
    ]


def seat_of(player_id: int) -> str:
    return SEATS[player_id]


class TextArenaDuelEnv(RangeSplits, Env):
    """TextArena two-player games, one seat per player: TicTacToe, KuhnPoker, SimpleNegotiation."""

    split_ranges = SPLITS
    splits_name = "textarena-duel"
    action_help = (
        "One move per turn, in square brackets as the game's rules say: e.g. [4] (Tic Tac Toe), [bet] or "
        "[check] (Kuhn Poker), [Offer: 2 Wood -> 1 Ore], [Accept] or [Deny] (negotiation)."
    )
    action_example = "[4]"
    seats = SEATS
    max_turns = 60
    package = "textarena"
    extra = "textarena"

    def __init__(self, game: str = "TicTacToe-v0", opponent: str = "rules", max_turns: int = 60):
        self._package = require("textarena", "textarena-duel", "textarena")
        if game not in duel_game_ids():
            raise ConfigError(
                f"textarena-duel option game: {game!r} is not a two-player game that runs offline; "
                f"valid: {', '.join(duel_game_ids())}"
            )
        if opponent not in OPPONENTS:
            raise ConfigError(f"textarena-duel option opponent: {opponent!r}; valid: {', '.join(OPPONENTS)}")
        self.game, self.opponent = game, opponent
        self.max_turns = int(max_turns)  # type: ignore[misc]  # per instance: an option
        self._base = game.split("-v", 1)[0]
        self._arena: Any = None
        self._random = PrivateRandom()  # the game's (it reseeds and shuffles the global random module)
        self._choices = random.Random(0)  # the scripted player's
        self._moves = 0
        self._running = False

    def reset(self, task_id: int) -> Observation:
        self.check_task_id(task_id)
        self._arena, self._random = new_arena(self._package, self.game, 2, task_id)
        self._choices = random.Random(task_id * 7_919 + 1)
        self._moves, self._running = 0, True
        views = self._drain()
        first = seat_of(self._arena.state.current_player_id)
        info = {"won": False, "score": 0.0, "game": self.game}
        return Observation(views.get(first, ""), "", info, seat=first, views=views)

    def step(self, action: str) -> StepResult:
        check_running("textarena-duel", self._running)
        state = self._arena.state
        mover = state.current_player_id
        with self._random.active():
            done, _ = self._arena.step(action.strip())
        self._moves += 1
        invalid = bool(state.error_count) or bool(state.game_info[mover].get("invalid_move"))
        views = self._drain()
        rewards = dict(state.rewards or {})
        if not done and self._moves >= self.max_turns:  # the game's own turn limit would come later: a draw
            done, rewards = True, {0: 0, 1: 0}
            for seat in SEATS:
                views[seat] = f"{views.get(seat, '')}\nThe game reached {self.max_turns} moves: a draw.".strip()
        info: dict[str, Any] = {"won": False, "score": 0.0, "invalid": invalid, "game": self.game}
        self._running = not done
        if done:
            reason = state.game_info[0].get("reason") or ""
            info["reason"] = reason
            seat_rewards = {seat_of(pid): float(rewards.get(pid, 0.0)) for pid in (0, 1)}
            return StepResult("", 0.0, True, info, views=views, seat_rewards=seat_rewards)
        nxt = seat_of(state.current_player_id)
        return StepResult(views.get(nxt, ""), 0.0, False, info, seat=nxt, views=views)

    def scripted_action(self, seat: str) -> str | None:
        if not self._running or seat != seat_of(self._arena.state.current_player_id):
            return None
        play = {"TicTacToe": self._tictactoe, "KuhnPoker": self._kuhn, "SimpleNegotiation": self._negotiation}
        return play[self._base](self._arena.state.current_player_id, self._arena.state.game_state)

    # -- the scripted player ------------------------------------------------------------------------------

    def _tictactoe(self, me: int, game_state: dict[str, Any]) -> str:
        board = [cell for row in game_state["board"] for cell in row]
        free = [i for i, cell in enumerate(board) if cell == ""]
        if self.opponent == "rules":
            mine, theirs = ("X", "O") if me == 1 else ("O", "X")  # TextArena: player 1 is X
            for mark in (mine, theirs):  # win if we can, else block their win
                for cell in free:
                    if _wins([mark if i == cell else c for i, c in enumerate(board)], mark):
                        return f"[{cell}]"
            for preferred in ([4], [0, 2, 6, 8]):
                options = [cell for cell in preferred if cell in free]
                if options:
                    return f"[{self._choices.choice(options)}]"
        return f"[{self._choices.choice(free)}]"

    def _kuhn(self, me: int, game_state: dict[str, Any]) -> str:
        legal = list(game_state["current_legal_action_tree"])
        if self.opponent == "rules":
            card = game_state["player_cards"][me]  # 0 J, 1 Q, 2 K
            wanted = {2: ("bet", "call"), 1: ("check", "call"), 0: ("check", "fold")}[card]
            for move in wanted:
                if move in legal:
                    return f"[{move}]"
        return f"[{self._choices.choice(legal)}]"

    def _negotiation(self, me: int, game_state: dict[str, Any]) -> str:
        offer = game_state.get("current_offer")
        if offer and offer.get("to_player") == me:
            values = game_state["player_values"][me]
            gain = sum(q * values[r] for r, q in offer["offered_resources"].items())
            cost = sum(q * values[r] for r, q in offer["requested_resources"].items())
            mine = game_state["player_resources"][me]
            affordable = all(mine.get(r, 0) >= q for r, q in offer["requested_resources"].items())
            if affordable and (gain > cost if self.opponent == "rules" else self._choices.random() < 0.5):
                return "[Accept]"
        if self.opponent == "rules" or self._choices.random() < 0.5:
            return "[Deny]"
        give, want = self._choices.sample(RESOURCES, 2)
        return f"[Offer: 1 {give} -> 1 {want}]"

    # -- views ----------------------------------------------------------------------------------------------

    def _drain(self) -> dict[str, str]:
        """Each seat's messages since the last call, as its own view: its own moves' echo left out, the
        other player's moves shown only where they carry talk."""
        kinds = self._package.ObservationType
        observations = self._arena.state.observations
        views = {}
        for pid in (0, 1):
            lines: list[str] = []
            for sender, message, kind in observations[pid]:
                if kind == kinds.PLAYER_ACTION:
                    if sender == pid or self._base not in SPEECH_GAMES:
                        continue
                    message = f"Player {sender} said: {message}"
                if message.strip() and (not lines or lines[-1] != message.strip()):  # TextArena repeats some
                    lines.append(message.strip())
            observations[pid] = []
            if lines:
                views[seat_of(pid)] = "\n".join(lines)
        return views


def _wins(board: list[str], mark: str) -> bool:
    lines = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]
    return any(all(board[i] == mark for i in line) for line in lines)
