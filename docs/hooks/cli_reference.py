"""MkDocs hook: fill docs/cli.md from the real command line and config schema.

``<!-- cli-commands -->`` becomes one section per ``omrl`` command, read from the typer app
(``typer.main.get_command(build_app())``: each command's help, usage and parameters).
``<!-- config-keys -->`` becomes one table per run config class (``omrl.config.describe``),
with each key's default as that command's config really has it.
"""

from __future__ import annotations

import html
import os
import re

COMMANDS_MARKER = "<!-- cli-commands -->"
KEYS_MARKER = "<!-- config-keys -->"


def cell(text: object) -> str:
    """Text fit for one markdown table cell."""
    return " ".join(prose(text).split()).replace("|", "\\|")


def prose(text: object) -> str:
    """Help text as markdown: typer's rich-markup escape undone, and a ``<placeholder>`` outside code
    spans escaped, which a browser would otherwise take for an HTML tag and hide."""
    text = re.sub(r"\\\[", "[", str(text))
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(part if part.startswith("`") else html.escape(part, quote=False) for part in parts)


def walk(command, path):
    """(path, command) for ``command`` and every subcommand below it, in order."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from walk(sub, [*path, name])


def param_row(param) -> str:
    if param.param_type_name == "argument":
        name = f"`{param.name}`" + (" ..." if param.nargs == -1 else "")
    else:
        name = ", ".join(f"`{opt}`" for opt in [*param.opts, *param.secondary_opts])
    default = param.default if param.param_type_name == "option" and not param.is_flag else None
    shown = "" if default in (None, "", ()) else f"`{default}`"
    required = "yes" if param.required else ""
    return f"| {name} | {cell(param.bare_type())} | {shown} | {required} | {cell(getattr(param, 'help', '') or '')} |"


def commands_markdown() -> str:
    import typer

    from omrl.cli import build_app

    root = typer.main.get_command(build_app())
    out = []
    for path, command in walk(root, ["omrl"]):
        name = " ".join(path)
        out += [f"## {name}", ""]
        if command.help:
            out += [prose(command.help.strip()), ""]
        ctx = command.context_class(command, info_name=name)
        out += ["```text", command.get_usage(ctx).replace("Usage: ", "").strip(), "```", ""]
        params = [p for p in command.params if not getattr(p, "hidden", False)]
        if params:
            out += ["| parameter | type | default | required | help |", "|---|---|---|---|---|"]
            out += [param_row(p) for p in params] + [""]
        if hasattr(command, "commands"):
            out += ["Subcommands: " + ", ".join(f"`{name} {sub}`" for sub in command.commands), ""]
    return "\n".join(out)


def default_of(config, key: str) -> str:
    value = config
    for part in key.split("."):
        value = getattr(value, part)
    return repr(value)


def keys_markdown() -> str:
    from omrl.config import describe
    from omrl.config.options import CONFIG_CLASSES

    out = []
    for command, cls in CONFIG_CLASSES.items():
        config = cls()  # its own defaults: a nested section's may differ from the section class's
        out += [
            f"### {command}",
            "",
            f"`{cls.__name__}`: {len(describe(cls))} keys.",
            "",
            "| key | type | default | help |",
            "|---|---|---|---|",
        ]
        for key, type_name, _, help_text in describe(cls):
            out.append(f"| `{key}` | {cell(type_name)} | `{cell(default_of(config, key))}` | {cell(help_text)} |")
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != "cli.md":
        return markdown
    os.environ.setdefault("OMRL_PLUGINS", "omrl")  # the built-in commands only, not whatever is installed
    return markdown.replace(COMMANDS_MARKER, commands_markdown()).replace(KEYS_MARKER, keys_markdown())
