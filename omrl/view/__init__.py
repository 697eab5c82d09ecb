"""``omrl view``: a local web page for a run directory, a trajectory file or an eval report, or two evals compared.

- :mod:`omrl.view.sources` finds what a path holds (metrics, config, trajectories,
  eval reports) and notes every file it could not read, naming the file.
- :mod:`omrl.view.metrics` reads ``metrics.jsonl`` and sorts its keys into plot panels;
  :mod:`omrl.view.configtext` the run's ``config.yaml``, its secrets redacted whatever the file holds.
- :mod:`omrl.view.store` indexes the episodes (summaries only) and loads one on demand;
  :mod:`omrl.view.detail` lays one out in full.
- :mod:`omrl.view.tokens` turns token ids into per-token text with the run's tokenizer.
- :mod:`omrl.view.evals` finds the answer an env expected, each task's pass@k and each reward component's sum.
- :mod:`omrl.view.compare` puts two evals side by side (``omrl view A B``).
- :mod:`omrl.view.games` lays out a game of several seats: every seat's moves in play order.
- :mod:`omrl.view.page` renders the self-contained page; :mod:`omrl.view.server` serves it.
- :mod:`omrl.view.plot` writes the learning curves as PNG (``omrl plot``).
- :mod:`omrl.view.readers` reads episodes from the three kinds of files, :mod:`omrl.view.groups`
  the advantages and search trees, :mod:`omrl.view.agents` episodes an agent program played, and
  :mod:`omrl.view.bounds` caps how much one answer carries.

Nothing here imports torch: a page for a 10,000-episode run must open in seconds.
"""

import shlex

from omrl.view.sources import Problem, RunSource, discover
from omrl.view.store import EpisodeStore, open_run


def view_command(path: object) -> str:
    """The ``omrl view`` command line for ``path``, for commands to print when they finish."""
    return f"omrl view {shlex.quote(str(path))}"


__all__ = ["EpisodeStore", "Problem", "RunSource", "discover", "open_run", "view_command"]
