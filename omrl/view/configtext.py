"""A run's config.yaml as the page shows it: never with a secret in it, whatever the file holds.

A file that parses as a mapping is shown as its data dumped again with every secret redacted
(:func:`omrl.config.redact`), so a secret in a YAML comment cannot reach the page either; a config.yaml
omrl wrote (``yaml.safe_dump``, no comments) reads the same. Text that does not parse (or is no
mapping) is shown line by line with the value of every key named like a secret
(:func:`omrl.config.is_secret_key`, a comment's included), every value of an environment mapping below
the top level, and what :func:`omrl.config.redact_text` finds (a URL's password, ``--token X``) redacted.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from omrl.config import REDACTED, is_secret_key, redact, redact_text
from omrl.config.redaction import ENVIRONMENT_KEYS
from omrl.view.sources import Problem

# a YAML key anywhere in a line (a comment's too): a name, maybe quoted, then a colon and a space or the end
_KEY = re.compile(r"(?<![\w-])[\"']?(?P<name>[A-Za-z_][\w.-]*)[\"']?[ \t]*:(?=\s|$)")


def read_config(path: Path | None, label: str) -> tuple[str, dict[str, Any] | None, list[Problem]]:
    """(the text the page shows, the parsed mapping or None, the problems met) for the run's config.yaml."""
    import yaml

    if path is None:
        return "", None, []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return "", None, [Problem(label, f"cannot be read ({exc.strerror or exc})")]
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:  # shown all the same, each line's secret redacted
        problem = Problem(label, f"not valid YAML ({str(exc).splitlines()[0]})", level="warning")
        return redact_lines(text), None, [problem]
    if not isinstance(data, dict):
        return redact_lines(text), None, []
    return redacted_dump(text, data), data, []


def redacted_dump(text: str, data: dict[str, Any]) -> str:
    """``data`` (parsed from ``text``) as YAML with its secrets redacted; a first comment says what was left out."""
    import yaml

    clean = redact(data)
    notes = ["secrets redacted by omrl view"] if clean != data else []
    if any(line.lstrip().startswith("#") for line in text.splitlines()):
        notes.append("comments left out by omrl view (one could hold a secret)")
    head = "".join(f"# {note}\n" for note in notes)
    return head + yaml.safe_dump(clean, sort_keys=False)


def redact_lines(text: str) -> str:
    """``text`` (YAML that does not parse) with the secrets each line shows redacted: a secret key's value,
    and the lines below it (a block or a mapping under the key), and the values of an environment
    mapping below the top level (``plugins.mcp.env``: omrl cannot tell which of them are secrets).

    >>> print(redact_lines("a:\\n  api_key: sk-1  # the key\\n  env:\\n    DB: x\\n# token: t2\\nb: ["))
    a:
      api_key: <redacted>
      env:
        DB: <redacted>
    # token: <redacted>
    b: [
    """
    out = []
    below: tuple[int, bool] | None = None  # (the key's column, whether its lines keep their names)
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        if below is not None and (not line.strip() or indent > below[0]):
            out.append(_hidden(line, indent, keep_names=below[1]))
            continue
        line, below = _redact_line(line)
        out.append(redact_text(line))
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def _redact_line(line: str) -> tuple[str, tuple[int, bool] | None]:
    """One line with a secret key's value redacted, and what the lines below it hide, if anything."""
    for match in _KEY.finditer(line):
        name, rest = match["name"], line[match.end() :].strip()
        column = match.start()
        if is_secret_key(name.rsplit(".", 1)[-1]):
            shown = line[: match.end()] + (f" {REDACTED}" if rest else "")
            return shown, (column, False) if not rest or rest[0] in "|>" else None
        if column > 0 and name.lower() in ENVIRONMENT_KEYS and (not rest or rest.startswith("#")):
            return line, (column, True)
    return line, None


def _hidden(line: str, indent: int, keep_names: bool) -> str:
    """A line below a secret key (all of it hidden), or of an environment mapping (its name kept)."""
    if not line.strip():
        return line
    key = _KEY.match(line, indent) if keep_names else None
    if key is not None:
        return line[: key.end()] + f" {REDACTED}"
    return line[:indent] + REDACTED
