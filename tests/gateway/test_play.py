"""Agent episodes end to end: tasks from the dataset env, agents that fail, commands, scoring, the CLI."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from omrl.config import command_line_config
from omrl.config.options import RolloutRunConfig
from omrl.errors import ConfigError
from omrl.rollout import PlaySpec, RolloutSession
from omrl.training.metrics import read_metrics
from tests.helpers import cli_exit, invoke

HERE = Path(__file__).parent


@pytest.fixture
def questions(tmp_path):
    path = tmp_path / "qa.jsonl"
    rows = [{"question": f"What is {a} times {b}?", "answer": str(a * b)} for a, b in [(6, 7), (2, 3), (4, 5), (3, 3)]]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def session_for(questions, *overrides: str) -> RolloutSession:
    cfg = command_line_config(
        RolloutRunConfig,
        [
            f"plugins.dataset.path={questions}",
            "generation.max_new_tokens=24",
            "agent.timeout_s=20",
            *overrides,
        ],
        {"env.name": "dataset", "model.name": "tiny"},
    )
    return RolloutSession.from_config(cfg)


def test_agents_play_every_task_and_the_env_scores_their_answers(questions):
    with session_for(questions, "agent.callable=tests.gateway.agents:tool_loop") as session:
        episodes = session.play([0, 1], PlaySpec(split="train", group_size=2)).episodes
    assert [(ep.group, ep.sample, ep.task_id) for ep in episodes] == [(0, 0, 0), (0, 1, 0), (1, 0, 1), (1, 1, 1)]
    for ep in episodes:
        assert ep.end_reason == "done" and ep.turns and ep.turns[-1].done
        assert ep.turns[-1].info["ground_truth"] in ("42", "6")  # the dataset env scored the answer
        assert ep.rewards["goal"][-1] == ep.score
        assert ep.messages[0] == {"role": "system", "content": "Answer with a number."}
    assert "reward" in ep.turns[0].info or "won" in ep.turns[-1].info


@pytest.mark.parametrize(
    "agent, reason",
    [
        ("tests.gateway.agents:raises", "the agent raised ValueError: the agent's own bug"),
        ("tests.gateway.agents:never_calls", "the agent finished without calling the model"),
    ],
)
def test_an_agent_that_fails_is_an_env_error_never_a_score(questions, agent, reason):
    with session_for(questions, f"agent.callable={agent}") as session:
        episodes = session.play([0], PlaySpec(split="train", group_size=2)).episodes
    assert all(ep.end_reason == "env_error" and ep.error == reason for ep in episodes)
    assert all(set(ep.rewards["total"]) <= {0.0} for ep in episodes)


@pytest.mark.slow  # waits out a deadline of seconds
def test_an_agent_past_its_time_is_cut_off_and_its_key_refused(questions):
    import openai

    with session_for(questions, "agent.callable=tests.gateway.agents:hangs", "agent.timeout_s=3") as session:
        began = time.monotonic()
        (ep,) = session.play([0], PlaySpec(split="train")).episodes
        assert time.monotonic() - began < 30
        assert ep.end_reason == "env_error" and ep.error == "the agent did not finish within 3 s"
        gateway = session._gateway
        assert gateway.recorder is not None and not gateway._episodes  # every key refused now
        stale = openai.OpenAI(base_url=gateway.base_url, api_key="omrl-not-a-key", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            stale.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])


def test_a_reward_function_gives_named_components(questions):
    overrides = ["agent.callable=tests.gateway.agents:one_call", "agent.reward=tests.gateway.agents:length_reward"]
    with session_for(questions, *overrides) as session:
        played = session.play([0, 1], PlaySpec(split="train"))
        episodes, summary = played.episodes, played.rewards
    for ep in episodes:
        components = ep.turns[-1].info["agent_reward"]
        assert set(components) == {"words", "bonus"} and components["bonus"] == 0.5
        assert ep.rewards["total"][-1] == pytest.approx(components["words"] + 0.5)
    assert summary["bonus"] == 0.5 and set(summary) == {"words", "bonus", "total"}


def test_a_reward_function_is_given_what_its_parameters_name(questions):
    overrides = ["agent.callable=tests.gateway.agents:one_call", "agent.reward=tests.gateway.agents:result_only_reward"]
    with session_for(questions, *overrides) as session:
        (ep,) = session.play([0], PlaySpec(split="train")).episodes
    assert ep.turns[-1].info["agent_reward"]["is_text"] == 1.0  # the agent's text, not the task's mapping


def test_a_reward_function_that_raises_is_an_env_error(questions):
    overrides = ["agent.callable=tests.gateway.agents:one_call", "agent.reward=tests.gateway.agents:reward_raises"]
    with session_for(questions, *overrides) as session:
        (ep,) = session.play([0], PlaySpec(split="train")).episodes
    assert ep.end_reason == "env_error"
    assert ep.error == "the reward function raised RuntimeError: the reward function's own bug"


def test_a_reward_function_is_given_the_envs_ground_truth(questions):
    overrides = [
        "agent.command=" + f"{sys.executable} {HERE / 'agent_cmd.py'}",
        "agent.reward=tests.gateway.agents:truth_reward",
    ]
    with session_for(questions, *overrides) as session:
        episodes = session.play([0, 1], PlaySpec(split="train")).episodes
    # the command answers the prompt's last word ("7?" and "3?"): the truth is 42 and 6, so never right
    assert [ep.turns[-1].info["agent_result"] for ep in episodes] == ["{'answer': '7?'}", "{'answer': '3?'}"]
    assert [ep.rewards["total"][-1] for ep in episodes] == [0.0, 0.0]
    assert all(ep.end_reason == "done" and len(ep.turns) == 1 for ep in episodes)


def test_an_env_that_crashes_scoring_the_answer_is_an_env_error_even_with_a_reward_function():
    """The reward function would score the answer without the env's ground truth: never on a crashed env."""
    from omrl.data import Episode, Turn
    from omrl.gateway.play import AgentSpec, _score
    from tests.gateway.agents import truth_reward

    class GradingServerDown:
        def step(self, action):
            raise ConnectionError("the grading server is down")

    spec = AgentSpec(run=lambda *args: "42", command=None, reward=truth_reward)
    ep = Episode(
        env="dataset", task_id=0, split="train", instruction="", turns=[Turn("q", "42", "42", True, 0.0, True)]
    )
    assert _score(spec, GradingServerDown(), ep, {"id": 0, "split": "train"}, "42") is True  # the env is broken
    assert ep.end_reason == "env_error"
    assert ep.error == "the env could not score the agent's answer: ConnectionError: the grading server is down"
    assert "agent_reward" not in ep.turns[-1].info  # never scored


