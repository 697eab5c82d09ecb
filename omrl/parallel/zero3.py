"""DeepSpeed ZeRO-3 for the recipes, asked for with an accelerate config:

    accelerate launch --config_file configs/accelerate/zero3.yaml -m omrl train --algo grpo --env webshop

Like FSDP (:mod:`omrl.parallel.fsdp`), each process keeps 1/world_size of every
weight, gradient and optimizer state, every forward gathers a layer's weights and
every backward reduce-scatters its gradients, so processes run their micro-batches
in lockstep (idle passes pad the shorter lists).

What DeepSpeed owns and what stays the recipes': DeepSpeed's engine partitions,
accumulates and reduces the gradients, clips them (``optim.max_grad_norm``),
skips a step whose gradient norm is not finite and applies the recipe's own
optimizer to the partitions. The recipes keep their losses (weighted by global
token counts), their learning-rate schedule, their NaN accounting and their
checkpoints. Three details make that work:

- every trained module sits in one :class:`~omrl.parallel.base.Trainables` module given to the engine,
  and each micro-batch's forward runs through ``engine(fn, ...)`` so DeepSpeed
  counts it (its gradient accumulation advances on the engine's forward);
- the engine averages gradients over processes; the recipes sum them, so losses are
  scaled by the world size before backward (:func:`backward`);
- accumulation is "unmanaged" (``managed_gradient_accumulation: false``): the
  recipe decides when a step ends, since micro-batch counts vary from step to step.

Checkpoints hold whole weights (Hugging Face safetensors) and the whole optimizer
state keyed by parameter name, the format FSDP checkpoints use, so a ZeRO-3 run
resumes on any number of processes. The accelerate config's DeepSpeed settings are
read from the environment ``accelerate launch`` sets (``ACCELERATE_DEEPSPEED_*``);
omrl builds the DeepSpeed config itself.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import torch
from torch import nn

from omrl.errors import ConfigError
from omrl.parallel.base import Strategy, Trainables, check_optimizer_names
from omrl.parallel.lockstep import lockstep

T = TypeVar("T")


def requested() -> bool:
    """True when ``accelerate launch`` was given a DeepSpeed config."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


# accelerate DeepSpeed settings omrl does not implement -> (what it accepts, what to use instead)
UNSUPPORTED = {
    "ACCELERATE_DEEPSPEED_ZERO_STAGE": (
        {"3"},
        "3 (configs/accelerate/zero3.yaml); for stages 0-2 use configs/accelerate/ddp.yaml",
    ),
    "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": ({"none"}, "none"),
    "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": ({"none"}, "none"),
    "ACCELERATE_DEEPSPEED_ZERO3_INIT": ({"false"}, "false (every process loads the model, then it is partitioned)"),
    "ACCELERATE_MIXED_PRECISION": ({"no"}, "no (the recipes' own bf16 option and model.dtype decide precision)"),
    # DeepSpeed would take these from the accelerate config; omrl's own options decide them
    "ACCELERATE_GRADIENT_CLIPPING": (set(), "leave gradient_clipping out; set optim.max_grad_norm"),
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": (
        {"1"},
        "1, or leave it out; the recipes accumulate micro-batches "
        "themselves (optim.micro_batch_size, "
        "optim.gradient_accumulation_steps)",
    ),
}


def check_options(model_dtype: str = "float32") -> None:
    """Refuse DeepSpeed settings the recipes do not implement, naming the valid ones."""
    try:
        import deepspeed  # noqa: F401
    except ImportError as err:
        raise ConfigError(
            "accelerate is set up for DeepSpeed, but deepspeed is not installed: "
            "pip install deepspeed (or use configs/accelerate/fsdp.yaml)"
        ) from err
    if os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE"):
        raise ConfigError(
            "deepspeed_config_file is not supported: omrl builds the DeepSpeed config from its own "
            "options (optim.*); valid: the deepspeed_config keys of configs/accelerate/zero3.yaml"
        )
    for key, (valid, hint) in UNSUPPORTED.items():
        value = os.environ.get(key)
        if value is not None and value.lower() not in valid:
            raise ConfigError(
                f"{key.removeprefix('ACCELERATE_').lower()}: {value} is not supported under omrl's "
                f"ZeRO-3; valid: {hint}"
            )
    if model_dtype != "float32":
        raise ConfigError(
            f"model.dtype={model_dtype} is not supported under ZeRO-3 (DeepSpeed keeps float32 weights "
            "in its optimizer); valid: model.dtype=float32, with bf16=true for autocast in SFT"
        )


