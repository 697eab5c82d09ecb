"""How a config option is declared (:func:`opt`) and how its help reads (:func:`help_text`).

An option whose value names a plugin says which registry holds the valid names
(``names_of=("algorithms", "advantage")``): its help then lists what is registered when it is
shown, so a plugin's estimator appears there as a built-in one does and no list is kept by hand.
"""

from __future__ import annotations

from dataclasses import Field, field
from typing import Any


def opt(
    default: Any,
    help: str,
    names_of: tuple[str, str | None] | None = None,
    low: float | None = None,
    high: float | None = None,
    **kw: Any,
) -> Any:
    """A dataclass field with a help text (mutable defaults go through a factory); ``names_of``:
    (registry, kind) whose registered names the help lists; ``low``/``high``: the smallest and largest
    number it takes, refused when the config loads (a negative count once meant "all but N")."""
    metadata = {"help": help, **({"names_of": names_of} if names_of else {})}
    metadata.update({name: bound for name, bound in (("low", low), ("high", high)) if bound is not None})
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata, **kw)
    return field(default=default, metadata=metadata, **kw)


def help_text(f: Field) -> str:
    """The help of option ``f``, with the names its registry holds now where it names a plugin."""
    text = f.metadata.get("help", "")
    if "names_of" not in f.metadata:
        return text
    from omrl import registry  # plugins load only when a help is shown

    registry_name, kind = f.metadata["names_of"]
    names = getattr(registry, registry_name).names(kind)
    return f"{text} Registered: {', '.join(sorted(names))} (`omrl plugins`)."