def test_an_env_whose_result_breaks_the_protocol_is_an_env_error_even_with_a_reward_function():
    from omrl.data import Episode, Turn
    from omrl.envs import StepResult
    from omrl.gateway.play import AgentSpec, _score
    from tests.gateway.agents import truth_reward

    class NanReward:
        def step(self, action):
            return StepResult("ok", float("nan"), True, {"ground_truth": "42"})

    spec = AgentSpec(run=lambda *args: "42", command=None, reward=truth_reward)
    ep = Episode(
        env="dataset", task_id=0, split="train", instruction="", turns=[Turn("q", "42", "42", True, 0.0, True)]
    )
    assert _score(spec, NanReward(), ep, {"id": 0, "split": "train"}, "42") is False
    assert ep.end_reason == "env_error" and "the env 'dataset' returned reward nan" in ep.error


def test_an_answer_given_as_a_number_is_the_answer_by_callable_or_result_file(questions, tmp_path):
    writes_42 = tmp_path / "writes_42.py"
    writes_42.write_text(
        "import os, pathlib, openai\n"
        "openai.OpenAI(max_retries=0).chat.completions.create(model='m', messages=[{'role': 'user', 'content': 'hi'}])\n"
        "pathlib.Path(os.environ['OMRL_RESULT_FILE']).write_text('42')\n"
    )
    for agent in [
        "agent.callable=tests.gateway.agents:answers_a_number",
        f"agent.command={sys.executable} {writes_42}",
    ]:
        with session_for(questions, agent) as session:
            (ep,) = session.play([0], PlaySpec(split="train")).episodes
        assert ep.turns[-1].info["ground_truth"] == "42" and ep.won, agent  # never the model's last reply


