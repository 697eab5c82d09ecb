"""TensorBoard events of a run (``<output_dir>/tensorboard``), written so that a failure to write them
is said as any other file's: naming the folder, once, on the step that found it.

TensorBoard writes its events on a thread of its own. When a write fails there (a full disk), the
thread prints its traceback and the writer raises the same error, naming no file, on its next call.
:class:`Board` keeps that thread's traceback off the console and raises the error naming the folder,
on the next :meth:`Board.add` or on :meth:`Board.close`, so a run never ends 0 with events missing.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

from omrl.atomic import naming


class Board:
    """A SummaryWriter into ``folder``; ``purge_step`` drops the events a killed run wrote after it."""

    def __init__(self, folder: Path, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.folder = folder
        self._failure: BaseException | None = None  # the writer thread's
        self._said = False  # a failure was raised already
        self._previous_hook = threading.excepthook
        threading.excepthook = self._thread_failed
        with naming(folder):
            self._writer = SummaryWriter(str(folder), purge_step=purge_step)

    def add(self, step: int, metrics: dict[str, Any], tag: Any) -> None:
        """Each finite number of ``metrics`` as a scalar of ``step``, under ``tag(key)``."""
        try:
            with naming(self.folder):
                for key, value in metrics.items():
                    if isinstance(value, (int, float)) and math.isfinite(value):
                        self._writer.add_scalar(tag(key), value, step)
        except OSError:
            self._said = True  # close() does not say it again
            raise

    def close(self) -> None:
        """Write what is queued and close; a write that failed on the writer's thread is raised here."""
        try:
            with naming(self.folder):
                try:
                    self._writer.close()  # it raises the thread's failure too
                except OSError:
                    if not self._said:
                        raise
                if self._failure is not None and not self._said:
                    raise self._failure
        finally:
            self._said = True
            if threading.excepthook == self._thread_failed:
                threading.excepthook = self._previous_hook

    def _thread_failed(self, args: Any) -> None:
        """threading's hook: the writer thread's OSError is kept (the writer raises it on its next call, and
        :meth:`close` does), the rest go to the hook before this one."""
        if type(args.thread).__module__.startswith("tensorboard.") and isinstance(args.exc_value, OSError):
            self._failure = args.exc_value
            return
        self._previous_hook(args)
