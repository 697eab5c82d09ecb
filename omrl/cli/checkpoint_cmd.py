"""``omrl checkpoint trust``: vouch for a checkpoint an older omrl wrote, so a run resumes from it, or accept
a model directory's files as they are now (its chat template edited on purpose). ``omrl checkpoint merge``:
a LoRA run's checkpoint as a whole model that ``--model`` takes."""

from __future__ import annotations

import typer

checkpoint_app = typer.Typer(help="Checkpoints of a run.", no_args_is_help=True)


@checkpoint_app.command("trust")
def trust(
    checkpoints: list[str] = typer.Argument(
        ...,
        help="Checkpoint directories (RUN/checkpoints/step-00000012) or model directories (a run's own folder, "
        "which holds its final model, or RUN/checkpoints/step-N/model).",
    ),
) -> None:
    """Write the sha256 manifest of each checkpoint's or model's files as they are now.

    An older omrl wrote checkpoints without one, and nothing can tell whether their weights
    were damaged since, so a resume refuses them: trust them only if you know where they have
    been. A model directory whose files you changed on purpose (its chat_template.jinja, say) is
    refused as damaged until you accept the change here. From then on any change to the files is found.
    """
    from pathlib import Path

    from omrl.models import MODEL_MANIFEST
    from omrl.training.checkpoint import trust_checkpoint, trust_model

    for path in checkpoints:
        if (Path(path) / MODEL_MANIFEST).is_file():
            changed = trust_model(path, MODEL_MANIFEST)
            said = f"accepted as it is now: {', '.join(changed)}" if changed else "matches its manifest; left as it is"
            typer.echo(f"{path}: {said}")
            continue
        wrote = trust_checkpoint(path)
        typer.echo(f"{path}: {'manifest written' if wrote else 'has a manifest already; left as it is'}")


@checkpoint_app.command("merge")
def merge(
    checkpoint: str = typer.Argument(
        ..., help="A LoRA run's checkpoint (RUN/checkpoints/step-00000012, or its model/ folder)."
    ),
    output_dir: str = typer.Option(
        "",
        "--output-dir",
        "-o",
        help="Where the model is written (an absent or empty folder; '': RUN-step-N beside RUN).",
    ),
) -> None:
    """Merge a LoRA checkpoint's adapter into the base model its run trained, as a whole model.

    A LoRA run's checkpoints hold the adapter alone; only its final model has it merged in. The merged
    folder is written as a final model is (weights, the checkpoint's tokenizer, a sha256 manifest), so
    `omrl eval --model OUT`, `rollout`, the vllm backend and `train --model` take it.
    """
    import shlex
    from pathlib import Path

    from omrl.training.lora_merge import merge_checkpoint, trained_env

    out = merge_checkpoint(checkpoint, output_dir or None)
    step = Path(checkpoint).parent if Path(checkpoint).name == "model" else Path(checkpoint)
    env = trained_env(step)
    typer.echo(
        f"merged into {out}\nevaluate it: omrl eval --model {shlex.quote(str(out))} --env {shlex.quote(env) if env else 'ENV'}"
    )


def add_to(app: typer.Typer) -> None:
    app.add_typer(checkpoint_app, name="checkpoint")