def test_a_reward_function_may_return_numpy_numbers():
    import numpy as np

    from omrl.gateway.agents import score

    components = score(lambda task, result: {"a": np.float32(0.5), "b": np.int64(1)}, {}, "42", [], 10.0)
    assert components == {"a": 0.5, "b": 1.0} and all(type(v) is float for v in components.values())


def test_a_number_a_reward_function_returns_is_named_for_the_function():
    """It was named "reward", and logged as reward_reward."""
    from omrl.gateway.agents import score

    def score_answer(result):
        return 1.0

    assert score(score_answer, {}, "42", [], 10.0) == {"score_answer": 1.0}
    assert score(lambda result: 0.5, {}, "42", [], 10.0) == {"score": 0.5}  # a lambda has no name to give


def test_a_command_agent_that_exits_non_zero_is_an_env_error(questions, tmp_path):
    crash = tmp_path / "crash.jsonl"
    crash.write_text(json.dumps({"question": "crash now", "answer": "1"}) + "\n")
    with session_for(crash, "agent.command=" + f"{sys.executable} {HERE / 'agent_cmd.py'}") as session:
        (ep,) = session.play([0], PlaySpec(split="train")).episodes
    assert ep.end_reason == "env_error"
    assert ep.error == "the agent command exited with 3: this agent cannot handle crashes"


def test_a_command_agent_killed_by_a_signal_is_named_so(questions):
    kill_itself = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    with session_for(questions, f"agent.command={sys.executable} -c '{kill_itself}'") as session:
        (ep,) = session.play([0], PlaySpec(split="train")).episodes
    assert ep.end_reason == "env_error"
    assert ep.error == "the agent command was killed by signal 9 (SIGKILL) (nothing on its stderr)"


@pytest.mark.parametrize(
    "overrides, named",
    [
        (["agent.callable=tests.gateway.agents"], "must be module:function"),
        (
            ["agent.callable=tests/gateway/agents.py:one_call"],
            "names a file; name its module: tests.gateway.agents:one_call",
        ),
        (["agent.callable=tests.gateway.nowhere:run"], "cannot import 'tests.gateway.nowhere'"),
        (["agent.callable=tests.gateway.agents:nothing"], "has no 'nothing'"),
        (["agent.reward=tests.gateway.agents:truth_reward"], "name the agent too"),
        (["agent.callable=tests.gateway.agents:one_call", "agent.command=python x.py"], "not both"),
        (["agent.callable=tests.gateway.agents:one_call", "agent.timeout_s=0"], "agent.timeout_s must be > 0"),
        (["agent.command=pythn agent.py"], "'pythn' is no program found here"),
        (["agent.callable='  '"], r"agent.callable is blank \('  '\)"),
        (
            ["agent.callable=tests.gateway.agents:one_call", "agent.reward=tests.gateway.agents:unnamed_reward"],
            r"takes t, r, which it would never be given; .* task, result, transcript by name",
        ),
    ],
)
def test_a_bad_agent_setting_is_refused_by_name(questions, overrides, named):
    with pytest.raises(ConfigError, match=named):
        session_for(questions, *overrides)


