"""Fault injection into a whole training run, over two seeds: env steps that hang or raise, a reward
function (a judge) that hangs. Every episode is accounted for, nothing the world broke is trained on,
every failure is named, and nothing is left running."""

from __future__ import annotations

import hashlib
import threading

import pytest

from omrl.data import read_episodes
from omrl.envs import Env, EnvError, Observation, StepResult
from omrl.hookspecs import hookimpl
from omrl.templates import ParsedAction, Template
from omrl.training.metrics import read_metrics
from omrl.training.rl import run_rl
from tests.training.helpers import gridworld_config

RELEASE = threading.Event()  # what every hung call waits for: set when the test ends


def fault(seed: int, task: int, turn: int) -> str:
    """The fault this (seed, task, turn) injects: hang, raise, or none; fixed by the seed, varied by the task."""
    roll = hashlib.sha256(f"{seed}-{task}-{turn}".encode()).digest()[0] % 8
    return {0: "hang", 1: "raise"}.get(roll, "")


class FlakyEnv(Env):
    """Two steps to a win, whatever the reply; some steps hang (a server that never answers) or raise."""

    max_turns = 2
    action_help = "Reply with anything."

    def __init__(self, seed: int = 0):
        self.seed, self.task, self.turn = seed, 0, 0

    def task_ids(self, split):
        return range(40)

    def reset(self, task_id):
        self.task, self.turn = task_id, 0
        return Observation(f"Room {task_id}.", "Reach the goal.")

    def step(self, action):
        self.turn += 1
        what = fault(self.seed, self.task, self.turn)
        if what == "hang":
            RELEASE.wait(120)
        if what == "raise":
            raise EnvError(f"server 500 on task {self.task}")
        done = self.turn == 2
        return StepResult("You moved.", float(done), done, {"won": done, "score": float(done)})


class AnyReply(Template):
    """Every reply is an action (the random tiny model's replies reach the env)."""

    def system_prompt(self, env):
        return "Act."

    def parse(self, response, env):
        return ParsedAction(response.strip() or "wait", True)

    def format_action(self, action, env, thought=""):
        return action


class Faults:
    """The plugin: the flaky env, the template, and a judge that hangs on its first call of a run."""

    def __init__(self):
        self.judged = 0

    @hookimpl
    def register_envs(self, register):
        register("flaky", FlakyEnv)

    @hookimpl
    def register_templates(self, register):
        register("any-reply", AnyReply)

    @hookimpl
    def register_rewards(self, register):
        def judge(episodes):
            """A judge endpoint that answers the sample's index, except its first call, which never returns."""
            self.judged += 1
            if self.judged == 1:
                RELEASE.wait(120)
            return [[0.0] * (len(ep.turns) - 1) + [float(ep.sample)] for ep in episodes]

        register("slow_judge", judge)


@pytest.fixture
def faults(register_plugin, monkeypatch):
    from omrl.training import rollout_health

    monkeypatch.setattr(rollout_health, "ENV_FAILURE_WAIT", 0.1)  # the replay of a step the judge failed: no 5 s wait
    RELEASE.clear()
    plugin = register_plugin(Faults(), name="faults")
    yield plugin
    RELEASE.set()


