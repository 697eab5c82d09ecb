"""Who sits at each seat of a game (:mod:`omrl.rollout.seats`): the policy, the env's scripted player,
a fixed model, or one of the run's past checkpoints drawn per game.

:func:`seating_from_config` builds a seating from the run config's ``seats`` section
(:mod:`omrl.config.seats`); tests and callers that hold their own backends build one directly::

    seating = {"player_0": POLICY, "player_1": Player("model", "model:tiny", other_backend)}
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Callable, Mapping, Sequence

from omrl.backends import Backend, make_backend
from omrl.config.seats import PlayerSpec, SeatsConfig, seat_players
from omrl.envs import Env, check_seats
from omrl.errors import ConfigError, OmrlError


@dataclass(frozen=True)
class Player:
    """Who plays a seat in one game. ``kind``: policy (the rollout's backend), scripted (the env's own
    player), expert (the env's own player in the policy's place: its moves written as the policy's
    replies, its episodes kept), model or past (``backend``, a fixed generator); ``name``: how episodes
    and reports name it."""

    kind: str
    name: str
    backend: Backend | None = None

    @property
    def tokenizer(self) -> Any:
        """The tokenizer this player's chats are laid out with (None: the policy's)."""
        return self.backend.tokenizer if self.backend is not None else None


POLICY = Player("policy", "policy")
SCRIPTED = Player("scripted", "scripted")
EXPERT = Player("expert", "expert")


def checkpoint_name(folder: str) -> str:
    """How episodes and metrics name a past checkpoint: its step folder (``step-00000002``), whether
    ``folder`` is that folder or the ``model`` folder a checkpoint keeps its weights in."""
    path = PurePath(folder)
    return path.parent.name if path.name == "model" else path.name


class PastCheckpoints:
    """The run's own past checkpoints as one seat's player: each game draws one of the newest ``last``
    of ``folders`` (oldest first), uniformly. A folder's backend is built by ``load`` when first drawn
    and kept (K is small)."""

    def __init__(self, folders: Sequence[str], last: int, load: Callable[[str], Backend]):
        if last < 1:
            raise OmrlError(f"past checkpoints: last must be >= 1, got {last}")
        self.folders = [str(folder) for folder in folders]
        self.last = last
        self._load = load
        self._backends: dict[str, Backend] = {}

    def candidates(self) -> list[str]:
        return self.folders[-self.last :]

    def draw(self, rng: random.Random) -> Player:
        if not self.folders:
            raise OmrlError("a seat plays past checkpoints, but the run has saved none yet")
        folder = rng.choice(self.candidates())
        if folder not in self._backends:
            self._backends[folder] = self._load(folder)
        return Player("past", f"past:{checkpoint_name(folder)}", self._backends[folder])

    def close(self) -> None:
        for backend in self._backends.values():
            backend.close()
        self._backends.clear()


SeatSource = Player | PastCheckpoints


def draw_players(seating: Mapping[str, SeatSource], rng: random.Random) -> dict[str, Player]:
    """Each seat's player for one game (past checkpoints drawn now)."""
    return {
        seat: source.draw(rng) if isinstance(source, PastCheckpoints) else source for seat, source in seating.items()
    }


def expert_seating(seating: Mapping[str, SeatSource]) -> dict[str, SeatSource]:
    """``seating`` with the env's scripted player as the expert at every seat the policy plays."""
    return {
        seat: EXPERT if isinstance(source, Player) and source.kind == "policy" else source
        for seat, source in seating.items()
    }


def check_seating(seating: Mapping[str, SeatSource], env_class: type[Env], env_name: str) -> tuple[str, ...]:
    """The env's seats, once ``seating`` gives each a player the env can seat; ConfigError otherwise."""
    seats = check_seats(env_class, env_name)
    if not seats:
        raise ConfigError(f"env {env_name!r} declares no seats: it is played by one agent (omrl.rollout.collect)")
    missing, unknown = [s for s in seats if s not in seating], sorted(set(seating) - set(seats))
    if missing or unknown:
        raise ConfigError(
            f"the seating of {env_name!r} names {', '.join(sorted(seating)) or 'no seat'}; it must name every seat "
            f"and only those: {', '.join(seats)}"
        )
    for seat, source in seating.items():
        if not isinstance(source, (Player, PastCheckpoints)):
            raise ConfigError(f"seat {seat!r} is given {source!r}; a Player or PastCheckpoints plays a seat")
        if isinstance(source, Player) and source.kind in ("model", "past") and source.backend is None:
            raise ConfigError(f"seat {seat!r}: a {source.kind} player needs its backend")
    kinds = {s.kind for s in seating.values() if isinstance(s, Player)}
    if "expert" in kinds:
        _check_expert(env_class, env_name)
    if "scripted" in kinds and env_class.scripted_action is Env.scripted_action:
        raise ConfigError(
            f"env {env_name!r} has no scripted player (it defines no scripted_action); seat its players with "
            "policy, model:NAME, openai:NAME@URL or past"
        )
    return seats


