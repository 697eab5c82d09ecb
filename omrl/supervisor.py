"""Deadlines for every stage of a run, and what happens when one passes: a run never hangs silently.

A run states how long each stage may take (``deadlines.<stage>_s``, 0: no deadline). Code that runs a
stage wraps it in :func:`stage`; while a :class:`Supervisor` is installed (:func:`supervise`, which
every command that plays episodes does), a watchdog thread watches every open stage. When one
outlives its deadline the watchdog

- names it: the stage, the step, the env and the episode (warned, and in the stall file);
- writes every thread's stack to ``<run>/stalls/``;
- interrupts it, when it runs on the main thread: a signal raises :class:`StageStalled` there, which
  also breaks a blocking read. A stage that another thread runs for a waiter that bounds its own
  wait (:meth:`Supervisor.open` with ``waited``, the env pool's threads) is left behind by that waiter.

The caller then does what the stage and ``deadlines.on_stall`` say: an env or reward stage drops its
episodes as ``env_error`` (``drop``), plays them again once (``retry``), or stops the run (``stop``);
the other stages always stop the run, with exit status 2 (:class:`StageStalled` is an
:class:`~omrl.errors.OmrlError`). Code that Python cannot interrupt (a C loop, a read on another thread
that nobody waits for) gets ``deadlines.grace_s`` more; then the run writes what it knows and exits 2. C code
holding the GIL stops the watchdog too: faulthandler's timer writes the stacks 2 s later and exits 1.

A heartbeat goes to ``<run>/heartbeat.json`` and, when no step was logged for ``heartbeat_s``, as a
record of its own to ``metrics.jsonl``: each stage's count, time and the ones open now.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from omrl.atomic import atomic_write_text
from omrl.clock import timed
from omrl.errors import ConfigError, OmrlError

#: each stage a run bounds, and what it is, for messages
STAGES = {
    "generate": "a generate call",
    "env_reset": "an env reset",
    "env_step": "an env step (its tool calls included)",
    "reward": "a reward function",
    "weight_sync": "a weight sync to the rollout backend",
    "checkpoint": "a checkpoint save",
    "eval": "an evaluation",
    "handover": "waiting for the generation process's next step",
}
#: stages whose stall can be charged to the episodes in them, not to the whole run
EPISODE_STAGES = ("env_reset", "env_step", "reward")
ON_STALL = ("drop", "retry", "stop")
HEARTBEAT_FILE = "heartbeat.json"
STALLS_DIR = "stalls"
_SIGNAL = signal.SIGUSR2
#: how long after a stage's deadline and grace the GIL-free backstop ends the process: late enough that
#: the watchdog thread, whenever it can run, always acts first
BACKSTOP_AFTER_S = 2.0


class StageStalled(OmrlError):
    """A stage outlived its deadline; the message names it, where it was, and where its stacks are."""

    def __init__(self, message: str, stage: str = ""):
        super().__init__(message)
        self.stage = stage

    def drops_episodes(self) -> bool:
        """Whether the run says to charge it to the episodes in it (``env_error``) rather than stop."""
        return self.stage in EPISODE_STAGES and on_stall() != "stop"


@dataclass
class Open:
    """A stage being run: what, where, on which thread, and when it must end (``time.monotonic``)."""

    stage: str
    where: dict[str, Any]
    thread: int
    started: float
    deadline: float
    waited: bool = False  # its waiter bounds its own wait and leaves it behind: never interrupted
    fired: bool = False  # the deadline passed and was reported
    raised: bool = False  # StageStalled was raised for it (once at most)
    message: str = ""


@dataclass
class _Progress:
    done: int = 0
    seconds: float = 0.0
    stalled: int = 0
    last_done: float = 0.0  # time.time()


@dataclass
class Supervisor:
    """Watches the open stages of this process against ``deadlines`` (a ``DeadlineConfig``)."""

    deadlines: Any
    folder: Path | None = None
    warn: Callable[[str], None] = lambda message: print(f"warning: {message}", file=sys.stderr)
    heartbeat: Callable[[dict[str, Any]], None] | None = None  # where a heartbeat record goes (metrics.jsonl)
    beat_file: str = HEARTBEAT_FILE  # its file in ``folder``: one per process of a run
    step: int = 0  # the step being played (0: before the first), for messages
    _open: dict[int, Open] = field(default_factory=dict)
    _progress: dict[str, _Progress] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _last_beat: float = field(default_factory=time.monotonic)
    _last_dump: float = 0.0
    _signals: bool = False
    _thread: threading.Thread | None = None
    _backstop_at: float | None = None  # when faulthandler's timer ends the process (time.monotonic)
    _backstop_file: Any = None

    def __post_init__(self) -> None:
        check_deadlines(self.deadlines)

    # -- the stages --------------------------------------------------------------------------------------
    def seconds(self, name: str) -> float:
        return float(getattr(self.deadlines, f"{name}_s"))

    def open(self, name: str, where: dict[str, Any], waited: bool = False) -> Open | None:
        """Start watching a stage run by this thread (``waited``: by a thread a waiter bounds); None when
        ``name`` has no deadline."""
        seconds = self.seconds(name)
        if seconds <= 0:
            return None
        now = time.monotonic()
        record = Open(name, {"step": self.step, **where}, threading.get_ident(), now, now + seconds, waited)
        with self._lock:
            self._open[id(record)] = record
            self._arm_backstop()
        return record

    def close(self, record: Open | None) -> None:
        if record is None:
            return
        with self._lock:
            self._open.pop(id(record), None)
            progress = self._progress.setdefault(record.stage, _Progress())
            progress.done += 1
            progress.seconds += time.monotonic() - record.started
            progress.stalled += record.fired
            progress.last_done = time.time()
            self._arm_backstop()

    # -- the watchdog -------------------------------------------------------------------------------------
    def start(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(_SIGNAL, self._on_signal)
            self._signals = True
        ticks = [self.seconds(name) for name in STAGES if self.seconds(name) > 0] + [self.deadlines.heartbeat_s]
        tick = min(0.5, max(0.02, min(ticks) / 5))
        self._thread = threading.Thread(target=self._watch, args=(tick,), name="omrl-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self._signals:
            signal.signal(_SIGNAL, signal.SIG_DFL)
            self._signals = False
        with self._lock:
            self._disarm_backstop()
        self._remove_backstop_file()

    # -- the backstop: the watchdog needs the GIL, and a stage stuck in C code holding it never lets go ------
    def _arm_backstop(self) -> None:
        """(Under the lock.) Set faulthandler's timer, which needs no GIL, to the earliest open stage's deadline
        plus grace_s and :data:`BACKSTOP_AFTER_S`: it then writes every thread's stack and ends the process
        (exit status 1, faulthandler's). Stages a waiter bounds count too: their waiter closes them at their
        deadline unless the stuck one holds the GIL. One timer per process: the last supervisor to arm owns it."""
        at = min((r.deadline for r in self._open.values()), default=None)
        if at is None:
            return self._disarm_backstop()
        at += self.deadlines.grace_s + BACKSTOP_AFTER_S
        if at != self._backstop_at and self._backstop_output() is not None:
            faulthandler.dump_traceback_later(max(at - time.monotonic(), 0.001), exit=True, file=self._backstop_file)
            self._backstop_at = at

    def _disarm_backstop(self) -> None:
        if self._backstop_at is not None:
            faulthandler.cancel_dump_traceback_later()
            self._backstop_at = None

    def _remove_backstop_file(self) -> None:
        file, self._backstop_file = self._backstop_file, None
        if file is not None and file is not sys.__stderr__:  # never written: the process goes on or exits itself
            with contextlib.suppress(OSError):  # a full disk fails the close too: the file goes all the same
                file.close()
            with contextlib.suppress(OSError):
                os.remove(file.name)
                os.rmdir(os.path.dirname(file.name))  # no stall, no stalls/ (refused while it holds any)

    def _backstop_output(self) -> Any:
        """Where the backstop writes: ``<folder>/stalls/held-gil-<pid>.txt`` (removed unused), else stderr."""
        try:
            if self._backstop_file is None and self.folder is None:
                sys.__stderr__.fileno()  # pytest and notebooks put objects without one in sys.stderr
                self._backstop_file = sys.__stderr__
            elif self._backstop_file is None:
                path = self.folder / STALLS_DIR / f"held-gil-{os.getpid()}.txt"
                path.parent.mkdir(parents=True, exist_ok=True)
                self._backstop_file = path.open("w")
                print(_BACKSTOP_HEADER, file=self._backstop_file, flush=True)
        except (AttributeError, OSError, ValueError):
            self._remove_backstop_file()  # a file that could not take its header (a full disk) is no stall's
            return None
        return self._backstop_file

    def _watch(self, tick: float) -> None:
        while not self._stop.wait(tick):
            now = time.monotonic()
            with self._lock:
                records = list(self._open.values())
            for record in records:
                if not record.fired and now >= record.deadline:
                    self._fire(record)
                elif record.fired and not record.waited and now >= record.deadline + self.deadlines.grace_s:
                    self._give_up(record)
            if self.deadlines.heartbeat_s > 0 and now - self._last_beat >= self.deadlines.heartbeat_s:
                self.beat()

    def _fire(self, record: Open) -> None:
        stacks = self._dump(record)
        seconds = self.seconds(record.stage)
        where = ", ".join(f"{key} {value}" for key, value in record.where.items() if value not in ("", None))
        record.message = (
            f"{STAGES[record.stage]} did not finish within deadlines.{record.stage}_s={seconds:g} ({where})"
            + (f"; every thread's stack is in {stacks}" if stacks else "")
        )
        record.fired = True
        self.warn(record.message)
        main = threading.main_thread().ident
        if self._signals and record.thread == main and not record.waited:
            signal.pthread_kill(main, _SIGNAL)

    def _on_signal(self, signum: int, frame: Any) -> None:
        """On the main thread: raise for its stalled stage (once); a late signal finds none and is ignored."""
        main = threading.get_ident()
        with self._lock:
            record = next((r for r in self._open.values() if r.thread == main and r.fired and not r.raised), None)
            if record is not None:
                record.raised = True
        if record is not None:
            raise StageStalled(record.message, record.stage)

    def _give_up(self, record: Open) -> None:
        """Python could not interrupt the stage: say so, and end the process (exit status 2)."""
        self.warn(
            f"{record.message}; it did not give way within deadlines.grace_s={self.deadlines.grace_s:g} more, so "
            "the run stops here (exit status 2); what it saved before stays"
        )
        self.beat()
        sys.stderr.flush()
        self._remove_backstop_file()
        os._exit(2)

    def _dump(self, record: Open) -> Path | None:
        """Every thread's stack, to ``<folder>/stalls/`` (at most one file a second: many episodes of one
        stuck server stall together)."""
        if self.folder is None or time.monotonic() - self._last_dump < 1.0:
            return None
        self._last_dump = time.monotonic()
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        lines = [f"{STAGES[record.stage]} stalled: {json.dumps(record.where, default=str)}", ""]
        for ident, frame in sys._current_frames().items():
            marker = " (the stalled stage)" if ident == record.thread else ""
            lines += [f"thread {names.get(ident, ident)}{marker}:", *traceback.format_stack(frame), ""]
        path = self.folder / STALLS_DIR / f"step-{record.where.get('step', 0):08d}-{record.stage}-{time.time():.0f}.txt"
        try:
            atomic_write_text(path, "\n".join(lines))
        except OSError:  # a full disk must not hide the stall itself
            return None
        return path

    # -- the heartbeat ------------------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """Each stage's count, seconds and stalls so far, and the stages open now with their age."""
        now = time.monotonic()
        with self._lock:
            stages = {
                name: {
                    "done": p.done,
                    "seconds": round(p.seconds, 3),
                    "stalled": p.stalled,
                    "last_done": round(p.last_done, 3),
                }
                for name, p in self._progress.items()
            }
            running = [
                {"stage": r.stage, **r.where, "for_s": round(now - r.started, 3), "stalled": r.fired}
                for r in self._open.values()
            ]
        return {"time": round(time.time(), 3), "step": self.step, "stages": stages, "open": running}

    def beat(self) -> None:
        """Write the heartbeat now: ``heartbeat.json``, and a record for ``metrics.jsonl``."""
        self._last_beat = time.monotonic()
        record = self.report()
        if self.folder is not None:
            with contextlib.suppress(OSError):
                atomic_write_text(self.folder / self.beat_file, json.dumps(record, indent=1))
        if self.heartbeat is not None:
            with contextlib.suppress(Exception):  # the heartbeat must never be what fails a run
                self.heartbeat(record)

    def logged(self) -> None:
        """A step was logged: the heartbeat's next record is due ``heartbeat_s`` from now."""
        self._last_beat = time.monotonic()


