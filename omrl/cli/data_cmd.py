"""``omrl data``: convert conversation datasets between formats and peek into them."""

from __future__ import annotations

import json

import typer

data_app = typer.Typer(help="Convert and inspect SFT conversation datasets.", no_args_is_help=True)


@data_app.command("convert")
def convert(
    source: str = typer.Argument(..., help="JSONL/JSON/parquet file, HF dataset directory, or `omrl rollout` output."),
    target: str = typer.Argument(..., help="Output file: .jsonl or .parquet."),
    style: str = typer.Option(
        "openmanus", "--style", help="Message form: openmanus (role/content) or sharegpt (from/value)."
    ),
    min_reward: float = typer.Option(float("-inf"), "--min-reward", help="Keep only records with reward >= this."),
) -> None:
    """Convert conversations (or rollout episodes) into OpenManus-RL or ShareGPT records."""
    from pathlib import Path

    from omrl.data.conversations import load_conversations, reward_summary, write_conversations
    from omrl.outputs import check_outputs
    from omrl.rollout.convert import jsonl_path_for

    refuse_target_in_folder(source, target)
    # a rollout's readable JSONL is read in place of its parquet's token ids: neither may be replaced
    check_outputs(
        {"the target": target},
        {
            "the source": source,
            "the source's readable JSONL": jsonl_path_for(source) if Path(source).suffix == ".parquet" else None,
            **{f"the source's file {file}": file for file in files_read(source)},
        },
    )
    conversations = load_conversations(source, min_reward)
    if not conversations:  # an empty file written and exit 0 would pass for a conversion
        from omrl.errors import OmrlError

        kept = f" with reward >= {min_reward:g}" if min_reward > float("-inf") else ""
        raise OmrlError(f"{source} holds no conversation{kept}; nothing written to {target}")
    write_conversations(conversations, target, style)
    typer.echo(f"wrote {reward_summary(conversations)} to {target}")


@data_app.command("show")
def show(
    source: str = typer.Argument(..., help="A dataset file or directory."),
    rows: int = typer.Option(3, "--rows", "-n", min=0, help="How many conversations to print."),
    min_reward: float = typer.Option(float("-inf"), "--min-reward", help="Keep only records with reward >= this."),
) -> None:
    """Print the first few conversations of a dataset and how many there are."""
    from rich.console import Console
    from rich.markup import escape

    from omrl.data.conversations import load_conversations, reward_summary

    conversations = load_conversations(source, min_reward)
    console = Console()
    for conv in conversations[:rows]:
        meta = f" {json.dumps(conv.meta, default=str)}" if conv.meta else ""
        console.rule(escape(f"{conv.id or conv.source}{meta}"), style="dim")
        for message in conv.messages:
            console.print(f"[bold]{message['role']}:[/] {escape(shown(message))}", highlight=False)
    typer.echo(reward_summary(conversations))
    for line in tokenizer_lines(source):
        typer.echo(line)


def shown(message: dict) -> str:
    """A message as ``data show`` prints it: its reasoning, its text, each tool call, and which call a tool
    result answers, so that what SFT would learn from is what one reads."""
    from omrl.chat.replies import REASONING_FIELDS

    parts = [f"(reasoning) {message[key]}" for key in REASONING_FIELDS if message.get(key)]
    parts += [message["content"]] if message["content"] else []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        arguments = function.get("arguments")
        parts.append(
            f"(tool call) {function['name']}({arguments if isinstance(arguments, str) else json.dumps(arguments)})"
        )
    answered = [f"{key}={message[key]}" for key in ("name", "tool_call_id") if message.get(key)]
    return (f"({', '.join(answered)}) " if answered else "") + "\n".join(parts)


def refuse_target_in_folder(source: str, target: str) -> None:
    """A target inside a source folder would be read as data by the next conversion (or, at the name of
    a file there, replace what this one reads)."""
    from pathlib import Path

    from omrl.outputs import OutputError

    folder = Path(source).expanduser()
    if folder.is_dir() and Path(target).expanduser().resolve().is_relative_to(folder.resolve()):
        raise OutputError(
            f"the target {target} is inside the source {source}: the folder's files are what is read; "
            "write it outside the folder"
        )


def files_read(source: str) -> list:
    """The files a source folder stands for (a symbolic link in it may lead to a file elsewhere)."""
    from pathlib import Path

    from omrl.data.record_files import data_files

    folder = Path(source).expanduser()
    return data_files(folder) if folder.is_dir() else []


def tokenizer_lines(source: str) -> list[str]:
    """For each trajectory file at ``source``, the tokenizer its token ids came from, as recorded."""
    from pathlib import Path

    from omrl.data.record_files import is_trajectory_file
    from omrl.data.trajectory import recorded_tokenizer

    path = Path(source)
    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path] if path.suffix == ".parquet" else []
    lines = []
    for file in files:
        if not is_trajectory_file(file):
            continue
        found = recorded_tokenizer(file)
        said = f"{found['name']!r} ({found['size']} tokens)" if found else "not recorded (an older omrl)"
        lines.append(f"{file.name}: token ids of the tokenizer {said}")
    return lines


def add_to(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
