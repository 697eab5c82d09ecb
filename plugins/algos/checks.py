"""Input checks shared by the algorithm functions: shapes and hyper-parameter ranges.

A wrong shape would otherwise broadcast silently into a wrong loss, so every
function checks its tensors before any arithmetic.
"""

from __future__ import annotations

import math

import torch

from omrl.algos import LOSS_AGG_MODES, AlgoConfig
from omrl.errors import ConfigError, OmrlError


def require_same_shape(fn_name: str, ndim: int, **tensors: torch.Tensor) -> None:
    """Every tensor has ``ndim`` dimensions and the shape of the first one."""
    names = list(tensors)
    first = tensors[names[0]]
    for name, tensor in tensors.items():
        if tensor.dim() != ndim or tensor.shape != first.shape:
            raise OmrlError(
                f"{fn_name}: {name} has shape {tuple(tensor.shape)}, but {', '.join(names)} "
                f"must all have one {ndim}-d shape (the shape of {names[0]}: {tuple(first.shape)})"
            )


def require_present(fn_name: str, **tensors: torch.Tensor | None) -> None:
    """Optional inputs that this function needs are set."""
    missing = [name for name, tensor in tensors.items() if tensor is None]
    if missing:
        raise OmrlError(f"{fn_name} needs AdvantageInput.{', '.join(missing)}; it was None")


def require_range(cfg: AlgoConfig, name: str, low: float, high: float = math.inf,
                  low_inclusive: bool = True) -> float:
    """``cfg.<name>`` lies in [low, high] (or (low, high] when not ``low_inclusive``)."""
    value = getattr(cfg, name)
    above_low = value >= low if low_inclusive else value > low
    if not (above_low and value <= high):
        if math.isinf(high):
            valid = f"{'>=' if low_inclusive else '>'} {low}"
        else:
            valid = f"in {'[' if low_inclusive else '('}{low}, {high}]"
        raise ConfigError(f"algorithm.{name} must be {valid}, got {value}")
    return value


def require_agg_mode(mode: str) -> str:
    """A loss aggregation mode that :func:`omrl.algos.aggregate_loss` knows."""
    if mode not in LOSS_AGG_MODES:
        raise ConfigError(f"algorithm.loss_agg_mode {mode!r} is unknown; valid: {', '.join(LOSS_AGG_MODES)}")
    return mode