def _check_expert(env_class: type[Env], env_name: str) -> None:
    if env_class.scripted_action is Env.scripted_action:
        raise ConfigError(
            f"env {env_name!r} has seats but no scripted player (it defines no scripted_action), so no expert "
            "plays its games; drop --expert and play it with a model"
        )


def seating_from_config(
    config: SeatsConfig,
    env_class: type[Env],
    env_name: str,
    *,
    policy_tokenizer: Any,
    generation: Any,
    dtype: str = "float32",
    checkpoints: Sequence[str] = (),
) -> dict[str, SeatSource]:
    """The seating the run config's ``seats`` section gives ``env_name``'s seats: fixed models are loaded now
    (hf, or an endpoint through the openai backend, each with its own tokenizer), past checkpoints when a
    game first draws them (with the policy's tokenizer: they are its own checkpoints, ``checkpoints``
    oldest first). ``generation``: the run's GenerationConfig, which their backends share."""
    from omrl.models import load_tokenizer

    specs = seat_players(config, check_seats(env_class, env_name), env_name)

    def fixed(spec: PlayerSpec) -> Player:
        tokenizer = load_tokenizer(spec.model)
        if spec.kind == "openai":
            options = dataclasses.replace(
                generation, base_url=spec.base_url, api_key_env=config.api_key_env, weight_sync="none"
            )
            return Player("model", spec.label, make_backend("openai", tokenizer, options, model_name=spec.model))
        return Player(
            "model", spec.label, make_backend("hf", tokenizer, generation, model_name=spec.model, dtype=dtype)
        )

    def past(folder: str) -> Backend:
        return make_backend("hf", policy_tokenizer, generation, model_name=folder, dtype=dtype)

    seating: dict[str, SeatSource] = {}
    for seat, spec in specs.items():
        if spec.kind == "policy":
            seating[seat] = POLICY
        elif spec.kind == "scripted":
            seating[seat] = SCRIPTED
        elif spec.kind == "past":
            seating[seat] = PastCheckpoints(checkpoints, spec.last, past)
        else:
            try:
                seating[seat] = fixed(spec)
            except OmrlError as exc:  # "model X not found" read as if --model were wrong: name the seat
                raise OmrlError(f"seats.play.{seat}={spec.label}: {exc}") from exc
    check_seating(seating, env_class, env_name)
    return seating


def seating_of(
    cfg: Any, env_class: type[Env], env_name: str, tokenizer: Any, expert: bool, mixture: bool, agent: Any
) -> dict[str, SeatSource] | None:
    """The seating of one env of a run (:func:`seating_from_config` with ``cfg.seats``), or None for an
    env of one agent. Refused, naming the fix: a ``seats`` section for an env of one agent, and a seated
    env in a mixture (``mixture``), played by an agent program (``agent``) or, with ``expert``, one with
    no scripted player to play the policy's seats (:func:`expert_seating`)."""
    if mixture and cfg.seats.play:  # said before "env X has no seats" of its first env sends one astray
        raise ConfigError(
            "seats.play is set, but a mixture plays envs of one agent: play a game of several seats alone in "
            "env.name, or leave seats.play empty"
        )
    seats = check_seats(env_class, env_name)
    if not seats:
        seat_players(cfg.seats, (), env_name)  # refuses seats.play for an env of one agent
        return None
    where = f"env {env_name!r} has seats ({', '.join(seats)})"
    if mixture:
        raise ConfigError(f"{where}: a mixture plays envs of one agent; name {env_name} alone in env.name")
    if agent is not None:
        raise ConfigError(f"{where}: an agent program plays one agent; leave agent.* unset for it")
    if expert:
        _check_expert(env_class, env_name)
    past = [seat for seat, spec in seat_players(cfg.seats, seats, env_name).items() if spec.kind == "past"]
    if past and not hasattr(cfg, "algorithm"):  # rollout, eval, sweep: they save no checkpoints to draw from
        raise ConfigError(
            f"seats.play.{past[0]}=past plays a training run's past checkpoints, and this command saves none (it "
            f"would play the model itself); name the model it should play: seats.play.{past[0]}=model:DIR"
        )
    return seating_from_config(
        cfg.seats,
        env_class,
        env_name,
        policy_tokenizer=tokenizer,
        generation=cfg.generation,
        dtype=cfg.model.dtype,
        checkpoints=[cfg.model.name],  # until the run saves its own: the model it starts from
    )


def close_seating(seating: Mapping[str, SeatSource] | None) -> None:
    """Stop the fixed models and past checkpoints a seating loaded."""
    for source in (seating or {}).values():
        if isinstance(source, PastCheckpoints):
            source.close()
        elif source.backend is not None:
            source.backend.close()
