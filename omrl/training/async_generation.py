"""Generation in a process of its own, running ahead of the trainer by a fixed number of weight versions.

With ``rollout.async_generation=true`` the online recipes take each step's episodes from a
:class:`GenerationProcess`: a spawned process with its own copy of the policy, its own envs and
its own backend: ``hf``, or the ``vllm`` engine (each version loaded into it in place; the
evaluations during training then play on the trainer's model with ``hf``). While the trainer
updates on step k, that process plays step k+1.

By default the lag is exact, which makes a run reproducible. Version v means the weights after v updates.
Step j is played with version ``max(0, j - max_staleness)``; the trainer sends each version when
its update is done, and the process holds back any version it does not need yet. So every
episode of a step, and every turn of it, is exactly ``min(j, max_staleness)`` versions behind
the weights it is trained with. Nothing is ever too stale to use, a task's group always comes
from one version (its baseline compares like with like), and ``max_staleness=0`` plays what the
synchronous run plays. Each turn records the version it was sampled with
(``Turn.info["weights_version"]``). The trainer's old log-probs are the proximal policy, and the
sampler's log-probs are the behaviour policy: ``algorithm.rollout_correction`` (``auto``:
``token_tis`` once the lag is above 0) corrects between them.

With ``rollout.partial_rollouts=true`` the process instead loads the newest version it has
received before every generate call (:meth:`Versions.newest_at_every_turn`): an episode in flight
keeps its finished turns and goes on under the new weights, each turn recording its own version.
A step is still requested only once the weights of update ``j - max_staleness`` are sent, so no
turn is more than ``max_staleness`` versions behind; the members of a group are sampled in the
same generate calls, so turn k of each comes from the same version. Which turn an update lands
on depends on timing, so such runs are not reproducible (with ``max_staleness=0`` no update is
ever in flight and they are).

A checkpoint keeps the steps already played ahead (their episodes and metrics), so a resumed run
trains exactly what the stopped one would have.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any, Sequence

import torch

from omrl.errors import ConfigError, OmrlError
from omrl.mixture import is_mixture, task_of
from omrl.supervisor import stage, supervise
from omrl.training.rollout_step import play_step, step_metrics

POLL_SECONDS = 1.0  # how often a wait for the process checks that it is still alive
ENDING_GRACE_S = 10.0  # how long a generation process whose trainer died may take to close its envs
GENERATION_HEARTBEAT_FILE = "heartbeat-generation.json"  # the run's heartbeat.json is the trainer's


def version_for(step: int, max_staleness: int) -> int:
    """The weight version step ``step`` (0-based) is played with."""
    return max(0, step - max_staleness)


def runtime_plugins() -> list[tuple[str, Any]]:
    """The plugins registered in this process at run time (not through an entry point), which the
    spawned process must register too; each must pickle (a module-level class)."""
    import pickle

    from omrl.plugins import distribution_of, load_plugins

    plugins = []
    for name, plugin in load_plugins().list_name_plugin():
        if distribution_of(name) != "-" or plugin is None:  # an entry point's: the process loads it itself
            continue
        try:
            pickle.dumps(plugin)
        except Exception as exc:
            raise ConfigError(
                f"plugin {name!r} was registered at run time and cannot be sent to the generation process "
                f"({type(exc).__name__}: {exc}); register it through an entry point, or set "
                "rollout.async_generation=false"
            ) from exc
        plugins.append((name, plugin))
    return plugins


class GenerationProcess:
    """The trainer's handle on the generation process: ``request`` steps, ``take`` their episodes,
    ``publish`` each new weight version, ``close``."""

    def __init__(self, cfg: Any, weights: dict[str, torch.Tensor], version: int):
        self.staleness = cfg.rollout.max_staleness
        context = multiprocessing.get_context("spawn")  # fork would copy torch's threads and locks
        self.requests, self.results = context.Queue(), context.Queue()
        self.requested: dict[int, tuple[list[Any], int]] = {}  # step -> (tasks, seed)
        self.taken: dict[int, tuple[list[Any], int]] = {}  # step -> (tasks, seed), once its episodes are taken
        self.ready: dict[int, tuple[list[Any], dict[str, float]]] = {}  # step -> (episodes, metrics)
        self.process = context.Process(
            target=_serve,
            args=(cfg, runtime_plugins(), _cpu_copy(weights), version, self.requests, self.results),
            name="omrl-generation",
            daemon=True,
        )
        self.process.start()

    def request(self, step: int, tasks: Sequence[Any], seed: int) -> None:
        """Play ``tasks`` for ``step`` with the weights of its version (:func:`version_for`)."""
        self.requested[step] = (list(tasks), seed)
        self.requests.put(("play", step, list(tasks), seed, version_for(step, self.staleness)))

    def replay(self, step: int) -> None:
        """Play ``step`` again (every episode failed in the env), with the newest weights the process holds."""
        tasks, seed = self.requested[step] = self.taken.pop(step)
        self.requests.put(("play", step, tasks, seed, -1))

    def publish(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        """The weights after ``version`` updates; the process applies them when a step needs them."""
        self.requests.put(("weights", version, _cpu_copy(weights)))

    def take(self, step: int) -> tuple[list[Any], dict[str, float], float]:
        """(episodes, their rollout metrics, seconds waited for them) of ``step``."""
        started = time.perf_counter()
        with stage("handover", episode=f"the episodes of step {step}"):
            while step not in self.ready:
                self._receive()
        episodes, metrics = self.ready.pop(step)
        self.taken = {step: self.requested.pop(step)}
        return episodes, metrics, time.perf_counter() - started

    def played_ahead(self) -> dict[int, tuple[list[Any], dict[str, float]]]:
        """Every requested step not yet taken, waiting for those still being played (for a checkpoint)."""
        with stage("handover", episode="the steps played ahead, for a checkpoint"):
            while any(step not in self.ready for step in self.requested):
                self._receive()
        return {step: self.ready[step] for step in sorted(self.requested)}

    def restore(
        self, played: dict[int, tuple[list[Any], dict[str, float]]], tasks: dict[int, tuple[list, int]]
    ) -> None:
        """Steps a checkpoint kept as played ahead: taken from here, not played again."""
        self.ready.update(played)
        self.requested.update(tasks)

    def _receive(self) -> None:
        try:
            message = self.results.get(timeout=POLL_SECONDS)
        except queue.Empty:
            if not self.process.is_alive():
                raise OmrlError(
                    f"the generation process stopped (exit code {self.process.exitcode}) without a word: killed, "
                    "or out of memory? continue with --resume"
                ) from None
            return
        if message[0] == "error":
            raise OmrlError(f"the generation process failed: {message[1]}")
        _, step, episodes, metrics = message
        self.ready[step] = (episodes, metrics)

    def close(self) -> None:
        if self.process.is_alive():
            self.requests.put(("stop",))
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5)
        if self.process.is_alive():  # stopped or stuck, so deaf to SIGTERM: the run would wait for it at exit
            self.process.kill()
            self.process.join(timeout=5)
        self.requests.cancel_join_thread()  # weights it never read must not hold the trainer's exit


def _cpu_copy(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy the trainer's next update cannot change (queues share tensors' memory, not copy it)."""
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights.items()}


