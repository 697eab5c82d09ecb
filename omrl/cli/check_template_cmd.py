"""``omrl check-template``: what a model's chat template does to a multi-turn chat, and which history
mode (``chat.history``) trains it token-exactly, before a run finds out halfway."""

from __future__ import annotations

import json
from typing import Any

import typer

KWARGS_HELP = "Chat template kwargs as a JSON object, e.g. '{\"enable_thinking\": false}'."


def parse_kwargs(text: str | None) -> dict[str, Any]:
    """``--kwargs``' JSON object as a dict (empty when not given)."""
    from omrl.errors import OmrlError

    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OmrlError(
            f"--kwargs is not valid JSON ({exc}); expected an object such as '{{\"enable_thinking\": false}}'"
        ) from exc
    if not isinstance(value, dict):
        raise OmrlError(
            f"--kwargs must be a JSON object, not {type(value).__name__}; e.g. '{{\"enable_thinking\": false}}'"
        )
    return value


def check_template_command(
    model: str = typer.Argument(..., help="Model: built-in name, directory or hub id (its tokenizer is loaded)."),
    kwargs: str = typer.Option(None, "--kwargs", help=KWARGS_HELP, show_default=False),
) -> None:
    """Render probe chats through MODEL's chat template: is it append-only, where it rewrites, and what each
    history mode does on a sample episode. Exits non-zero when omrl cannot train it token-exactly.

    The model's chat template, not an action template (env.template): a rollout checks what an action
    template's plugin answers (`omrl rollout --template NAME --expert` writes each action through it)."""
    from rich.console import Console

    from omrl.chat.conformance import conformance, first_broken
    from omrl.chat.probe import TOOL_CALLS, TURNS, check_template
    from omrl.chat.template_check import check_render_bounds, check_template_options
    from omrl.errors import OmrlError
    from omrl.models import load_tokenizer

    chat_kwargs = parse_kwargs(kwargs)
    tokenizer = load_tokenizer(model)
    check_render_bounds(tokenizer, chat_kwargs)  # a template that loops or builds huge text is refused, not run
    check_template_options(tokenizer, chat_kwargs)  # a misspelt option would check the default, silently
    report = check_template(tokenizer, chat_kwargs)
    cases = conformance(tokenizer, chat_kwargs)
    console = Console(highlight=False)
    say = lambda line: console.print(line, markup=False, soft_wrap=True)  # noqa: E731 - paths must not wrap
    say(f"chat template of {model}" + (f" with {json.dumps(chat_kwargs)}" if chat_kwargs else ""))
    if report.append_only:
        say("append-only: yes (every longer chat renders as the shorter one plus new text)")
    else:
        say("append-only: no; what the template does to a longer chat:")
        for finding in report.findings:
            say(f"  - {finding}")
    calls = "written" + (", re-rendered" if TOOL_CALLS in report.findings else "")
    say(
        f"tool role: {'yes' if report.tool_role else 'no'}; "
        f"structured tool calls: {calls if report.tool_calls else 'not written'}"
    )
    say(f"history modes on a sample episode ({TURNS} replies with reasoning):")
    console.print(_modes_table(report, cases))
    say("tokens: all in the rows; trained: those with loss; prefill: prompt tokens computed with no KV reuse")
    broken = {case.mode for case in cases if case.status == "broken"}  # the cases below say why
    for cost in report.modes.values():
        if not cost.works:
            say(f"{cost.mode} does not work: {cost.problem}")
        elif cost.tool_problem and cost.mode not in broken:
            say(f"{cost.mode} works for user turns, not tool results: {cost.tool_problem}")
    say("episodes played the rollout's way, each row checked against the template (docs/templates.md):")
    console.print(_cases_table(cases))
    for case in cases:
        if case.status in ("broken", "refused"):
            say(f"{case.mode} {case.case}: {case.status}: {case.problem}")
    if not report.trainable:
        raise OmrlError(f"omrl cannot train the chat template of {model} token-exactly: {report.why_not()}")
    broken = first_broken(cases)
    if broken is not None:
        raise OmrlError(
            f"omrl would lay out {model}'s {broken.case} episodes wrongly under chat.history={broken.mode}: "
            f"{broken.problem}"
        )
    say(f"use: {_advice(report)}")


def _modes_table(report, cases):
    """One row per history mode: whether it works (on the sample episode, and in every case played the
    rollout's way: a broken case below is a mode that does not) and its rows' size on the sample episode."""
    from rich.table import Table

    table = Table()
    for column in ("mode", "works", "rows", "tokens", "trained", "prefill"):
        table.add_column(column, justify="left" if column in ("mode", "works") else "right", no_wrap=True)
    for cost in report.modes.values():
        numbers = [str(n) for n in (cost.rows, cost.tokens, cost.trained, cost.prefill)] if cost.works else ["-"] * 4
        works = ("not for tools" if cost.tool_problem else "yes") if cost.works else "no"
        if cost.works and any(case.mode == cost.mode and case.status == "broken" for case in cases):
            works = "no: see the cases below"
        table.add_row(cost.mode, works, *numbers)
    return table


def _cases_table(cases):
    """One row per history mode, one column per case: ok, broken, refused or n/a."""
    from rich.table import Table

    names = list(dict.fromkeys(c.case for c in cases))
    table = Table()
    for column in ("mode", *names):
        table.add_column(column, no_wrap=True)
    for mode in dict.fromkeys(c.mode for c in cases):
        table.add_row(mode, *(c.status for name in names for c in cases if c.mode == mode and c.case == name))
    return table


def _advice(report) -> str:
    """Which ``chat.history`` to set, and what the other mode would change."""
    keep, as_template = report.modes["keep"], report.modes["as_template"]
    if not keep.works:
        return "chat.history=as_template (keep cannot work with this template)"
    if not as_template.works:
        return "chat.history=keep (omrl's default; as_template cannot work with this template)"
    tools = "; with an env that sends tool results, chat.history=as_template" if keep.tool_problem else ""
    if report.append_only and as_template.rows == keep.rows:
        return f"chat.history=keep (omrl's default){tools}; the template only appends, so both modes give the same rows"
    return (
        f"chat.history=keep (omrl's default): one row per episode with the sampled ids as they are, so the model "
        f"sees its history as it sampled it, not as the template rewrites it{tools}; chat.history=as_template "
        f"shows the model exactly what deployment shows, at {as_template.rows} rows, "
        f"{as_template.tokens / max(keep.tokens, 1):.1f}x the tokens and "
        f"{as_template.prefill / max(keep.prefill, 1):.1f}x the prefill"
    )


def add_to(app: typer.Typer) -> None:
    app.command("check-template")(check_template_command)
