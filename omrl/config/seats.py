"""Who plays each seat of a game of several agents (:mod:`omrl.rollout.seats`): the ``seats`` section.

Each seat is named by the env (``player_0``, ``player_1``); a seat the config leaves out plays the
policy, so an empty section is self-play. What a seat can be given:

=====================  ==================================================================
``policy``             the model being trained (every seat: self-play); its turns train it
``scripted``           the env's own player (``Env.scripted_action``)
``model:NAME``         a fixed model: a built-in name, a folder or a hub id (hf backend)
``openai:NAME@URL``    a fixed model served at an OpenAI-compatible endpoint
``past`` / ``past:K``  the run's own checkpoints: each game draws one of the newest K uniformly
=====================  ==================================================================

Only the policy's seats are trained on; the others are context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from omrl.config.fields import opt
from omrl.errors import ConfigError

PLAYER_FORMS = ("policy", "scripted", "model:NAME", "openai:NAME@URL", "past", "past:K")


@dataclass
class SeatsConfig:
    play: dict[str, str] = opt(
        {},
        "Who plays each seat of a multi-seat env, by seat name (seats.play.player_1=scripted): policy, scripted "
        "(the env's own player), model:NAME (a fixed model), openai:NAME@URL (one at an OpenAI-compatible "
        "endpoint), past or past:K (one of the run's newest K checkpoints per game). Seats left out play the "
        "policy: {} is self-play.",
    )
    past_last: int = opt(
        3, "past: each game draws one of the newest K checkpoints, uniformly (past:K sets K per seat)."
    )
    api_key_env: str = opt("OPENAI_API_KEY", "openai:NAME@URL seats: the environment variable holding the key.")


@dataclass(frozen=True)
class PlayerSpec:
    """One seat's player as the config gives it. ``kind``: policy, scripted, model, openai or past;
    ``model``/``base_url`` for a fixed model, ``last`` (K) for past checkpoints."""

    kind: str
    model: str = ""
    base_url: str = ""
    last: int = 0

    @property
    def label(self) -> str:
        """How episodes and reports name this player: ``policy``, ``scripted``, ``model:tiny``, ``past``."""
        return {"model": f"model:{self.model}", "openai": f"openai:{self.model}"}.get(self.kind, self.kind)


def parse_player(seat: str, text: str, past_last: int = 3) -> PlayerSpec:
    """``seats.play.<seat>``'s value as a PlayerSpec; ConfigError naming the valid forms otherwise."""
    where = f"seats.play.{seat}"
    if not isinstance(text, str):
        raise ConfigError(f"{where} must be text, got {text!r}; valid: {', '.join(PLAYER_FORMS)}")
    kind, _, rest = text.strip().partition(":")
    if kind in ("policy", "scripted") and not rest:
        return PlayerSpec(kind)
    if kind == "model" and rest:
        return PlayerSpec("model", model=rest)
    if kind == "openai" and "@" in rest:
        model, _, url = rest.partition("@")
        if model and url.startswith(("http://", "https://")):
            return PlayerSpec("openai", model=model, base_url=url)
    if kind == "past":
        last = rest or str(past_last)
        if last.isdigit() and int(last) >= 1:
            return PlayerSpec("past", last=int(last))
        raise ConfigError(f"{where}: {text!r} needs K >= 1 newest checkpoints (past:K); got {last!r}")
    raise ConfigError(f"{where}: {text!r} is not a player; valid: {', '.join(PLAYER_FORMS)}")


def seat_players(config: SeatsConfig, seats: Sequence[str], env_name: str) -> dict[str, PlayerSpec]:
    """Every seat of ``env_name`` (which declares ``seats``) with its player; seats the config leaves out
    play the policy. Refused, naming what is valid: a seat the env does not have, a config for an env
    without seats, a seating where the policy plays no seat (nothing would train), ``past_last`` < 1."""
    play = dict(config.play or {})
    if not seats:
        if play:
            raise ConfigError(
                f"seats.play names seats {', '.join(sorted(play))} but env {env_name!r} has none: it is played by "
                "one agent; leave seats.play empty, or choose an env that declares seats"
            )
        return {}
    unknown = sorted(set(play) - set(seats))
    if unknown:
        raise ConfigError(f"seats.play names {', '.join(unknown)}; env {env_name!r} has seats {', '.join(seats)}")
    if config.past_last < 1:
        raise ConfigError(f"seats.past_last must be >= 1, got {config.past_last}")
    players = {seat: parse_player(seat, play.get(seat, "policy"), config.past_last) for seat in seats}
    if not any(spec.kind == "policy" for spec in players.values()):
        raise ConfigError(
            f"seats.play gives no seat of {env_name!r} to the policy ({', '.join(f'{s}={p.label}' for s, p in players.items())}); "
            "at least one seat must be policy, or nothing is trained or measured"
        )
    return players