class TrainerGone(Exception):
    """The trainer that asked for steps is dead: the generation process ends (closing its envs)."""


class Versions:
    """The generation process's side of the weight versions: those received and not yet loaded
    (``held``), the one its backend holds (``version``), and the other messages read on the way."""

    def __init__(self, backend: Any, version: int, requests: Any):
        self.backend, self.version, self.requests = backend, version, requests
        self.held: dict[int, dict[str, torch.Tensor]] = {}
        self.pending: deque = deque()  # play and stop requests, in order

    def read(self, block: bool) -> bool:
        """Take one message (waiting for it when ``block``): weights are held, the rest queued in
        ``pending``. False when none was waiting. A wait ends in :class:`TrainerGone` when the trainer
        died without a word (killed: SIGKILL, the out-of-memory killer)."""
        try:
            message = self.requests.get(timeout=POLL_SECONDS) if block else self.requests.get_nowait()
        except queue.Empty:
            if block and not multiprocessing.parent_process().is_alive():
                raise TrainerGone from None
            return False
        if message[0] == "weights":
            self.held[message[1]] = message[2]
        else:
            self.pending.append(message)
        return True

    def next_request(self) -> tuple:
        while not self.pending:
            self.read(block=True)
        return self.pending.popleft()

    def load(self, wanted: int) -> None:
        """Load version ``wanted`` (-1: the newest received) into the backend, dropping older ones.
        The trainer sends each version before any step that needs it, so it has been read."""
        wanted = max(self.held, default=self.version) if wanted < 0 else wanted
        if wanted > self.version:
            self.backend.update_weights(self.held[wanted])
            self.version = wanted
        self.held = {v: w for v, w in self.held.items() if v > self.version}

    def newest_at_every_turn(self) -> None:
        """Partial rollouts: before every generate call, load the newest version received, and stamp
        each reply with the version that sampled it (the rollout keeps it in ``Turn.info``)."""
        sample = self.backend.generate

        def generate(prompts, params, messages=None):
            while self.read(block=False):
                pass
            self.load(-1)
            replies = sample(prompts, params, messages)
            for reply in replies:
                reply.weights_version = self.version
            return replies

        self.backend.generate = generate  # on the object: every session of a mixture holds this one backend


