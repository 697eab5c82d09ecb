"""How ``omrl env play`` and ``omrl env serve`` take an env's options: ``-o KEY=VALUE``, and an env's
own errors, which name its options as a run sets them (``plugins.NAME.KEY``), said in those words."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

OPTION_HELP = "An env option as key=value (repeatable), e.g. --option base_url=http://127.0.0.1:8000"


def parse_options(options: list[str] | None, name: str = "") -> dict[str, Any]:
    """``["k=v", "a.b=1"]`` -> ``{"k": "v", "a": {"b": 1}}``, values read as YAML scalars, but for an option
    env ``name`` declares as text, which keeps what was typed (``instruction=Note: be brief``)."""
    from omrl.config import overrides_to_dict
    from omrl.plugin_options import typed_text

    parsed = overrides_to_dict(options or [], example="-o size=7")
    typed = dict(item.split("=", 1) for item in options or [] if "=" in item)
    return {key: typed_text(name, key, typed[key], value) if key in typed else value for key, value in parsed.items()}


@contextlib.contextmanager
def options_as_flags(name: str) -> Iterator[None]:
    """An env's own error names its options as a run sets them (``plugins.NAME.KEY``); here they are
    ``-o KEY=VALUE``, so the message says that."""
    from omrl.errors import OmrlError

    try:
        yield
    except OmrlError as exc:
        text = str(exc).replace(f"plugins.{name}.", "-o ")
        if text == str(exc):
            raise
        try:
            again = type(exc)(text)
        except TypeError:  # an error class with other arguments
            again = OmrlError(text)
        raise again from exc
