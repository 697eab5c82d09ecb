"""What a fine-tuned model implies for a command's config: the prompts it was trained on, and
which model a preset starts from in an env other than the one its model was tuned for."""

from __future__ import annotations

from typing import Any


def prompts_as_trained(cfg: Any, args: list[str] | None, console: Any) -> None:
    """Play a model on the prompts it was trained on. A fine-tuned model knows its env's task from
    training, and the worked example it never saw there only costs it (measured: the WebShop model
    is trained without one). When the user did not set ``env.demonstration`` and the model's
    training prompts on this env are known (see :func:`omrl.models.trained_demonstration`), the
    config follows them, and the console says so."""
    from omrl.config import user_sets
    from omrl.models import trained_demonstration

    # env.mix's entries may each set their own, which the run's one setting does not tell; a mixture
    # named in env.name is known as a run's env only by that same name
    if user_sets(args, "env.demonstration") or cfg.env.mix:
        return
    trained = trained_demonstration(cfg.model.name, cfg.env.name)
    if trained is None or trained == cfg.env.demonstration:
        return
    from omrl.cli.settings import env_label
    from omrl.mixture import is_mixture

    cfg.env.demonstration = trained
    examples = "their worked examples" if is_mixture(cfg.env) else "its worked example"
    console.print(
        f"env.demonstration={str(trained).lower()}: {cfg.model.name} was trained on {env_label(cfg)} "
        f"{'with' if trained else 'without'} {examples} (env.demonstration= chooses)",
        highlight=False,
        soft_wrap=True,
    )


def start_from_base_outside_its_env(cfg: Any, args: list[str] | None, model_flag: str | None, console: Any) -> None:
    """The shipped presets start WebShop from the WebShop-tuned built-in model, on the prompts it was
    tuned on (no worked example). When ``--env`` or an override names another env, and the model is
    the shipped preset's own (no ``--model``, no ``model.name=``, no YAML of the user's that sets it),
    the run starts from that model's base instead, with the env's worked example back unless set,
    and says so."""
    from omrl.cli.settings import env_label
    from omrl.config import user_sets
    from omrl.models.builtin import tuned_for

    tuned = tuned_for(cfg.model.name)
    # a mixture (env.mix, whatever env.name says) is never the one env the model was tuned for, even
    # when it is one of the mixture's envs
    if model_flag is not None or user_sets(args, "model.name") or tuned is None:
        return
    if tuned[0] == cfg.env.name and not cfg.env.mix:
        return
    console.print(
        f"model: {tuned[1]} ({cfg.model.name}, the preset's model, is fine-tuned for {tuned[0]}, "
        f"not {env_label(cfg)}; --model chooses)",
        highlight=False,
    )
    cfg.model.name = tuned[1]
    if not user_sets(args, "env.demonstration"):
        cfg.env.demonstration = True