def load_models_whole() -> None:
    """Models load whole, to be partitioned by :func:`initialize` (or kept whole: the rollout copy).
    On GPUs the Accelerator registers its DeepSpeed config with transformers, which would then
    partition every model inside ``from_pretrained`` (``zero.Init``), whatever zero3_init_flag says."""
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()


def _config(model: nn.Module, max_grad_norm: float, optimizer: bool = True) -> dict[str, Any]:
    # bucket sizes scaled to the model as Hugging Face's "auto" values are; DeepSpeed's defaults
    # (5e8 elements) cost a 135M-parameter model about 0.5 GB more peak memory per process
    hidden = model.config.get_text_config().hidden_size
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,  # bookkeeping only: the recipes batch the data themselves
        "gradient_accumulation_steps": 1,
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": hidden * hidden,
            "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
            "stage3_param_persistence_threshold": 10 * hidden,
        },
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if optimizer:
        config.update(
            {
                "managed_gradient_accumulation": False,  # the recipe ends a step by calling step()
                "gradient_clipping": max_grad_norm if 0 < max_grad_norm < float("inf") else 0.0,
                "zero_allow_untested_optimizer": True,
            }
        )
    return config


def initialize(owner: Trainables, optimizer: torch.optim.Optimizer, max_grad_norm: float):
    """The DeepSpeed engine training ``owner`` with ``optimizer`` (partitions them in place)."""
    import deepspeed

    if any(getattr(m, "peft_config", None) for m in owner.values()):
        raise ConfigError(
            "LoRA (model.lora_rank > 0) cannot be combined with ZeRO-3: use lora_rank=0, "
            "or the data-parallel config configs/accelerate/ddp.yaml"
        )
    names = {id(p): name for name, p in owner.named_parameters()}
    group_names = [[names[id(p)] for p in group["params"]] for group in optimizer.param_groups]
    with _quiet():
        engine, *_ = deepspeed.initialize(
            model=owner, optimizer=optimizer, config=_config(owner["policy"], max_grad_norm), dist_init_required=False
        )
    engine.omrl_group_names = group_names  # DeepSpeed empties the groups' params: checkpoints name them
    return engine


def partition_frozen(model: nn.Module) -> nn.Module:
    """Partition a frozen model (the reference) across processes; it is called directly, forward only."""
    import deepspeed

    with _quiet():
        engine, *_ = deepspeed.initialize(
            model=model, config=_config(model, 0.0, optimizer=False), dist_init_required=False
        )
    return engine.module


@contextlib.contextmanager
def _quiet():
    """DeepSpeed logs its whole config at INFO on every process; keep warnings only."""
    from deepspeed.utils import logger

    level = logger.level
    logger.setLevel("WARNING")
    try:
        yield
    finally:
        logger.setLevel(level)


def backward(engine, loss: torch.Tensor) -> None:
    """Backward of ``loss``; gradients come out summed over processes (the engine averages them)."""
    engine.backward(loss * engine.dp_world_size, scale_wrt_gas=False)


def step(engine) -> float:
    """End the step: reduce, clip and apply the gradients; returns the norm before clipping
    (inf when DeepSpeed skipped the step because the norm was not finite)."""
    engine.step()
    return float(engine.get_global_grad_norm()) if engine.was_step_applied() else float("inf")


def zero_grad(engine) -> None:
    """Drop the gradients accumulated since the last step."""
    engine.optimizer.zero_grad()


