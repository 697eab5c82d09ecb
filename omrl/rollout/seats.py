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
that never had a turn (the game ended first) gives no episode.

An ``expert`` player (:func:`~omrl.rollout.seating.expert_seating`: ``PlaySpec.expert``, ``omrl rollout
--expert``) is the env's scripted player in the policy's place: its move is written by the template's
``format_action`` as the one-agent expert's is (:mod:`omrl.rollout.loop`) and recorded as a reply
(loss_mask 1, log-probs 0), and its seats' episodes are kept as the policy's are: SFT data.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from omrl.backends.base import Backend, Generation, SamplingParams
from omrl.chat import check_history
from omrl.chat.conformance import check_run_template
from omrl.chat.encoding import encode_plain
from omrl.clock import timed
from omrl.data.trajectory import Episode
from omrl.envs import Env, Observation, clean_text, seat_reset_problem, seat_step_problem
from omrl.errors import OmrlError
from omrl.rollout.live import EMPTY_OBSERVATION, ROLLOUT_KEYS, LiveEpisode, continue_chat, record_reply
from omrl.rollout.loop import RolloutLimits, open_episode
from omrl.rollout.pool import EnvPool
from omrl.rollout.progress import RolloutProgress
from omrl.rollout.seating import Player, SeatSource, check_seating, draw_players
from omrl.supervisor import stage
from omrl.templates import Template

KEPT = ("policy", "expert")  # the players whose seats' episodes a play gives back


@dataclass(eq=False)
class _Seat:
    """One seat of one game: who plays it, what it saw since it last moved, and its chat once it moved."""

    name: str
    player: Player
    tokenizer: Any
    pending: list[str] = field(default_factory=list)
    opening: str = ""  # its view at reset: its role and rules
    live: LiveEpisode | None = None
    chat_kwargs: dict = field(default_factory=dict)


@dataclass(eq=False)
class _Game:
    index: int
    task_index: int
    sample: int
    task: int
    seats: dict[str, _Seat]
    env: Env | None = None
    to_move: str = ""
    instruction: str = ""
    moves: int = 0
    end: str | None = None
    error: str = ""
    broken: bool = False
    rewards: dict[str, float] = field(default_factory=dict)
    log: list[list[str]] = field(default_factory=list)  # [seat, action] per move, in play order (omrl view)

    def fail(self, error: str, broken: bool = False) -> None:
        self.end, self.error, self.broken = "env_error", error, self.broken or broken


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
) -> list[Episode]:
    """Play ``group_size`` games of each task; the policy's episodes, ordered by (group, sample).

    ``seating``: seat -> :class:`~omrl.rollout.seating.Player` (or past checkpoints, drawn per game with
    ``seed``); ``backend`` generates the policy's seats, with ``tokenizer`` (an expert's need none)."""
    limits = limits or RolloutLimits()
    seats = check_seating(seating, pool.env_class, pool.name)
    if group_size < 1:
        raise OmrlError(f"group_size must be >= 1, got {group_size}")
    check_history(limits.history)
    if backend is None and any(isinstance(s, Player) and s.kind == "policy" for s in seating.values()):
        raise OmrlError("play_seats needs the policy's generation backend for the seats the policy plays")
    rng = random.Random(seed)
    games = []
    for task_index, task in enumerate(tasks):
        for sample in range(group_size):
            players = draw_players(seating, rng)
            chairs = {s: _Seat(s, p, p.tokenizer or tokenizer) for s, p in players.items()}
            games.append(_Game(len(games), task_index, sample, int(task), chairs))
    for tok in {
        id(seat.tokenizer): seat.tokenizer
        for g in games
        for seat in g.seats.values()
        if seat.player.kind not in ("scripted", "expert")  # an expert's chats are SFT data, laid out by SFT's rule
    }.values():
        check_run_template(tok, limits.history, limits.template_kwargs)  # every model's rows as its template lays them
    play = _Play(pool, template, seats, backend, limits, split, seed, demonstration, progress or RolloutProgress())
    play.reset(games)
    live = play.sweep(games)
    while live:
        play.scripted_moves(live)
        live = play.sweep(live)
        play.model_moves(live)
        live = play.sweep(live)
    used = {id(p.backend): p.backend for g in games for p in (c.player for c in g.seats.values()) if p.backend}
    for generator in [backend, *used.values()]:
        if generator is not None:  # shared openings may stay; the update needs the memory the rest held
            generator.release()
    return sorted(play.episodes, key=lambda ep: (ep.group, ep.sample))