_BACKSTOP_HEADER = (
    "A stage held Python's lock (the GIL) past its deadline and deadlines.grace_s, so the watchdog could not "
    "run: faulthandler wrote every thread's stack below and ended the process (exit status 1)."
)


def check_deadlines(deadlines: Any) -> None:
    """Refuse a negative deadline or an unknown ``on_stall``, naming the key and what is valid."""
    for name in (*STAGES, "grace", "heartbeat"):
        value = getattr(deadlines, f"{name}_s")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ConfigError(f"deadlines.{name}_s must be a number of seconds >= 0 (0: none), got {value!r}")
    if deadlines.on_stall not in ON_STALL:
        raise ConfigError(f"unknown deadlines.on_stall {deadlines.on_stall!r}; valid: {', '.join(ON_STALL)}")


# -- the process's supervisor ---------------------------------------------------------------------------
_current: Supervisor | None = None


def current() -> Supervisor | None:
    """The supervisor installed in this process, or None (no deadlines: tests and library use)."""
    return _current


@contextlib.contextmanager
def supervise(
    deadlines: Any,
    folder: str | os.PathLike | None = None,
    warn: Callable[[str], None] | None = None,
    heartbeat: Callable[[dict[str, Any]], None] | None = None,
    beat_file: str = HEARTBEAT_FILE,
) -> Iterator[Supervisor]:
    """Install a :class:`Supervisor` for the block (the one before it comes back after); a second
    process of the run (async generation) names its own ``beat_file``."""
    global _current
    folder = Path(folder) if folder is not None else None
    supervisor = Supervisor(deadlines, folder, heartbeat=heartbeat, beat_file=beat_file)
    if warn is not None:
        supervisor.warn = warn
    before, _current = _current, supervisor
    supervisor.start()
    try:
        yield supervisor
    finally:
        supervisor.stop()
        _current = before
        if before is not None:  # faulthandler's one timer is the outer supervisor's again
            with before._lock:
                before._backstop_at = None
                before._arm_backstop()


@contextlib.contextmanager
def stage(name: str, **where: Any) -> Iterator[Open | None]:
    """Run the block as stage ``name`` (a key of :data:`STAGES`) under its deadline, ``where`` naming it
    (``env=``, ``episode=``). Past the deadline, on the main thread, the block gets :class:`StageStalled`."""
    supervisor = _current
    record = supervisor.open(name, where) if supervisor is not None else None
    try:
        try:
            with timed(name):  # where the step's time goes, too (omrl.clock)
                yield record
        finally:
            if record is not None:  # from here on the signal finds nothing to raise for
                record.raised = True
    finally:
        if supervisor is not None:
            supervisor.close(record)


def at_step(step: int) -> None:
    """The run is playing ``step`` now (stall messages and the heartbeat name it)."""
    if _current is not None:
        _current.step = step


def on_stall() -> str:
    """What an env or reward stage that stalled should do: ``drop``, ``retry`` or ``stop``."""
    return _current.deadlines.on_stall if _current is not None else "drop"