def full_state_dict(model: nn.Module, all_ranks: bool = True) -> dict[str, torch.Tensor]:
    """The whole weights (every process must call): on every process, or (``all_ranks=False``)
    on the main process alone, in CPU memory. One parameter is gathered at a time."""
    from deepspeed.runtime.zero import GatheredParameters

    keep = all_ranks or torch.distributed.get_rank() == 0
    state: dict[str, torch.Tensor] = {}
    for name, value in model.state_dict(keep_vars=True).items():
        gathered = hasattr(value, "ds_id")
        with GatheredParameters([value], enabled=gathered):
            if keep:
                state[name] = value.detach().clone() if all_ranks else value.detach().to("cpu", copy=True)
    return state


def copy_whole_weights(model: nn.Module, replica: nn.Module) -> None:
    """Copy the partitioned ``model``'s weights into the unpartitioned ``replica`` in place, one tensor
    at a time (every process must call)."""
    from deepspeed.runtime.zero import GatheredParameters

    targets = replica.state_dict()
    with torch.no_grad():
        for name, value in model.state_dict(keep_vars=True).items():
            with GatheredParameters([value], enabled=hasattr(value, "ds_id")):
                targets[name].copy_(value.detach())


def load_full_state_dict(
    model: nn.Module, weights: dict[str, torch.Tensor], engine=None, ignore: set[str] = frozenset()
) -> tuple[list[str], list[str]]:
    """Load whole ``weights`` (read by every process) into the partitions; returns the (missing,
    unexpected) names, leaving out ``ignore`` (e.g. tied weights). ``engine``: the engine training
    ``model``, whose float32 master weights are then refreshed from the loaded ones."""
    from deepspeed.runtime.zero import GatheredParameters

    own = model.state_dict(keep_vars=True)
    missing = sorted(set(own) - set(weights) - set(ignore))
    unexpected = sorted(set(weights) - set(own))
    with torch.no_grad():
        for name, value in own.items():
            if name not in weights:
                continue
            with GatheredParameters([value], modifier_rank=0, enabled=hasattr(value, "ds_id")):
                value.data.copy_(weights[name].to(value.device, value.dtype))
    if engine is not None:
        engine.optimizer.refresh_fp32_params()
    return missing, unexpected


def full_optimizer_state(owner: nn.Module, engine) -> dict[str, Any]:
    """The whole optimizer state keyed by parameter name in ``owner`` (FSDP's layout), on the main
    process (every process must call)."""
    from deepspeed.utils import safe_get_full_optimizer_state

    inner = engine.optimizer.optimizer  # the recipe's optimizer, now over the flat partitions
    main = torch.distributed.get_rank() == 0
    state: dict[str, Any] = {}
    if inner.state:  # empty before the first update
        flat_state = next(iter(inner.state.values()))
        keys = sorted(k for k, v in flat_state.items() if torch.is_tensor(v) and v.dim() > 0)
        for name, param in owner.named_parameters():
            per_param = {k: safe_get_full_optimizer_state(param, k).reshape(param.ds_shape).cpu() for k in keys}
            if main:
                scalars = {k: v.clone() if torch.is_tensor(v) else v for k, v in flat_state.items() if k not in keys}
                state[name] = {**scalars, **per_param}
    groups = [
        {**{k: v for k, v in group.items() if k != "params"}, "params": names}
        for group, names in zip(inner.param_groups, engine.omrl_group_names)
    ]
    return {"state": state, "param_groups": groups} if main else {}


def load_full_optimizer_state(owner: nn.Module, engine, state: dict[str, Any]) -> None:
    """Load a :func:`full_optimizer_state` (read by every process) into the partitions."""
    zero = engine.optimizer
    inner = zero.optimizer
    for group, saved in zip(inner.param_groups, state["param_groups"]):
        group.update({k: v for k, v in saved.items() if k != "params"})
    if not state["state"]:
        inner.state.clear()
        return
    example = next(iter(state["state"].values()))
    keys = [k for k, v in example.items() if torch.is_tensor(v) and v.dim() > 0]
    for flat in zero.fp32_partitioned_groups_flat:  # the optimizer creates its state lazily: make room
        inner.state[flat] = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in example.items() if k not in keys}
        inner.state[flat].update({k: torch.zeros_like(flat) for k in keys})
    for name, param in owner.named_parameters():
        for key in keys:
            _set_own_partition(zero, param, state["state"][name][key], key)


