"""The rounds of seated games that :func:`omrl.rollout.seats.play_seats` plays, and their state.

A :class:`SeatPlay` holds what every round needs and the episodes so far: it resets the games' envs,
plays the scripted seats' moves, lays out each model seat's next user message and gets its reply (the
policy's in one generate call, each fixed model's in one, an expert's from the env's scripted player),
steps the envs together and, when a game ends, writes the episodes of the seats the policy played.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from omrl.backends.base import Backend, Generation, SamplingParams
from omrl.chat.encoding import encode_plain
from omrl.clock import timed
from omrl.data.trajectory import Episode
from omrl.env_results import EMPTY_OBSERVATION
from omrl.envs import Env, Observation, clean_text, seat_reset_problem, seat_step_problem
from omrl.errors import OmrlError
from omrl.rollout.live import ROLLOUT_KEYS, LiveEpisode, continue_chat, raised, record_reply
from omrl.rollout.loop import open_episode
from omrl.rollout.seating import Player
from omrl.supervisor import stage

KEPT = ("policy", "expert")  # the players whose seats' episodes a play gives back


@dataclass(eq=False)
class Seat:
    """One seat of one game: who plays it, what it saw since it last moved, and its chat once it moved."""

    name: str
    player: Player
    tokenizer: Any
    pending: list[str] = field(default_factory=list)
    opening: str = ""  # its view at reset: its role and rules
    live: LiveEpisode | None = None
    chat_kwargs: dict = field(default_factory=dict)


@dataclass(eq=False)
class Game:
    """One game of a seated env: its task and sample, its seats, the seat to move, its moves so far and how it ended."""

    index: int
    task_index: int
    sample: int
    task: int
    seats: dict[str, Seat]
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


class SeatPlay:
    """The state of one :func:`~omrl.rollout.seats.play_seats` call: what every round needs, and the episodes so far."""

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

    def reset(self, games: list[Game]) -> None:
        for game in games:
            game.env = self.pool.acquire()
        with timed("env"):
            firsts = self.pool.reset_many(
                [(g.env, g.task) for g in games], [f"task {g.task} game {g.index}" for g in games]
            )
        for game, first in zip(games, firsts):
            if self.answer_failed(game, first, seat_reset_problem, "reset"):
                continue
            game.instruction, game.to_move = clean_text(first.instruction), first.seat
            for seat, text in first.views.items():
                game.seats[seat].opening = clean_text(text)
                game.seats[seat].pending.append(game.seats[seat].opening)

    def answer_failed(self, game: Game, answer: Any, problem_of: Callable[..., str | None], call: str) -> bool:
        """Fail ``game`` when the env's answer to ``call`` ("reset", "step") is an exception (the env is
        broken) or breaks the seat contract (``problem_of`` says how); False when the answer is sound."""
        if isinstance(answer, BaseException):
            game.fail(f"{call} failed: {raised(answer)}", broken=True)
            return True
        problem = problem_of(answer, self.seats)
        if problem:
            game.fail(f"{call} failed: env {self.pool.name!r} {problem}")
        return bool(problem)

    def scripted_actions(self, games: list[Game]) -> list[Any]:
        """The env's own player's move for each game's seat to move (an exception where it raised)."""
        seat_of = {id(g.env): g.to_move for g in games}
        return self.pool.call_many(lambda env: env.scripted_action(seat_of[id(env)]), [g.env for g in games])

    def expert_actions(self, games: list[Game]) -> list[Any]:
        """The expert's move for each game's seat to move: the env's ``expert_action`` where it has one
        (its own player may err on purpose, as solve-verify's solver does), else its own player's."""
        seat_of = {id(g.env): g.to_move for g in games}

        def move(env: Any) -> Any:
            action = env.expert_action()
            return action if action is not None else env.scripted_action(seat_of[id(env)])

        return self.pool.call_many(move, [g.env for g in games])

    def sweep(self, games: list[Game]) -> list[Game]:
        """Finish the games that ended; the others, still to play."""
        for game in games:
            if game.end is not None:
                self.finish(game)
        return [g for g in games if g.end is None]

    def scripted_moves(self, live: list[Game]) -> None:
        """Play the scripted seats' moves until a model seat is to move in every game (or it ended)."""
        while waiting := [g for g in live if g.end is None and g.seats[g.to_move].player.kind == "scripted"]:
            actions = self.scripted_actions(waiting)
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

    def model_moves(self, live: list[Game]) -> None:
        """One move of every model seat to move: the policy's in one generate call, each fixed model's in one,
        the expert's all at once."""
        ready = [g for g in live if self.open_turn(g)]
        by_backend: dict[int, tuple[Backend | None, list[Game]]] = {}
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

    def open_turn(self, game: Game) -> bool:
        """Lay out the user message that leads to the seat's next reply (opening its chat at its first
        turn); False when the game ended here (the row is full)."""
        seat = game.seats[game.to_move]
        text = "\n\n".join(t for t in seat.pending if t) or EMPTY_OBSERVATION
        seat.pending = []
        if seat.live is None:
            ep = self.seat_episode(game, seat.name)
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

    def expert_replies(self, games: list[Game], seats: list[Seat]) -> list[Generation | BaseException]:
        """The expert's move for each expert seat to move, as the ids of the template-formatted reply."""
        actions = self.expert_actions(games)
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

    def generate(self, backend: Backend, seats: list[Seat], policy: bool) -> list[Generation | BaseException]:
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

    def reply(self, game: Game, seat: Seat, reply: Generation | BaseException) -> str | None:
        """Record the seat's reply in its chat; the action to step with ("" for one that did not parse), or
        None when the game ended (the reply failed)."""
        live = seat.live
        action = record_reply(live, reply, self.template, seat.tokenizer, game.env, seat.chat_kwargs)  # type: ignore[arg-type]
        if isinstance(reply, BaseException):
            game.fail(f"generation failed for seat {seat.name!r} ({seat.player.name}): {live.episode.error}")  # type: ignore[union-attr]
            return None
        if live.end == "env_error":  # type: ignore[union-attr]  # the action template failed: not the seat's move
            game.fail(f"seat {seat.name!r} ({seat.player.name}): {live.episode.error}")  # type: ignore[union-attr]
            return None
        if action is None:  # answered as in a one-agent chat; the env's invalid-move rule decides the rest
            feedback = live.next_user if live.end is None else f"Your reply was empty.\n{game.env.action_help}"  # type: ignore[union-attr]
            live.end = None  # type: ignore[union-attr]
            seat.pending.append(feedback)
            return ""
        return action

    def step(self, stepped: list[tuple[Game, str]]) -> None:
        if not stepped:
            return
        labels = [f"task {g.task} game {g.index}" for g, _ in stepped]
        with timed("env"):
            results = self.pool.step_many([(g.env, action) for g, action in stepped], labels)  # type: ignore[misc]
        for (game, action), result in zip(stepped, results):
            game.log.append([game.to_move, action])
            self.apply(game, result)

    def apply(self, game: Game, result: Any) -> None:
        """The env's answer to the move of the seat to move: every seat's view, the next seat, or the end."""
        if self.answer_failed(game, result, seat_step_problem, "step"):
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

    def seat_episode(self, game: Game, seat: str) -> Episode:
        """A new episode for ``seat`` of ``game``: its group is the (game setup, seat)."""
        group = game.task_index * len(self.seats) + self.seats.index(seat)
        return Episode(
            env=self.pool.name, task_id=game.task, split=self.split, instruction="", group=group, sample=game.sample
        )

    def finish(self, game: Game) -> None:
        """Give the env back and write the policy seats' episodes: outcome, reward, info."""
        if game.env is not None:
            problem = self.pool.release(game.env, broken=game.broken)
            if problem is not None and game.end != "env_error":
                game.fail(f"ending the game's env failed: {raised(problem)}")
        names = {seat: chair.player.name for seat, chair in game.seats.items()}
        for seat, chair in game.seats.items():
            if chair.live is None:
                if chair.player.kind != "policy":
                    continue  # an expert's seat is SFT data: without a turn there is nothing to learn from it
                # the game ended before this seat's first turn: an episode without turns (never trained)
                # that still counts the game in the seat's outcomes; its reward is 0, as no turn earned it
                ep = self.seat_episode(game, seat)
                ep.end_reason = game.end or ""
            else:
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
