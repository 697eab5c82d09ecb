"""``omrl checkpoint trust``: vouch for a checkpoint an older omrl wrote, so a run resumes from it."""

from __future__ import annotations

import typer

checkpoint_app = typer.Typer(help="Checkpoints of a run.", no_args_is_help=True)


@checkpoint_app.command("trust")
def trust(
    checkpoints: list[str] = typer.Argument(..., help="Checkpoint directories, e.g. RUN/checkpoints/step-00000012."),
) -> None:
    """Write the sha256 manifest of each checkpoint's files as they are now.

    An older omrl wrote checkpoints without one, and nothing can tell whether their weights
    were damaged since, so a resume refuses them: trust them only if you know where they have
    been. From then on any change to their files is found.
    """
    from omrl.training.checkpoint import trust_checkpoint

    for path in checkpoints:
        wrote = trust_checkpoint(path)
        typer.echo(f"{path}: {'manifest written' if wrote else 'has a manifest already; left as it is'}")


def add_to(app: typer.Typer) -> None:
    app.add_typer(checkpoint_app, name="checkpoint")