def _set_own_partition(zero, param: nn.Parameter, value: torch.Tensor, key: str) -> None:
    """Copy this process's slice of the whole ``value`` into ``param``'s optimizer state ``key``.
    DeepSpeed's own setter (safe_set_full_optimizer_state, 0.19) reads past the end of a tensor
    whose partitions are padded, e.g. a 1-element bias on 2 processes; the padding stays 0 here."""
    part, _ = zero._get_fp32_opt_state_partition(param, release_swap_buffers=False, optim_state_key=key)
    flat = value.reshape(-1)
    start = part.numel() * zero._get_param_partition_rank(param)
    mine = flat[start : start + part.numel()]
    part.data.zero_()
    part.data[: mine.numel()].copy_(mine)


class ZeRO3(Strategy):
    """Every trained and frozen model partitioned by DeepSpeed; its engine owns the optimizer step."""

    name = "zero3"
    sharded = True
    fused_optimizer = False

    def __init__(self, model_dtype: str = "float32") -> None:
        self.engine = None
        super().__init__(model_dtype)
        load_models_whole()

    @classmethod
    def requested(cls) -> bool:
        return requested()

    def check_options(self) -> None:
        check_options(self.model_dtype)

    def prepare(self, model: nn.Module, frozen: bool = False) -> nn.Module:
        """A frozen model (the reference) is partitioned now, trained ones with the optimizer."""
        return partition_frozen(model) if frozen else model

    def prepare_optimizer(
        self, modules: dict[str, nn.Module], optimizer: torch.optim.Optimizer, max_grad_norm: float
    ) -> Trainables:
        owner = super().prepare_optimizer(modules, optimizer, max_grad_norm)
        self.engine = initialize(owner, optimizer, max_grad_norm)
        return owner

    def micro_batches(
        self, items: Iterable[T], idle: Callable[[dict[str, torch.Tensor]], Any] | None = None, backward: bool = True
    ) -> Iterator[T]:
        return lockstep(items, idle, backward, self.device, self.backward)

    def forward(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self.engine(fn, *args, **kwargs)  # the engine counts micro-batches on its forward

    def backward(self, loss: torch.Tensor) -> None:
        backward(self.engine, loss)

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        zero_grad(self.engine)

    def optimizer_step(
        self, params: Sequence[nn.Parameter], optimizer: torch.optim.Optimizer, max_norm: float
    ) -> float:
        """The engine reduces, clips (``max_norm`` was given to :meth:`prepare_optimizer`) and steps."""
        return step(self.engine)

    def state_dict(self, model: nn.Module, all_ranks: bool = True) -> dict[str, torch.Tensor]:
        return full_state_dict(model, all_ranks=all_ranks)

    def load_weights(
        self, model: nn.Module, weights: dict[str, torch.Tensor], ignore: Iterable[str] = ()
    ) -> tuple[list[str], list[str]]:
        return load_full_state_dict(model, weights, engine=self.engine, ignore=set(ignore))

    def copy_whole_weights(self, model: nn.Module, replica: nn.Module) -> None:
        copy_whole_weights(model, replica)

    def gather_for_checkpoint(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
        gathered: dict[str, Any] = {"model_state": full_state_dict(model, all_ranks=False)}
        if optimizer is not None:
            gathered["optimizer_state"] = full_optimizer_state(self.owner, self.engine)
        return gathered

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        # DeepSpeed emptied the groups: their names were kept at initialize
        check_optimizer_names(self.owner, [set(names) for names in self.engine.omrl_group_names], state)
        load_full_optimizer_state(self.owner, self.engine, state)