def _serve(cfg, plugins, weights, version, requests, results) -> None:
    """The generation process: load weight versions as steps need them (or, with partial rollouts,
    the newest at every turn), play each requested step."""
    session, gone = None, threading.Event()
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # one inherited as ignored would not raise
        threading.Thread(target=_watch_trainer, args=(gone,), daemon=True).start()
        from omrl.models import load_model, load_tokenizer
        from omrl.parallel import Strategy
        from omrl.plugins import load_plugins
        from omrl.rollout import RolloutSession

        if cfg.rollout.generation_threads:
            torch.set_num_threads(cfg.rollout.generation_threads)
        pm = load_plugins()
        for name, plugin in plugins:
            pm.register(plugin, name=name)
        if cfg.generation.backend == "hf":
            device = "cuda" if torch.cuda.is_available() else None
            model, tokenizer = load_model(cfg.model.name, dtype=cfg.model.dtype, device=device)
            model.eval()
        else:  # the engine loads the model itself
            model, tokenizer = None, load_tokenizer(cfg.model.name)
        session = RolloutSession.from_config(cfg, model=model, tokenizer=tokenizer)
        session.backend.update_weights(weights)  # the version it starts from (a resumed run's)
        versions = Versions(session.backend, version, requests)
        partial = cfg.rollout.partial_rollouts
        if partial:
            versions.newest_at_every_turn()
        watch = supervise(
            cfg.deadlines,
            cfg.logging.output_dir,
            warn=lambda text: print(f"warning: {text}", file=sys.stderr),
            beat_file=GENERATION_HEARTBEAT_FILE,  # each process's heartbeat says that it lives
        )
        with watch as supervisor:
            while True:
                message = versions.next_request()
                if message[0] == "stop":
                    break
                _, step, tasks, seed, needed = message
                versions.load(-1 if partial else needed)  # a replay (needed -1) takes the newest too
                started = time.perf_counter()
                supervisor.step = step + 1
                played = play_step(cfg, session, tasks, seed)
                episodes = played.episodes
                for ep in episodes:
                    for turn in ep.turns:
                        turn.info.setdefault("weights_version", versions.version)
                metrics = step_metrics(played, time.perf_counter() - started, session, Strategy())
                results.put(("played", step, episodes, metrics))
    except BaseException as exc:  # reported to the trainer, which stops the run with it, unless it is gone
        if isinstance(exc, TrainerGone) or gone.is_set():  # nobody to report to: end, freeing the model and envs
            # a step played ahead may still sit in the results pipe, which no one will read: at exit the
            # queue's writer thread would wait for that forever
            results.cancel_join_thread()
        else:
            results.put(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"))
    finally:  # on any end: its envs may hold an env server's or a sandbox's slots
        if session is not None:
            try:
                session.close()
            except Exception as exc:
                print(f"warning: closing the generation process's envs failed: {exc}", file=sys.stderr)


def _watch_trainer(gone: threading.Event) -> None:
    """A thread of the generation process: when its trainer dies without a word mid-step (SIGKILL, the
    out-of-memory killer), interrupt the step being played, so the process ends within a second rather
    than when the step's rollout would have ended (a wait for a request notices by itself)."""
    while multiprocessing.parent_process().is_alive():
        time.sleep(POLL_SECONDS)
    gone.set()
    # a real signal to the main thread wakes a blocking wait, which a flag (interrupt_main) would not
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    time.sleep(ENDING_GRACE_S)
    os._exit(1)  # still going (inside a call that never returns to Python): nobody is left to wait for it


def played_to_tensors(played: dict[int, tuple[list[Any], dict[str, float]]]) -> dict[str, torch.Tensor]:
    """Steps played ahead as a checkpoint's ``extra`` holds them: tensors only (it loads weights-only)."""
    from omrl.data import write_episodes

    out: dict[str, torch.Tensor] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for step, (episodes, metrics) in played.items():
            path = write_episodes(episodes, Path(tmp) / f"{step}.parquet")
            out[f"async_step_{step}_episodes"] = _bytes_tensor(path.read_bytes())
            out[f"async_step_{step}_metrics"] = _bytes_tensor(json.dumps(metrics).encode())
    return out


def played_from_tensors(extra: dict[str, Any]) -> dict[int, tuple[list[Any], dict[str, float]]]:
    """The inverse of :func:`played_to_tensors` (steps absent: none kept)."""
    from omrl.data.trajectory import read_episodes

    played = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key, value in extra.items():
            if key.startswith("async_step_") and key.endswith("_episodes"):
                step = int(key[len("async_step_") : -len("_episodes")])
                path = Path(tmp) / f"{step}.parquet"
                path.write_bytes(bytes(value.numpy()))
                metrics = json.loads(bytes(extra[f"async_step_{step}_metrics"].numpy()).decode())
                played[step] = (read_episodes(path), metrics)
    return played


def _bytes_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def tasks_played(played: dict[int, tuple[list[Any], dict[str, float]]], env: Any) -> dict[int, list[Any]]:
    """The tasks each step of ``played`` (steps a checkpoint kept as played ahead) played, in order:
    requested again, the generation process knows them as played."""
    mixed = is_mixture(env)
    return {step: list(dict.fromkeys(task_of(ep, mixed) for ep in episodes)) for step, (episodes, _) in played.items()}


def lag_metrics(episodes: list[Any], step: int, max_staleness: int) -> dict[str, float]:
    """How many versions behind the weights step ``step`` trains with its turns were sampled, mean
    and most (with partial rollouts a turn sampled after an update is behind by less than its
    episode's first)."""
    lags = [step - turn.info["weights_version"] for ep in episodes for turn in ep.turns]
    lags = lags or [step - version_for(step, max_staleness)]
    return {"weights_lag": sum(lags) / len(lags), "weights_lag_max": float(max(lags))}