@pytest.mark.slow  # a soak: faults injected into whole training runs
@pytest.mark.parametrize("seed", [0, 1])
def test_a_run_under_stalls_and_failures_accounts_for_every_episode(faults, tiny_model_dir, tmp_path, seed):
    threads_before = set(threading.enumerate())
    out = tmp_path / "run"
    cfg = gridworld_config(
        tiny_model_dir,
        out,
        "env.name=flaky",
        "env.template=any-reply",
        f"plugins.flaky.seed={seed}",
        "reward.weights={slow_judge: 1.0}",
        "steps=3",
        "tasks_per_step=4",
        "group_size=2",
        "max_env_error_rate=1.0",
        "deadlines.env_step_s=0.5",
        "deadlines.reward_s=1.0",
        "deadlines.heartbeat_s=0",
    )
    run_rl(cfg)

    steps = [read_episodes(out / "rollouts" / f"step-{n:08d}.parquet") for n in (1, 2, 3)]
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for played, logged in zip(steps, metrics):
        assert len(played) == 4 * 2  # nothing lost: every sample of every task
        failed = [ep for ep in played if ep.end_reason == "env_error"]
        assert logged["env_errors"] == len(failed)
        for ep in failed:  # named, and never trained on
            assert "did not finish within deadlines" in ep.error or "server 500" in ep.error, ep.error
            assert not ep.advantages
        for ep in played:
            if ep.end_reason != "env_error":
                assert ep.advantages, "a played episode is trained on"
    # the judge hung on step 1's first play: every episode of it dropped, so the step was played again
    # (a step with no episode played is not counted), and its logged play is the second one
    stalls = sorted(path.name for path in (out / "stalls").iterdir())
    assert any("-reward-" in name for name in stalls) and faults.judged > 1
    played = [ep for step in steps for ep in step]
    assert any("deadlines.env_step_s=0.5" in (ep.error or "") for ep in played)  # a hang was injected and caught
    assert any(ep.end_reason != "env_error" for ep in played)
    RELEASE.set()  # the calls left behind return; no thread of the run outlives it
    for thread in set(threading.enumerate()) - threads_before:
        if not thread.name.startswith("omrl"):  # a library's own (tqdm's monitor)
            continue
        thread.join(timeout=10)
        assert not thread.is_alive(), thread.name


SEED = {"value": 0}  # the fault seed of the agent run under test (the agent runs in this process)


def flaky_agent(task, base_url, api_key):
    """An `openai` agent that, by its task, hangs past agent.timeout_s, raises, or answers after one call."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    reply = client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": task["prompt"]}], max_tokens=6
    )
    number = int(task["prompt"].split()[-1].rstrip("."))  # "Say 7."
    what = fault(SEED["value"], number, 1)
    if what == "hang":
        RELEASE.wait(60)
    if what == "raise":
        raise RuntimeError(f"the agent's own bug on {number}")
    return reply.choices[0].message.content


@pytest.mark.slow  # a soak: faults injected into whole training runs
@pytest.mark.parametrize("seed", [0, 1])
def test_a_run_of_agents_that_hang_or_raise_accounts_for_every_episode(tmp_path, seed):
    import json

    from tests.helpers import invoke

    SEED["value"] = seed
    RELEASE.clear()
    questions = tmp_path / "qa.jsonl"
    questions.write_text("".join(json.dumps({"question": f"Say {n}.", "answer": str(n)}) + "\n" for n in range(12)))
    out = tmp_path / "run"
    try:
        result = invoke(
            *("train", "--algo", "grpo", "--env", "dataset", "--model", "tiny", "--steps", "2"),
            *("--agent", "tests.training.test_stall_faults:flaky_agent", "--output-dir", str(out)),
            f"plugins.dataset.path={questions}",
            *("tasks_per_step=4", "group_size=2", "eval_tasks=0", "max_env_error_rate=1.0", "agent.timeout_s=3"),
        )
    finally:
        RELEASE.set()
    assert result.exit_code == 0, result.output
    steps = [read_episodes(out / "rollouts" / f"step-{n:08d}.parquet") for n in (1, 2)]
    for played, logged in zip(steps, read_metrics(out)):
        assert len(played) == 4 * 2  # nothing lost
        failed = [ep for ep in played if ep.end_reason == "env_error"]
        assert logged["env_errors"] == len(failed)
        for ep in failed:  # named, and never trained on
            assert "agent" in ep.error and ("3 s" in ep.error or "own bug" in ep.error), ep.error
            assert not ep.advantages
        assert all(ep.advantages for ep in played if ep.end_reason != "env_error")
    assert any(ep.end_reason == "env_error" for step in steps for ep in step)  # a fault was injected and caught
