"""PPO's critic: a value head on the policy's backbone (``algorithm.critic=head``), or on a backbone
of its own trained with the value loss only (``algorithm.critic=model``); what a checkpoint keeps of
it and how it is restored."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from omrl.config.options import TrainRunConfig
from omrl.parallel import Strategy
from omrl.training import checkpoint as ckpt
from omrl.training.model_setup import load_trainable_model
from omrl.training.policy import ValueHead


def load_critic(cfg: TrainRunConfig, strategy: Strategy, policy: Any) -> tuple[ValueHead | None, Any]:
    """(value head, critic backbone or None: the policy's); (None, None) unless the algorithm is ppo."""
    if cfg.algorithm.name != "ppo":
        return None, None
    critic_model = None
    if cfg.algorithm.critic == "model":
        critic, _ = load_trainable_model(dataclasses.replace(cfg.model, lora_rank=0), str(strategy.device))
        critic_model = strategy.prepare(critic)
    hidden = (critic_model or policy).config.get_text_config().hidden_size
    return ValueHead(hidden).to(strategy.device), critic_model


def critic_modules(value_head: ValueHead | None, critic_model: Any) -> dict[str, nn.Module]:
    """The critic's trained modules by name, for the optimizer."""
    named = (("value_head", value_head), ("critic", critic_model))
    return {name: module for name, module in named if module is not None}


def critic_state(strategy: Strategy, value_head: ValueHead | None, critic_model: Any) -> dict[str, Any]:
    """What a checkpoint keeps of the critic (gathered whole on the main process)."""
    named = (("value_head", value_head), ("critic_model", critic_model))
    return {key: strategy.state_dict(module, all_ranks=False) for key, module in named if module is not None}


def load_critic_state(
    strategy: Strategy, resumed: ckpt.Checkpoint, value_head: ValueHead | None, critic_model: Any
) -> None:
    """The critic as checkpoint ``resumed`` kept it; refused when its weights do not fit."""
    for key, module in (("value_head", value_head), ("critic_model", critic_model)):
        if module is None:
            continue
        missing, unexpected = strategy.load_weights(module, resumed.extra[key])
        if missing or unexpected:
            raise ckpt.CheckpointError(
                f"{resumed.path}: the saved {key} does not fit: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