def test_the_commands_refuse_what_an_agent_cannot_play(questions, capsys):
    base = [
        "--env",
        "dataset",
        "--model",
        "tiny",
        f"plugins.dataset.path={questions}",
        "--agent",
        "tests.gateway.agents:one_call",
    ]
    for extra, named in [
        (["--expert"], "--expert plays the env's scripted expert"),
        (["--strategy", "beam"], "strategy 'beam'"),
        (["agent.sampling=mine"], "agent.sampling is 'mine'; valid: run, request"),
        (["--agent-cmd", " "], "--agent-cmd is blank"),
        (["--env", "gridworld:0.5,dataset:0.5"], "a mixture of envs is not supported"),
    ]:
        code, out, err = cli_exit(capsys, "rollout", *base, *extra)
        assert code == 2 and named in err, err


@pytest.mark.parametrize(
    "command", [["rollout", "--num-tasks", "2", "-o"], ["eval", "--split", "train", "--num-tasks", "2", "--output-dir"]]
)
def test_episodes_whose_agent_failed_are_said_to_have_failed_in_the_agent_not_the_env(
    questions, tmp_path, capsys, command
):
    out = tmp_path / ("out.parquet" if command[0] == "rollout" else "out")
    agent = ["--agent", "tests.gateway.agents:raises", "agent.timeout_s=20", "generation.max_new_tokens=8"]
    code, _, err = cli_exit(
        capsys, *command, str(out), "--env", "dataset", "--model", "tiny", *agent, f"plugins.dataset.path={questions}"
    )
    assert code == 2
    assert "failed in the agent (its program or its reward function)" in " ".join(err.split())
    assert "the agent raised ValueError: the agent's own bug" in err and "the env 'dataset'" not in err


