"""Games of several agents: each seat of a seated env (:attr:`omrl.envs.Env.seats`) has its own chat.

:func:`play_seats` plays ``group_size`` games of each task, each seat played by whom the seating says
(:mod:`omrl.rollout.seating`): the policy, the env's scripted player, a fixed model or a past checkpoint.
A seat's chat is laid out token-exact by the steps every omrl chat grows by (:mod:`omrl.rollout.live`):
its opening is the env's view for that seat, each later user message what the seat saw since it last
moved (the other seats' moves, as the env shows them to it), under either history mode. Each round,
the scripted seats move at once, then every policy seat to move, across all games, is generated in ONE
call (each fixed model's seats in one call of their own), then the envs step together.

A reply that does not parse is answered as in a one-agent chat and the env is stepped with ``""``: its
own invalid-move rule (retry, forfeit) decides, so no game stalls on one seat's format. A game stops
at ``limits.max_turns`` moves of all seats together (0: the env's ``max_turns``) or when a seat's row
is full; such a game is ``unfinished`` and every seat's reward 0.

Out come the policy's episodes, one per (game, seat the policy played): its own turns are trained
(loss_mask 1), the other seats' moves are in it only as the observations it was shown (loss_mask 0).
``ep.group`` is ``task index * len(seats) + seat index``: advantages compare one seat of one game setup
(SPIRAL's role-conditioned baseline). The seat's reward (+1/-1/0) is added to its last turn's reward;
``ep.won`` is a win and ``ep.score`` (reward + 1) / 2. ``ep.info``: ``seat``, ``players`` (seat -> who
played it), ``opponent`` (the other seats' players), ``outcome`` (win, draw, loss, unfinished or error),
``seat_reward``, ``seat_rewards`` (every seat's, once the game was played out), ``game`` (its index: the
episodes of one game share it) and ``moves`` (the game's moves in play order, each ``[seat, action]``, the
other seats' too: ``omrl view`` shows the whole game from them). A seat the policy played
that never had a turn (the game ended first) gives an episode without turns: nothing to train and a
reward of 0, but the game counts in the seat's outcomes (a win when the other seat forfeited); an
expert's seat without a turn gives none (it holds no SFT data).

An ``expert`` player (:func:`~omrl.rollout.seating.expert_seating`: ``PlaySpec.expert``, ``omrl rollout
--expert``) is the env's scripted player in the policy's place: its move is written by the template's
``format_action`` as the one-agent expert's is (:mod:`omrl.rollout.loop`) and recorded as a reply
(loss_mask 1, log-probs 0), and its seats' episodes are kept as the policy's are: SFT data.
"""

from __future__ import annotations

import random
from typing import Any, Mapping, Sequence

from omrl.backends.base import Backend
from omrl.chat import check_history
from omrl.chat.conformance import check_run_template
from omrl.data.trajectory import Episode
from omrl.errors import OmrlError
from omrl.rollout.loop import RolloutLimits
from omrl.rollout.pool import EnvPool
from omrl.rollout.progress import RolloutProgress
from omrl.rollout.seat_rounds import Game, Seat, SeatPlay
from omrl.rollout.seating import Player, SeatSource, check_seating, draw_players
from omrl.templates import Template


def play_seats(
    pool: EnvPool,
    template: Template,
    tokenizer: Any,
    tasks: Sequence[int],
    *,
    seating: Mapping[str, SeatSource],
    backend: Backend | None = None,
    limits: RolloutLimits | None = None,
    split: str = "train",
    group_size: int = 1,
    seed: int = 0,
    demonstration: bool = True,
    progress: RolloutProgress | None = None,
    max_parallel: int = 0,
) -> list[Episode]:
    """Play ``group_size`` games of each task; the policy's episodes, ordered by (group, sample).

    ``seating``: seat -> :class:`~omrl.rollout.seating.Player` (or past checkpoints, drawn per game with
    ``seed``); ``backend`` generates the policy's seats, with ``tokenizer`` (an expert's need none).
    ``max_parallel`` caps the games played at once (0: all); a game that ends makes room for the next."""
    limits = limits or RolloutLimits()
    seats = check_seating(seating, pool.env_class, pool.name)
    if group_size < 1:
        raise OmrlError(f"group_size must be >= 1, got {group_size}")
    if max_parallel < 0:
        raise OmrlError(f"max_parallel must be >= 0 (0: every game at once), got {max_parallel}")
    check_history(limits.history)
    if backend is None and any(isinstance(s, Player) and s.kind == "policy" for s in seating.values()):
        raise OmrlError("play_seats needs the policy's generation backend for the seats the policy plays")
    rng = random.Random(seed)
    games = []
    for task_index, task in enumerate(tasks):
        for sample in range(group_size):
            players = draw_players(seating, rng)
            chairs = {s: Seat(s, p, p.tokenizer or tokenizer) for s, p in players.items()}
            games.append(Game(len(games), task_index, sample, int(task), chairs))
    for tok in {
        id(seat.tokenizer): seat.tokenizer
        for g in games
        for seat in g.seats.values()
        if seat.player.kind not in ("scripted", "expert")  # an expert's chats are SFT data, laid out by SFT's rule
    }.values():
        check_run_template(tok, limits.history, limits.template_kwargs)  # every model's rows as its template lays them
    play = SeatPlay(pool, template, seats, backend, limits, split, seed, demonstration, progress or RolloutProgress())
    waiting, live = list(games), []
    while live or waiting:
        room = len(waiting) if not max_parallel else max_parallel - len(live)
        started, waiting = waiting[:room], waiting[room:]
        if started:  # the games that ended made room: the next ones start
            play.reset(started)
            live = play.sweep(live + started)
        play.scripted_moves(live)
        live = play.sweep(live)
        play.model_moves(live)
        live = play.sweep(live)
    used = {id(p.backend): p.backend for g in games for p in (c.player for c in g.seats.values()) if p.backend}
    for generator in [backend, *used.values()]:
        if generator is not None:  # shared openings may stay; the update needs the memory the rest held
            generator.release()
    return sorted(play.episodes, key=lambda ep: (ep.group, ep.sample))
