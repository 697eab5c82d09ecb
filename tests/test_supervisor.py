"""The stall supervisor: a hang injected into each stage is named, its stacks written, and dropped,
played again or stopped as the run says; the process never waits forever."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from omrl.config.options import DeadlineConfig
from omrl.errors import ConfigError
from omrl.rewards import compose_rewards
from omrl.rollout import EnvPool, RolloutLimits, collect
from omrl.supervisor import StageStalled, stage, supervise
from omrl.training.metrics import read_metrics
from tests.fakes import ActionTemplate, KeyEnv, ScriptedBackend

QUICK = dict(grace_s=5.0, heartbeat_s=0.0)


def deadlines(**seconds: float) -> DeadlineConfig:
    return DeadlineConfig(**{**QUICK, **seconds})


class HangingKeys(KeyEnv):
    """KeyEnv whose step (or reset) on ``hang_task`` never returns, the first ``hangs`` times."""

    hangs_left = 0
    release = threading.Event()

    def __init__(self, hang_task: int = 1, hang_in: str = "step", **kw):
        super().__init__(**kw)
        self.hang_task, self.hang_in = hang_task, hang_in

    def _maybe_hang(self, where: str, task: int) -> None:
        if where == self.hang_in and task == self.hang_task and HangingKeys.hangs_left:
            HangingKeys.hangs_left -= 1
            HangingKeys.release.wait(60)  # a server that never answers (set by the test's end)

    def reset(self, task_id):
        self._maybe_hang("reset", task_id)
        return super().reset(task_id)

    def step(self, action):
        self._maybe_hang("step", self.task)
        return super().step(action)


class IOHangingKeys(HangingKeys):
    io_bound = True


@pytest.fixture
def hangs():
    HangingKeys.release.clear()
    HangingKeys.hangs_left = 1
    yield
    HangingKeys.release.set()


def open_then_take(tokenizer):
    return ScriptedBackend(tokenizer, lambda call, index, prompt: ["Action: open", "Action: take key"][call % 2])


def play(tokenizer, env_class, tasks=(0, 1, 2), options=None, backend=None):
    pool = EnvPool(env_class, options, name="keys")
    episodes = collect(
        pool,
        ActionTemplate(),
        tokenizer,
        list(tasks),
        backend=backend or open_then_take(tokenizer),
        limits=RolloutLimits(max_new_tokens=24, max_context=1024),
    )
    return episodes


@pytest.mark.parametrize("env_class", [HangingKeys, IOHangingKeys], ids=["in-process", "io-bound"])
@pytest.mark.parametrize("hang_in", ["step", "reset"])
def test_an_env_that_hangs_drops_only_its_episode_named_with_its_stacks(
    tiny_tokenizer, tmp_path, hangs, env_class, hang_in
):
    started = time.monotonic()
    with supervise(deadlines(env_step_s=0.5, env_reset_s=0.5), tmp_path, warn=lambda text: None):
        episodes = play(tiny_tokenizer, env_class, options={"hang_in": hang_in})
    assert time.monotonic() - started < 20
    ends = {ep.task_id: ep.end_reason for ep in episodes}
    assert ends == {0: "done", 1: "env_error", 2: "done"}
    error = next(ep.error for ep in episodes if ep.task_id == 1)
    assert f"deadlines.env_{hang_in}_s=0.5" in error and "task 1 sample 0" in error and "env keys" in error
    (dump,) = (tmp_path / "stalls").iterdir()
    assert "_maybe_hang" in dump.read_text()  # the stuck thread's own stack


def test_on_stall_retry_plays_the_episode_again_on_another_instance(tiny_tokenizer, tmp_path, hangs):
    with supervise(deadlines(env_step_s=0.5, on_stall="retry"), tmp_path, warn=lambda text: None):
        episodes = play(tiny_tokenizer, HangingKeys)
    assert [(ep.task_id, ep.end_reason, ep.won) for ep in episodes] == [(t, "done", True) for t in (0, 1, 2)]


def test_on_stall_stop_stops_the_rollout(tiny_tokenizer, tmp_path, hangs):
    with supervise(deadlines(env_step_s=0.5, on_stall="stop"), tmp_path, warn=lambda text: None):
        with pytest.raises(StageStalled, match="an env step .* did not finish within deadlines.env_step_s=0.5"):
            play(tiny_tokenizer, HangingKeys)


def test_a_generate_call_that_hangs_stops_the_run(tiny_tokenizer, tmp_path):
    def stuck(call, index, prompt):
        time.sleep(60)

    with supervise(deadlines(generate_s=0.5), tmp_path, warn=lambda text: None):
        with pytest.raises(StageStalled, match=r"a generate call did not finish within deadlines.generate_s=0.5"):
            play(tiny_tokenizer, KeyEnv, backend=ScriptedBackend(tiny_tokenizer, stuck))


def test_a_reward_function_that_hangs_drops_its_episodes_never_scoring_them(register_plugin, tmp_path):
    from omrl.data import Episode, Turn
    from omrl.hookspecs import hookimpl

    class SlowJudge:
        @hookimpl
        def register_rewards(self, register):
            register("slow_judge", lambda episodes: time.sleep(60))

    register_plugin(SlowJudge(), name="slow-judge")
    eps = [
        Episode(
            env="keys",
            task_id=t,
            split="train",
            instruction="",
            won=True,
            score=1.0,
            turns=[Turn("o", "r", "a", True, 0.0, True)],
        )
        for t in range(2)
    ]
    with supervise(deadlines(reward_s=0.5), tmp_path, warn=lambda text: None):
        means = compose_rewards(eps, {"goal": 1.0, "slow_judge": 1.0})
    assert [ep.end_reason for ep in eps] == ["env_error", "env_error"]
    assert "reward 'slow_judge'" in eps[0].error and "deadlines.reward_s=0.5" in eps[0].error
    assert eps[0].rewards["total"] == [0.0] and means["total"] == 0.0


def test_on_stall_retry_calls_a_stalled_reward_once_more(register_plugin, tmp_path):
    """retry is documented for a reward stage too: it dropped the episodes at once, never calling again."""
    from omrl.data import Episode, Turn
    from omrl.hookspecs import hookimpl

    calls = []

    class SlowOnce:
        @hookimpl
        def register_rewards(self, register):
            def slow_once(episodes):
                calls.append(len(episodes))
                if len(calls) == 1:
                    time.sleep(60)
                return [[0.5] for _ in episodes]

            register("slow_once", slow_once)

    register_plugin(SlowOnce(), name="slow-once")
    eps = [
        Episode(env="keys", task_id=t, split="train", instruction="", turns=[Turn("o", "r", "a", True, 0.0, True)])
        for t in range(2)
    ]
    with supervise(deadlines(reward_s=0.5, on_stall="retry"), tmp_path, warn=lambda text: None):
        means = compose_rewards(eps, {"slow_once": 1.0})
    assert calls == [2, 2] and [ep.end_reason for ep in eps] == ["done", "done"]
    assert means["total"] == 0.5 and eps[0].rewards["slow_once"] == [0.5]


def test_a_reward_of_numpy_float32_is_a_number(register_plugin):
    """The env protocol takes numpy's numbers; a reward's np.float32 was refused as 'not a finite float'."""
    import numpy as np

    from omrl.data import Episode, Turn
    from omrl.hookspecs import hookimpl

    class Numpy:
        @hookimpl
        def register_rewards(self, register):
            register("numpy_half", lambda episodes: [[np.float32(0.5)] for _ in episodes])

    register_plugin(Numpy(), name="numpy-half")
    ep = Episode(env="keys", task_id=0, split="train", instruction="", turns=[Turn("o", "r", "a", True, 0.0, True)])
    assert compose_rewards([ep], {"numpy_half": 2.0})["total"] == 1.0


def test_a_blocking_read_on_the_main_thread_is_broken_with_the_stage_named(tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    client = socket.create_connection(server.getsockname())  # a server that accepts and never answers
    warned = []
    with supervise(deadlines(env_step_s=0.3), tmp_path, warn=warned.append) as supervisor:
        supervisor.step = 7
        with pytest.raises(StageStalled, match="step 7, env web, episode task 3"):
            with stage("env_step", env="web", episode="task 3"):
                client.recv(10)
    client.close()
    server.close()
    assert warned and "every thread's stack is in" in warned[0]


def test_a_stage_within_its_deadline_is_untouched_and_counted_in_the_heartbeat(tmp_path):
    with supervise(deadlines(env_step_s=5.0), tmp_path, warn=lambda text: None) as supervisor:
        for _ in range(3):
            with stage("env_step", env="keys"):
                time.sleep(0.01)
        supervisor.beat()
    beat = json.loads((tmp_path / "heartbeat.json").read_text())
    assert beat["stages"]["env_step"]["done"] == 3 and beat["stages"]["env_step"]["stalled"] == 0
    assert beat["open"] == [] and not (tmp_path / "stalls").exists()


def test_a_stuck_run_writes_heartbeats_to_metrics_jsonl_that_step_readers_skip(tmp_path):
    from omrl.config.options import LoggingConfig
    from omrl.training.metrics import MetricsLogger

    with MetricsLogger(tmp_path, LoggingConfig(tensorboard=False), total_steps=3) as logger:
        logger.log(1, {"loss": 1.0})
        watch = supervise(
            deadlines(env_step_s=30.0, heartbeat_s=0.1), tmp_path, warn=lambda t: None, heartbeat=logger.heartbeat
        )
        with watch, stage("env_step", env="keys", episode="task 0"):
            time.sleep(0.6)  # a slow step: no step line, so heartbeats
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]
    beats = [r["heartbeat"] for r in read_metrics(tmp_path, heartbeats=True) if "heartbeat" in r]
    assert beats and beats[-1]["open"][0]["stage"] == "env_step" and beats[-1]["open"][0]["episode"] == "task 0"


def test_code_python_cannot_interrupt_ends_the_process_with_status_2_after_the_grace(tmp_path):
    script = textwrap.dedent(
        f"""
        import threading, time
        from omrl.config.options import DeadlineConfig
        from omrl.supervisor import stage, supervise

        def stuck():
            with stage("env_step", env="keys", episode="task 5"):
                time.sleep(120)  # on a thread no one waits for with a bound: the signal cannot reach it

        with supervise(DeadlineConfig(env_step_s=0.3, grace_s=0.5, heartbeat_s=0), {str(tmp_path)!r}):
            worker = threading.Thread(target=stuck)
            worker.start()
            worker.join()
        print("finished")
        """
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "finished" not in done.stdout
    assert "did not give way within deadlines.grace_s=0.5" in done.stderr and "task 5" in done.stderr
    assert time.monotonic() - started < 30
    assert json.loads((tmp_path / "heartbeat.json").read_text())["open"][0]["stalled"] is True


@pytest.mark.slow
def test_a_stage_stuck_in_c_code_holding_the_gil_ends_the_process_with_its_stacks_written(tmp_path):
    # a catastrophic regex never gives the GIL back: the watchdog thread cannot run, faulthandler's timer can
    script = textwrap.dedent(
        f"""
        import re
        from omrl.config.options import DeadlineConfig
        from omrl.supervisor import stage, supervise

        with supervise(DeadlineConfig(env_step_s=0.3, grace_s=0.5, heartbeat_s=0), {str(tmp_path)!r}):
            with stage("env_step", env="textenv", episode="task 5"):
                re.match(r"(a+)+$", "a" * 60 + "b")
        print("finished")
        """
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=15)
    assert done.returncode == 1 and "finished" not in done.stdout
    assert time.monotonic() - started < 15
    (stacks,) = (tmp_path / "stalls").glob("held-gil-*.txt")
    text = stacks.read_text()
    assert "held Python's lock (the GIL)" in text and "<string>" in text and "most recent call first" in text


def test_the_backstop_is_disarmed_and_its_file_removed_when_stages_end_in_time(tmp_path):
    import faulthandler

    with supervise(deadlines(env_step_s=0.2, grace_s=0.1), tmp_path) as watcher:
        with stage("env_step", env="keys", episode="task 0"):
            assert watcher._backstop_at is not None
        assert watcher._backstop_at is None
        time.sleep(0.5)  # past where the backstop would have fired
    assert not list((tmp_path / "stalls").glob("held-gil-*.txt"))
    faulthandler.cancel_dump_traceback_later()


def test_bad_deadlines_are_refused_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"deadlines.env_step_s must be a number of seconds >= 0"):
        with supervise(deadlines(env_step_s=-1), tmp_path):
            pass
    with pytest.raises(ConfigError, match="unknown deadlines.on_stall 'skip'; valid: drop, retry, stop"):
        with supervise(deadlines(on_stall="skip"), tmp_path):
            pass
