"""Tool-call health: a run whose policy stopped calling tools well says so, then stops.

A policy that offers no well-formed call still earns rewards in many envs (a run reached 0.93 reward
without one tool call), so a run that needs tools can look healthy while it learns to do without
them, or while a template change makes every call unreadable. Each step's rollout metrics say how the
policy wrote its calls (:func:`omrl.evaluation.tool_call_health`); :class:`ToolHealth` reads them:

- no well-formed call to an offered tool in ``tool_health.max_steps_without_valid_call`` steps in a row:
  a warning at half of them, then the run stops (exit status 2) with the rates;
- more than ``tool_health.max_malformed_rate`` of the attempts unreadable (:data:`~omrl.evaluation.MALFORMED`)
  for ``tool_health.malformed_steps`` steps in a row: a warning at the first, then the run stops.

Steps whose turns offered no tools count for neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from omrl.errors import ConfigError, OmrlError


class ToolCallsFailing(OmrlError):
    """The policy's tool calls stayed absent or unreadable past the run's bound."""


@dataclass
class ToolHealth:
    """The steps in a row without a valid call (``dry``) and with too many unreadable ones (``malformed``)."""

    limits: Any  # a ToolHealthConfig
    dry: int = 0
    malformed: int = 0

    def __post_init__(self) -> None:
        check(self.limits)

    def state_dict(self) -> dict[str, int]:
        """What a checkpoint keeps: the steps in a row counted so far."""
        return {"tool_dry_steps": self.dry, "tool_malformed_steps": self.malformed}

    def load_state_dict(self, extra: dict[str, Any]) -> None:
        self.dry, self.malformed = int(extra.get("tool_dry_steps", 0)), int(extra.get("tool_malformed_steps", 0))

    def check(self, step: int, metrics: dict[str, float], warn: Callable[[str], None]) -> None:
        """Count ``step``'s rollout; warn, or raise :class:`ToolCallsFailing`, as the limits say."""
        if "valid_call_turn_rate" not in metrics:  # no turn offered tools
            return
        limits = self.limits
        self.dry = self.dry + 1 if metrics["valid_call_turn_rate"] == 0 else 0
        self.malformed = self.malformed + 1 if metrics["malformed_tool_call_rate"] > limits.max_malformed_rate else 0
        rates = _rates(metrics)
        steps = limits.max_steps_without_valid_call
        if steps and self.dry >= steps:
            raise ToolCallsFailing(
                f"step {step}: no reply of the last {self.dry} steps made a well-formed call to an offered tool "
                f"({rates}), so the run stops: is the template's call format the one the model writes? "
                "(tool_health.max_steps_without_valid_call=0 lets it go on)"
            )
        if steps and self.dry == max(1, steps // 2):
            warn(
                f"step {step}: no well-formed tool call in {self.dry} steps in a row ({rates}); the run stops "
                f"at {steps} (tool_health.max_steps_without_valid_call)"
            )
        if self.malformed >= limits.malformed_steps:
            raise ToolCallsFailing(
                f"step {step}: more than {limits.max_malformed_rate:g} of the tool-call attempts could not be "
                f"read in {self.malformed} steps in a row ({rates}), so the run stops "
                "(tool_health.max_malformed_rate=1 lets it go on)"
            )
        if self.malformed == 1:
            warn(
                f"step {step}: {metrics['malformed_tool_call_rate']:.0%} of the tool-call attempts could not be "
                f"read ({rates}); the run stops after {limits.malformed_steps} such steps in a row"
            )


def _rates(metrics: dict[str, float]) -> str:
    shown = {key: value for key, value in metrics.items() if key.startswith("tool_call_") and key.endswith("_rate")}
    parts = [f"valid call in {metrics['valid_call_turn_rate']:.0%} of turns offering tools"]
    parts += [f"{key[len('tool_call_') : -len('_rate')]} {value:.0%}" for key, value in shown.items() if value]
    return ", ".join(parts)


def check(limits: Any) -> None:
    """Refuse limits that mean nothing, naming the key and what is valid."""
    if limits.max_steps_without_valid_call < 0:
        raise ConfigError(
            f"tool_health.max_steps_without_valid_call must be >= 0 (0: never stop), got {limits.max_steps_without_valid_call}"
        )
    if not 0 <= limits.max_malformed_rate <= 1 or limits.malformed_steps < 1:
        raise ConfigError(
            "tool_health.max_malformed_rate must be in [0, 1] (1: never stop) and tool_health.malformed_steps >= 1; "
            f"got {limits.max_malformed_rate} and {limits.malformed_steps}"
        )
