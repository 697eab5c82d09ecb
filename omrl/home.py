"""Where omrl keeps what it builds once and reuses in later runs: ``$OMRL_HOME``, by default
``~/.cache/omrl`` (the built-in models, generated TextWorld games, the chat templates already checked).
It imports nothing: any layer may ask."""

from __future__ import annotations

import os
from pathlib import Path


def omrl_home() -> Path:
    return Path(os.environ.get("OMRL_HOME", Path.home() / ".cache" / "omrl"))
