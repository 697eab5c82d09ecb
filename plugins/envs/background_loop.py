"""An asyncio event loop on a daemon thread, one per process, for plugins whose client libraries are
async (MCP, OpenEnv) while an env's calls are not: :class:`ProcessLoop`."""

from __future__ import annotations

import asyncio
import os
import threading


class ProcessLoop:
    """A loop named ``name``, started on first use and again in a forked child (which has the loop
    object but not the thread that ran it)."""

    def __init__(self, name: str):
        self.name = name
        self._lock = threading.Lock()
        self._loop: tuple[int, asyncio.AbstractEventLoop, threading.Thread] | None = None  # (pid, loop, its thread)

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop[0] != os.getpid() or not self._loop[2].is_alive():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
                thread.start()
                self._loop = (os.getpid(), loop, thread)
            return self._loop[1]
