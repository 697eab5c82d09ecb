"""How a recipe spreads over processes: one strategy object, one interface (:class:`Strategy`).

    accelerate launch --config_file configs/accelerate/fsdp.yaml -m omrl train --algo grpo --env webshop

- :class:`~omrl.parallel.base.Strategy`: one process (``python -m omrl ...``);
- :class:`~omrl.parallel.data_parallel.DataParallel`: whole models, gradients summed (ddp.yaml);
- :class:`~omrl.parallel.fsdp.FSDP`: torch FSDP2, sharded per decoder layer (fsdp.yaml);
- :class:`~omrl.parallel.zero3.ZeRO3`: DeepSpeed ZeRO-3 (zero3.yaml);
- :mod:`omrl.parallel.lockstep`: the sharded ones' micro-batches in lockstep (every process as many).

:func:`make_strategy` picks the first of :data:`STRATEGIES` whose ``requested()`` reads
its settings in the environment ``accelerate launch`` set. A new strategy is one module
with a :class:`Strategy` subclass, named in :data:`STRATEGIES`.

Every process weights its losses by global token counts and gradients are *summed* across
processes, so a run's result does not depend on how many processes computed it. The main
process alone writes logs, checkpoints and the final model; the others wait at a barrier.
"""

from __future__ import annotations

from omrl.parallel.base import Strategy, Trainables
from omrl.parallel.data_parallel import DataParallel
from omrl.parallel.fsdp import FSDP
from omrl.parallel.zero3 import ZeRO3
from omrl.processes import is_main_process

# checked in order: the sharded ones first (they run under WORLD_SIZE > 1 as data parallel does)
STRATEGIES: tuple[type[Strategy], ...] = (FSDP, ZeRO3, DataParallel, Strategy)

__all__ = ["STRATEGIES", "DataParallel", "FSDP", "Strategy", "Trainables", "ZeRO3", "is_main_process", "make_strategy"]


def make_strategy(model_dtype: str = "float32") -> Strategy:
    """The strategy this process runs under (one process unless launched by accelerate)."""
    chosen = next(cls for cls in STRATEGIES if cls.requested())
    return chosen(model_dtype)