class _Play:
    """The state of one :func:`play_seats` call: what every round needs, and the episodes so far."""

    def __init__(self, pool, template, seats, backend, limits, split, seed, demonstration, progress):
        self.pool, self.template, self.seats, self.backend = pool, template, seats, backend
        self.limits, self.split, self.seed, self.demonstration, self.progress = (
            limits,
            split,
            seed,
            demonstration,
            progress,
        )
        self.calls = 0
        self.episodes: list[Episode] = []

    def reset(self, games: list[_Game]) -> None:
        for game in games:
            game.env = self.pool.acquire()
        with timed("env"):
            firsts = self.pool.reset_many(
                [(g.env, g.task) for g in games], [f"task {g.task} game {g.index}" for g in games]
            )
        for game, first in zip(games, firsts):
            if isinstance(first, BaseException):
                game.fail(f"reset failed: {type(first).__name__}: {first}", broken=True)
                continue
            problem = seat_reset_problem(first, self.seats)
            if problem:
                game.fail(f"reset failed: env {self.pool.name!r} {problem}")
                continue
            game.instruction, game.to_move = clean_text(first.instruction), first.seat
            for seat, text in first.views.items():
                game.seats[seat].opening = clean_text(text)
                game.seats[seat].pending.append(game.seats[seat].opening)

    def sweep(self, games: list[_Game]) -> list[_Game]:
        """Finish the games that ended; the others, still to play."""
        for game in games:
            if game.end is not None:
                self.finish(game)
        return [g for g in games if g.end is None]

    def scripted_moves(self, live: list[_Game]) -> None:
        """Play the scripted seats' moves until a model seat is to move in every game (or it ended)."""
        while waiting := [g for g in live if g.end is None and g.seats[g.to_move].player.kind == "scripted"]:
            seat_of = {id(g.env): g.to_move for g in waiting}
            actions = self.pool.call_many(
                lambda env, seat_of=seat_of: env.scripted_action(seat_of[id(env)]), [g.env for g in waiting]
            )
            stepped = []
            for game, action in zip(waiting, actions):
                if isinstance(action, BaseException) or not isinstance(action, str):
                    why = (
                        f"{type(action).__name__}: {action}"
                        if isinstance(action, BaseException)
                        else f"it gave {action!r}"
                    )
                    game.fail(
                        f"the scripted player of seat {game.to_move!r} failed ({why})",
                        isinstance(action, BaseException),
                    )
                else:
                    stepped.append((game, action))
            self.step(stepped)

    def model_moves(self, live: list[_Game]) -> None:
        """One move of every model seat to move: the policy's in one generate call, each fixed model's in one,
        the expert's all at once."""
        ready = [g for g in live if self.open_turn(g)]
        by_backend: dict[int, tuple[Backend | None, list[_Game]]] = {}
        for game in ready:
            player = game.seats[game.to_move].player
            chosen = None if player.kind == "expert" else self.backend if player.kind == "policy" else player.backend
            by_backend.setdefault(id(chosen), (chosen, []))[1].append(game)
        stepped = []
        for backend, games in by_backend.values():
            seats = [g.seats[g.to_move] for g in games]
            if backend is None:
                replies = self.expert_replies(games, seats)
            else:
                replies = self.generate(backend, seats, policy=backend is self.backend)
            for game, seat, reply in zip(games, seats, replies):
                action = self.reply(game, seat, reply)
                if action is not None:
                    stepped.append((game, action))
        self.step(stepped)

    def open_turn(self, game: _Game) -> bool:
        """Lay out the user message that leads to the seat's next reply (opening its chat at its first
        turn); False when the game ended here (the row is full)."""
        seat = game.seats[game.to_move]
        text = "\n\n".join(t for t in seat.pending if t) or EMPTY_OBSERVATION
        seat.pending = []
        if seat.live is None:
            group = game.task_index * len(self.seats) + self.seats.index(seat.name)
            ep = Episode(
                env=self.pool.name, task_id=game.task, split=self.split, instruction="", group=group, sample=game.sample
            )
            first = Observation(text, game.instruction or seat.opening)
            opened = open_episode(
                ep,
                game.env,
                first,
                self.template,
                seat.tokenizer,
                self.pool.name,
                self.demonstration,
                self.limits.template_kwargs,
            )
            messages, seat.chat_kwargs, observation = opened  # type: ignore[misc]  # first is a valid Observation
            seat.live = LiveEpisode(ep, messages, observation)
            full = len(ep.token_ids) >= self.limits.max_context
        else:
            seat.live.next_user = text
            continue_chat(
                seat.live, seat.tokenizer, seat.chat_kwargs, 1 << 30, self.limits.max_context, self.limits.history
            )
            full = seat.live.end is not None
        if full:
            game.end = "max_context"
        return not full

    def expert_replies(self, games: list[_Game], seats: list[_Seat]) -> list[Generation | BaseException]:
        """The scripted player's move for each expert seat to move, as the ids of the template-formatted reply."""
        actions = self.pool.call_many(
            lambda env, seat_of={id(g.env): g.to_move for g in games}: env.scripted_action(seat_of[id(env)]),
            [g.env for g in games],
        )
        eos, out = int(seats[0].tokenizer.eos_token_id), []
        for game, seat, action in zip(games, seats, actions):
            if not isinstance(action, str):
                out.append(action if isinstance(action, BaseException) else OmrlError(f"its player gave {action!r}"))
                continue
            row = seat.live.episode.current_row()  # type: ignore[union-attr]
            cap = min(self.limits.max_new_tokens, self.limits.max_context - len(row))
            text = self.template.format_action(action, game.env)  # a reply's text is never special tokens
            ids = (encode_plain(seat.tokenizer, text) + [eos])[:cap]
            out.append(Generation(ids, [0.0] * len(ids), "stop" if ids[-1] == eos else "length"))
        self.progress.generated(sum(len(r.token_ids) for r in out if isinstance(r, Generation)))
        return out

    def generate(self, backend: Backend, seats: list[_Seat], policy: bool) -> list[Generation | BaseException]:
        lim = self.limits
        rows = [s.live.episode.current_row() for s in seats]  # type: ignore[union-attr]
        params = SamplingParams(
            max_new_tokens=[min(lim.max_new_tokens, lim.max_context - len(row)) for row in rows],
            temperature=lim.temperature,
            top_p=lim.top_p,
            seed=self.seed * 1_000_003 + self.calls * 10_007,
        )
        self.calls += 1
        try:
            with stage("generate", episode=f"{len(rows)} seats, call {self.calls}"):
                replies: list[Generation | BaseException] = list(
                    backend.generate(rows, params, messages=[s.live.messages for s in seats])
                )  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - a fixed opponent's endpoint failing ends its games, not the run
            if policy:
                raise
            replies = [exc] * len(seats)
        if policy:
            self.progress.generated(sum(len(r.token_ids) for r in replies if isinstance(r, Generation)))
        return replies

    def reply(self, game: _Game, seat: _Seat, reply: Generation | BaseException) -> str | None:
        """Record the seat's reply in its chat; the action to step with ("" for one that did not parse), or
        None when the game ended (the reply failed)."""
        live = seat.live
        action = record_reply(live, reply, self.template, seat.tokenizer, game.env, seat.chat_kwargs)  # type: ignore[arg-type]
        if isinstance(reply, BaseException):
            game.fail(f"generation failed for seat {seat.name!r} ({seat.player.name}): {live.episode.error}")  # type: ignore[union-attr]
            return None
        if action is None:  # answered as in a one-agent chat; the env's invalid-move rule decides the rest
            feedback = live.next_user if live.end is None else f"Your reply was empty.\n{game.env.action_help}"  # type: ignore[union-attr]
            live.end = None  # type: ignore[union-attr]
            seat.pending.append(feedback)
            return ""
        return action

    def step(self, stepped: list[tuple[_Game, str]]) -> None:
        if not stepped:
            return
        labels = [f"task {g.task} game {g.index}" for g, _ in stepped]
        with timed("env"):
            results = self.pool.step_many([(g.env, action) for g, action in stepped], labels)  # type: ignore[misc]
        for (game, action), result in zip(stepped, results):
            game.log.append([game.to_move, action])
            self.apply(game, result)

    def apply(self, game: _Game, result: Any) -> None:
        """The env's answer to the move of the seat to move: every seat's view, the next seat, or the end."""
        if isinstance(result, BaseException):
            game.fail(f"step failed: {type(result).__name__}: {result}", broken=True)
            return
        problem = seat_step_problem(result, self.seats)
        if problem:
            game.fail(f"step failed: env {self.pool.name!r} {problem}")
            return
        mover = game.seats[game.to_move]
        if mover.live is not None and mover.player.kind != "scripted":
            turn = mover.live.episode.turns[-1]
            turn.reward, turn.done = float(result.reward), bool(result.done)
            turn.info = {**result.info, **{key: turn.info[key] for key in ROLLOUT_KEYS if key in turn.info}}
        for seat, text in result.views.items():
            if text:
                game.seats[seat].pending.append(clean_text(text))
        game.moves += 1
        if result.done:
            game.end, game.rewards = "done", {seat: float(value) for seat, value in result.seat_rewards.items()}
        elif game.moves >= (self.limits.max_turns or int(game.env.max_turns)):  # type: ignore[union-attr]
            game.end = "max_turns"
        else:
            game.to_move = result.seat

    def finish(self, game: _Game) -> None:
        """Give the env back and write the policy seats' episodes: outcome, reward, info."""
        if game.env is not None:
            problem = self.pool.release(game.env, broken=game.broken)
            if problem is not None and game.end != "env_error":
                game.fail(f"ending the game's env failed: {type(problem).__name__}: {problem}")
        names = {seat: chair.player.name for seat, chair in game.seats.items()}
        for seat, chair in game.seats.items():
            if chair.live is None:
                continue
            ep = chair.live.episode
            chair.live.end = game.end
            chair.live.record_end()
            owner = self.backend if chair.player.kind == "policy" else chair.player.backend
            if owner is not None:
                owner.release([ep.token_ids[a:b] for a, b in ep.rows()])
            if chair.player.kind not in KEPT:
                continue  # another model's seat: context, never trained
            reward = game.rewards.get(seat, 0.0) if game.end == "done" else 0.0
            if game.end == "env_error":
                ep.error, outcome = ep.error or game.error, "error"
            elif game.end != "done":
                outcome = "unfinished"
            else:
                outcome = "win" if reward > 0 else "loss" if reward < 0 else "draw"
            if ep.turns:
                ep.turns[-1].reward += reward
            ep.won, ep.score = outcome == "win", (reward + 1.0) / 2.0
            ep.info = {
                "seat": seat,
                "players": names,
                "opponent": " + ".join(name for other, name in names.items() if other != seat),
                "outcome": outcome,
                "seat_reward": reward,
                "seat_rewards": dict(game.rewards) if game.end == "done" else {},
                "game": game.index,
                "moves": list(game.log),
            }
            self.episodes.append(ep)
            self.progress.finished(ep)