def test_a_training_step_whose_every_agent_failed_stops_the_run_naming_the_agent(
    questions, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr("omrl.training.online_run.time.sleep", lambda seconds: None)  # its replays fail alike
    args = [
        "--env",
        "dataset",
        "--model",
        "tiny",
        "--agent",
        "tests.gateway.agents:raises",
        f"plugins.dataset.path={questions}",
    ]
    run = ["--output-dir", str(tmp_path / "run"), "steps=1", "tasks_per_step=1", "group_size=2", "eval_tasks=0"]
    code, _, err = cli_exit(capsys, "train", "--algo", "grpo", *args, *run, "generation.max_new_tokens=8")
    message = " ".join(err.split())
    assert code == 2
    assert "every episode failed in the agent (its program or its reward function) in 3 rollouts in a row" in message
    assert "fix the agent program or its reward function and run again" in message
    assert "env is back" not in message


@pytest.mark.slow  # a training run and an eval end to end
def test_eval_and_train_through_the_gateway(questions, tmp_path):
    agent = ["--agent", "tests.gateway.agents:tool_loop", "--reward", "tests.gateway.agents:length_reward"]
    common = [
        "--env",
        "dataset",
        "--model",
        "tiny",
        f"plugins.dataset.path={questions}",
        "plugins.dataset.test_fraction=0.5",
    ]
    result = invoke(
        "train",
        *common,
        *agent,
        "--steps",
        "2",
        "--output-dir",
        str(tmp_path / "run"),
        "tasks_per_step=2",
        "group_size=2",
        "generation.max_new_tokens=24",
        "eval_every=0",
    )
    assert result.exit_code == 0, result.output
    steps = read_metrics(tmp_path / "run")
    trained = [s for s in steps if "reward_words" in s]
    assert len(trained) == 2 and all(s["rows_per_episode"] >= 1 for s in trained)
    assert any(not s.get("skipped_update") for s in trained), trained  # the word counts differ: an update ran
    assert "--agent tests.gateway.agents:tool_loop --reward tests.gateway.agents:length_reward" in result.output
    report = tmp_path / "report.json"
    evaluated = invoke(
        "eval",
        *common,
        *agent,
        "--model",
        str(tmp_path / "run"),
        "--report",
        str(report),
        "--output-dir",
        str(tmp_path / "ev"),
    )
    assert evaluated.exit_code == 0, evaluated.output
    metrics = json.loads(report.read_text())["metrics"]
    assert metrics["episodes"] == 2 and metrics["env_errors"] == 0


def test_a_generation_server_serves_the_gateway_with_token_ids(questions, tiny_hf):
    """With the openai backend the calls pass through to a vLLM-like server as token ids; the ids it
    returns are the ids recorded."""
    from omrl.backends.hf import HFBackend
    from tests.backends.fake_openai import FakeOpenAIServer

    model, tokenizer = tiny_hf
    server = FakeOpenAIServer(HFBackend(model, tokenizer), tokenizer).start()
    try:
        overrides = [
            "agent.callable=tests.gateway.agents:tool_loop",
            "generation.backend=openai",
            f"generation.base_url={server.base_url}",
        ]
        with session_for(questions, *overrides) as session:
            episodes = session.play([0, 1], PlaySpec(split="train")).episodes
    finally:
        server.stop()
    turns = [turn for ep in episodes for turn in ep.turns]
    assert turns and all(turn.info["rollout"]["token_exact"] for turn in turns)
    prompts = [body["prompt"] for path, body in server.requests if path.endswith("/completions") and "chat" not in path]
    assert len(prompts) == len(turns) and all(
        isinstance(p, list) and all(isinstance(i, int) for i in p) for p in prompts
    )
    for ep in episodes:  # each turn's prompt is the row's ids up to it, as sent
        for turn in ep.turns:
            row = max(s for s in [0, *ep.row_starts] if s <= turn.span[0])
            assert ep.token_ids[row : turn.span[0]] in prompts


def test_agent_signatures_that_cannot_take_the_call_are_refused_before_the_run():
    """def run(base_url, api_key) got the task as its base_url: 'got multiple values for argument', after the
    model loaded and, in train, after three replays."""
    from omrl.gateway.agents import check_agent

    def no_task(base_url, api_key): ...
    def needs_client(task, base_url, api_key, client): ...
    def starred(*args, **kwargs): ...
    async def usual(task, base_url, api_key, model="policy"): ...

    with pytest.raises(ConfigError, match=r"'m:no_task' takes no task before .* no_task\(task, base_url=\.\.\."):
        check_agent(no_task, "m:no_task")
    with pytest.raises(ConfigError, match="'m:f' takes client, which it would never be given"):
        check_agent(needs_client, "m:f")
    with pytest.raises(ConfigError, match="takes no task"):
        check_agent(lambda: None, "m:f")
    assert check_agent(starred, "m:f") and check_agent(usual, "m:f") and check_agent(lambda task: 1, "m:f")


@pytest.mark.parametrize("key, value, valid", [("max_calls", 0, ">= 1"), ("max_parallel", -1, ">= 0")])
def test_agent_limits_out_of_range_are_refused(key, value, valid):
    from omrl.config import command_line_config
    from omrl.config.options import RolloutRunConfig

    with pytest.raises(ConfigError, match=rf"agent.{key}. must be {valid}, got {value}"):
        command_line_config(RolloutRunConfig, [f"agent.{key}={value}"], {})


def test_reward_signatures_and_file_names_are_checked_before_the_run(tmp_path, monkeypatch):
    from omrl.gateway.agents import check_reward, load_callable

    with pytest.raises(ConfigError, match="takes task, which it would never be given"):
        check_reward(lambda task=None, /: 1.0, "m:f")  # positional-only: never given by name
    assert check_reward(lambda result, extra=3: 1.0, "m:f")  # a default it keeps
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ConfigError, match=r"names a file; name its module, agents:run, with its folder /\S+ on PYTHONPATH"
    ):
        load_callable("/elsewhere/agents.py:run", "agent.callable")
    with pytest.raises(ConfigError, match="names a file; name its module: pkg.agents:run"):
        load_callable("pkg/agents.py:run", "agent.callable")
