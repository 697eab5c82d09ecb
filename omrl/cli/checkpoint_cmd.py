"""``omrl checkpoint trust``: vouch for a checkpoint an older omrl wrote, so a run resumes from it, or accept
a model directory's files as they are now (its chat template edited on purpose)."""

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


def add_to(app: typer.Typer) -> None:
    app.add_typer(checkpoint_app, name="checkpoint")
