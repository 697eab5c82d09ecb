"""Loading a model for training and saving the final one: shared by every recipe."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omrl.atomic import readable_as_umask_allows
from omrl.config.options import ModelConfig
from omrl.errors import ConfigError, WriteFailed, short_repr, write_failure
from omrl.models import MODEL_MANIFEST, load_model
from omrl.models.manifest import manifest
from omrl.training.checkpoint_marker import MODEL_STEP
from omrl.training.config_checks import check_model_config

if TYPE_CHECKING:
    from omrl.training.recipe import Recipe


def load_trainable_model(cfg: ModelConfig, device: str, chat: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) with gradient checkpointing and LoRA applied as configured. With ``chat`` (the run's
    ChatConfig), a chat template the run would lay out wrongly is refused first, before the model loads."""
    if chat is not None:
        from omrl.chat import check_history
        from omrl.chat.conformance import check_run_template
        from omrl.chat.template_check import check_template_options
        from omrl.models import load_tokenizer

        tokenizer = load_tokenizer(cfg.name, cfg.trust_remote_code)
        check_template_options(tokenizer, chat.template_kwargs)
        check_run_template(tokenizer, check_history(chat.history), chat.template_kwargs)
    model, tokenizer = load_model(cfg.name, dtype=cfg.dtype, device=device, trust_remote_code=cfg.trust_remote_code)
    return made_trainable(model, cfg), tokenizer


def check_lora_targets(model: Any, cfg: ModelConfig) -> None:
    """Refuse a name in ``model.lora_target_modules`` that matches none of ``model``'s modules LoRA can adapt,
    matched as peft matches a list (the whole name, or its last dotted parts), listing the valid names."""
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    kinds = (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention, Conv1D)
    names = [name for name, module in model.named_modules() if isinstance(module, kinds)]
    missing = [t for t in cfg.lora_target_modules if not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        raise ConfigError(
            f"model.lora_target_modules: no linear or embedding module of model {cfg.name!r} is named "
            f"{', '.join(map(repr, missing))}; valid: {', '.join(sorted({n.rsplit('.', 1)[-1] for n in names}))}"
        )


def made_trainable(model: Any, cfg: ModelConfig, task_type: str = "CAUSAL_LM", new_heads: tuple[str, ...] = ()) -> Any:
    """``model`` with gradient checkpointing and a LoRA adapter as ``cfg`` asks (``new_heads``: modules
    trained whole beside the adapter, as a reward model's score head)."""
    check_model_config(cfg)
    if cfg.gradient_checkpointing:
        enable = (
            getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        )  # the older name (transformers < 5)
        enable({"use_reentrant": False})
    if cfg.lora_rank == 0:
        return model
    from peft import LoraConfig, get_peft_model

    check_lora_targets(model, cfg)
    lora = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.lora_target_modules),
        task_type=task_type,
        modules_to_save=list(new_heads) or None,
    )
    with warnings.catch_warnings():  # tied embeddings adapted: save_final_model unties them before merging
        warnings.filterwarnings("ignore", message="Model has `tie_word_embeddings=True` and a tied layer")
        # peft asks transformers' deprecated name: nothing a user can change
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        return get_peft_model(model, lora)


def untie_adapted_embeddings(model: Any) -> None:
    """Before LoRA is merged into peft model ``model``: where its output head shares its weight with the
    input embedding and the adapter changes either (``lm_head`` or ``embed_tokens`` targeted), give the
    head a copy of its own and mark the model untied. Merged into the one shared weight, the head's delta
    would change the embedding as well (and the embedding's the head): the saved model would not be the
    trained one."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from torch import nn

    base = model.get_base_model()
    embedding, head = base.get_input_embeddings(), base.get_output_embeddings()
    if embedding is None or head is None:
        return
    if not (isinstance(embedding, BaseTunerLayer) or isinstance(head, BaseTunerLayer)):
        return
    embedding, head = (m.get_base_layer() if isinstance(m, BaseTunerLayer) else m for m in (embedding, head))
    if head.weight.data_ptr() != embedding.weight.data_ptr():
        return
    head.weight = nn.Parameter(head.weight.detach().clone(), requires_grad=False)
    for config in (base.config, base.config.get_text_config()):
        config.tie_word_embeddings = False


def load_frozen_copy(cfg: ModelConfig, device: str) -> Any:
    """The starting weights again, frozen, in eval mode (the reference model for KL and DPO)."""
    model, _ = load_model(cfg.name, dtype=cfg.dtype, device=device, trust_remote_code=cfg.trust_remote_code)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def save_final_model(
    model: Any,
    tokenizer: Any,
    output_dir: str | os.PathLike,
    merge_lora: bool,
    state_dict: dict[str, Any] | None = None,
    step: int | None = None,
) -> None:
    """The model (LoRA merged) and tokenizer into ``output_dir``, so ``--model <output_dir>`` loads it.
    ``state_dict``: the weights to write instead of the model's own (FSDP: the gathered ones). ``step``:
    the run's step, written beside them (:data:`~omrl.training.checkpoint_marker.MODEL_STEP`), so a model
    its run trained past is told apart (:func:`~omrl.training.checkpoint_marker.final_model_behind`).

    Files are written to a temporary directory and moved in with config.json last:
    a directory with a config.json always holds a complete model. Their sha256 digests go
    into :data:`~omrl.models.MODEL_MANIFEST` beside them, which every load checks.
    A full disk is a :class:`~omrl.errors.WriteFailed`, and nothing of the new model is moved in.
    """
    output_dir = Path(output_dir)
    if merge_lora:
        untie_adapted_embeddings(model)
        model = model.merge_and_unload()
    for stale in output_dir.glob(".final-model-tmp-*"):  # left by a run killed while it saved
        shutil.rmtree(stale, ignore_errors=True)
    tmp = output_dir / f".final-model-tmp-{os.getpid()}"
    try:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        if step is not None:
            (tmp / MODEL_STEP).write_text(f"{step}\n", encoding="utf-8")
        names = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        (tmp / MODEL_MANIFEST).write_text(manifest(tmp, names))
        readable_as_umask_allows(tmp)
        for name in sorted((p.name for p in tmp.iterdir()), key=lambda n: (n == "config.json", n == MODEL_MANIFEST)):
            os.replace(tmp / name, output_dir / name)
    except Exception as exc:
        reason = write_failure(exc)
        if reason is None:
            raise
        raise WriteFailed(
            f"cannot write the final model into {output_dir}: {reason} ({short_repr(str(exc))}); "
            "the newest checkpoint is kept: free some space, then continue with --resume"
        ) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def save_final_from_every_process(recipe: "Recipe") -> None:
    """:func:`save_final_model` of ``recipe``'s model at its step (LoRA merged): every process calls; a
    sharded strategy gathers the whole weights and the main process writes them."""
    weights = recipe.strategy.gather_for_checkpoint(recipe.model).get("model_state")
    recipe.strategy.on_main(
        save_final_model,
        recipe.model,
        recipe.tokenizer,
        recipe.output_dir,
        merge_lora=recipe.cfg.model.lora_rank > 0,
        state_dict=weights,
        step=recipe.step,
    )
