"""What the page shows of a game of several seats (:mod:`omrl.rollout.seats`): every seat's moves in
play order, who played each seat, and each seat's outcome.

A seat the policy played is an episode of its own; its info holds ``seat``, ``players`` (seat -> who
played it: policy, scripted, a model's name), ``outcome``, ``seat_rewards`` and ``game`` (shared by the
episodes of one game), and ``moves``, the whole game's ``[seat, action]`` in play order, the other seats'
too. The policy's k-th move as a seat is that seat's episode's k-th turn, so the page lays the turns of
every seat the policy played among the other seats' actions. A file without ``moves`` (written before
the rollout kept them) shows the turns it has, the seats taking turns by turn number, and says the order
is assumed. Fields of another shape are left out, never an error.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable

from omrl.view.groups import info_dict

OUTCOMES = ("win", "draw", "loss", "unfinished", "error")
MAX_SEAT_EPISODES = 16  # episodes of one game read for its page (a game has one per seat the policy played)


def seat_fields(info: Any) -> dict[str, Any]:
    """The fields a seat's episode adds to its summary (seat, player, opponent, outcome, game); {} for an
    episode of one agent.

    >>> seat_fields('{"seat": "player_1", "players": {"player_0": "scripted", "player_1": "policy"}, "game": 3}')
    {'seat': 'player_1', 'player': 'policy', 'opponent': '', 'outcome': '', 'game': '3/b3814ca7'}
    >>> seat_fields(None)
    {}
    """
    info = info_dict(info)
    seat = info.get("seat")
    if not isinstance(seat, str) or not seat:
        return {}
    players = info.get("players") if isinstance(info.get("players"), dict) else {}
    game = info.get("game")
    if isinstance(game, (int, str)) and not isinstance(game, bool):
        # the index counts from 0 in each play: two plays in one file are told apart by what their games hold
        what = json.dumps([players, info.get("moves"), info.get("seat_rewards")], sort_keys=True, default=str)
        game = f"{game}/{hashlib.sha1(what.encode('utf-8')).hexdigest()[:8]}"
    return {
        "seat": seat,
        "player": str(players.get(seat, "policy")),
        "opponent": str(info.get("opponent") or ""),
        "outcome": str(info.get("outcome") or ""),
        "game": game if isinstance(game, str) else None,
    }


def game_key(file: int, summary: dict[str, Any]) -> str | None:
    """The key the episodes of one game share: its file, env, task, sample and game (its index and a digest
    of its players, moves and rewards); None for an episode of one agent."""
    if summary.get("game") is None:
        return None
    return f"{file}:{summary['env']}:{summary['task']}:{summary['sample']}:{summary['game']}"


def game_view(members: list[tuple[dict[str, Any], dict[str, Any]]], cut: Callable[[Any], Any]) -> dict[str, Any]:
    """The whole game from the policy's episodes of it, ``(summary, row)`` each: its seats (who played
    each, its outcome and reward, its episode) and its moves in play order, texts cut by ``cut``."""
    infos = [info_dict(row.get("info")) for _, row in members]
    players: dict[str, str] = {}
    for info in infos:
        if isinstance(info.get("players"), dict):
            players.update({str(s): str(p) for s, p in info["players"].items()})
    rewards = next(
        (i["seat_rewards"] for i in infos if isinstance(i.get("seat_rewards"), dict) and i["seat_rewards"]), {}
    )
    turns: dict[str, tuple[int, list[dict[str, Any]]]] = {}
    outcomes: dict[str, str] = {}
    for (summary, row), info in zip(members, infos):
        seat = str(info.get("seat"))
        turns[seat] = (summary["id"], row.get("turns") or [])
        outcomes[seat] = str(info.get("outcome") or "")
    for seat in turns:  # a file whose info names no players: its own seats, the policy's
        players.setdefault(seat, "policy")
    ended = next((o for o in outcomes.values() if o in ("unfinished", "error")), None)
    seats = [
        {
            "seat": seat,
            "player": player,
            "outcome": outcomes.get(seat) or ended or _outcome(rewards.get(seat)),
            "reward": rewards.get(seat) if isinstance(rewards.get(seat), (int, float)) else None,
            "episode": turns[seat][0] if seat in turns else None,
        }
        for seat, player in players.items()
    ]
    log = next((i["moves"] for i in infos if isinstance(i.get("moves"), list)), None)
    moves = _recorded(log, players, turns, cut) if log is not None else _assumed(players, turns, cut)
    return {"seats": seats, "moves": moves, "order": "recorded" if log is not None else "assumed"}


def _recorded(log: list[Any], players: dict[str, str], turns: dict, cut: Callable[[Any], Any]) -> list[dict[str, Any]]:
    """The logged moves, each policy seat's k-th joined with its episode's k-th turn; turns past the log
    (a reply that failed, so the env was never stepped) come last."""
    used = dict.fromkeys(turns, 0)
    moves = []
    for entry in log:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2):
            continue
        seat, action = str(entry[0]), entry[1]
        move = {"seat": seat, "player": players.get(seat, ""), "action": cut(action if isinstance(action, str) else "")}
        if seat in turns and used[seat] < len(turns[seat][1]):
            move.update(_turn(turns[seat][0], used[seat], turns[seat][1][used[seat]], cut))
            used[seat] += 1
        moves.append(move)
    for seat, (episode, seat_turns) in turns.items():
        for k in range(used[seat], len(seat_turns)):
            moves.append({"seat": seat, "player": players.get(seat, ""), **_turn(episode, k, seat_turns[k], cut)})
    return moves


def _assumed(players: dict[str, str], turns: dict, cut: Callable[[Any], Any]) -> list[dict[str, Any]]:
    """The policy seats' turns when no log was kept: turn 1 of every seat in seat order, then turn 2, ..."""
    moves = []
    for k in range(max((len(t) for _, t in turns.values()), default=0)):
        for seat in players:
            if seat in turns and k < len(turns[seat][1]):
                moves.append(
                    {"seat": seat, "player": players[seat], **_turn(turns[seat][0], k, turns[seat][1][k], cut)}
                )
    return moves


def _turn(episode: int, index: int, turn: dict[str, Any], cut: Callable[[Any], Any]) -> dict[str, Any]:
    return {
        "episode": episode,
        "turn": index,
        "observation": cut(turn.get("observation") or ""),
        "response": cut(turn.get("response") or ""),
        "action": cut(turn.get("action")),
        "format_ok": turn.get("format_ok"),
        "invalid": bool(info_dict(turn.get("info")).get("invalid")),
    }


def _outcome(reward: Any) -> str:
    """A seat's outcome from its reward in a game played out: +1 win, -1 loss, 0 draw (as play_seats says)."""
    if not isinstance(reward, (int, float)):
        return ""
    return "win" if reward > 0 else "loss" if reward < 0 else "draw"
