"""The ``code`` env family: a sandboxed python tool beside a task env, its failures sorted by whose they are."""

from __future__ import annotations

import re
import secrets
import stat
import time
from pathlib import Path

import pytest

from omrl import registry
from omrl.envs import EnvError, EpisodeFinishedError, create_env
from omrl.errors import ConfigError
from omrl.evaluation import tool_use
from omrl.models import load_model
from omrl.rollout import EnvPool, RolloutLimits, collect
from omrl.sandbox import run as sandbox
from omrl.training.rl_data import trainable
from omrl_plugins.envs.code import python_tool
from omrl_plugins.envs.code.env import expression_in
from omrl_plugins.envs.code.python_tool import acquire_pool
from omrl_plugins.envs.tooling import ToolEnv, ToolResult
from tests.chat.thinking import TOOL_ROLE, ForcedBackend, build_qwen3_like
from tests.sandbox.test_sandbox import README, attempts, needs_sandbox, outcomes

pytestmark = needs_sandbox
NAME = "code:reasoning-gym:chain_sum"


def build(name: str = NAME, **options):
    return create_env(registry.envs.get(name), {"warm": 0, **options}, name)


def test_the_expert_computes_with_the_tool_and_its_answer_is_scored_by_the_dataset():
    env = build()
    try:
        first = env.reset(3)
        assert [tool["name"] for tool in env.tools] == ["answer", "python"]
        expression = expression_in(first.text)
        call = env.step(env.expert_action())
        assert env.expert_action() == f"answer[{eval(expression)}]"  # noqa: S307 - the test's own arithmetic
        assert call.observation == f"{eval(expression)}\n" and not call.done  # noqa: S307
        assert call.info == {"won": False, "score": 0.0, "tool": "python", "tool_error": False}
        final = env.step(env.expert_action())
        assert final.done and final.won and final.reward == 1.0
        env.reset(3)
        assert not env.step("answer[12345678]").won  # a wrong answer scores 0
    finally:
        env.close()


@pytest.mark.slow  # sandboxed processes, seconds each
def test_a_failing_call_is_the_agents_turn_and_the_episode_goes_on():
    env = build(max_calls=2)
    try:
        env.reset(0)
        bad = env.step("python[1 / 0]")
        assert bad.info["tool_error"] and "ZeroDivisionError" in bad.observation and not bad.done
        slow = env.step("python[while True: pass]")
        assert slow.info["tool_error"] and "ran past" in slow.observation
        spent = env.step("python[print(1)]")
        assert spent.info["invalid"] and "No tool calls left" in spent.observation and not spent.done
        assert env.step("answer[0]").done
    finally:
        env.close()


def test_whatever_the_code_writes_is_a_tool_error_of_the_agent_never_an_env_error():
    """Megabytes of output are cut and the interpreter keeps its variables; bytes written to the
    interpreter's own reply channel stop it, and the episode goes on with a new one."""
    env = build(persistent=True, max_calls=5)
    try:
        env.reset(0)
        env.step("python[x = 41]")
        flood = env.step("python[big = 'x' * (8 * 2**20 - 2)\nprint(big)\nprint('tail' * 10)]")
        assert not flood.info["tool_error"] and "stdout was 8,388,648 bytes; only its first" in flood.observation
        assert len(flood.observation) < 2000 + 200 and env.step("python[x]").observation == "41\n"
        deep = env.step("python[import os\nos.write(4, b'[' * 3000 + bytes((93,)) * 3000 + b'\\n')]")
        assert deep.info["tool_error"] and "reply channel" in deep.observation and not deep.done
        assert "NameError" in env.step("python[x]").observation  # a new interpreter
    finally:
        env.close()


def test_each_call_is_fresh_unless_the_interpreter_is_persistent():
    for persistent, seen in ((False, "NameError"), (True, "41")):
        env = build(persistent=persistent)
        try:
            env.reset(0)
            env.step("python[x = 41]")
            assert seen in env.step("python[x]").observation
            env.reset(1)  # a new episode never sees the last one's variables
            assert "NameError" in env.step("python[x]").observation
        finally:
            env.close()


def test_code_sent_through_the_tool_cannot_escape(tmp_path):
    token = secrets.token_hex(16)
    (tmp_path / "secret.txt").write_text(token)
    tmp_path.chmod(0o777)
    code = attempts(
        f"readme: open({str(README)!r}).read()",
        f"secret: print(open({str(tmp_path / 'secret.txt')!r}).read())",
        f"write: open({str(tmp_path / 'pwned')!r}, 'w').write('x')",
        "internet: socket.create_connection(('1.1.1.1', 53), timeout=3)",
        "root: os.setuid(0)",
    )
    env = build(persistent=True)
    try:
        env.reset(0)
        result = env.step(f"python[{code}]")
    finally:
        env.close()
    assert token not in result.observation
    assert outcomes(type("R", (), {"stdout": result.observation})) == {
        "readme": "FileNotFoundError",
        "secret": "FileNotFoundError",
        "write": "FileNotFoundError",
        "internet": "OSError",
        "root": "PermissionError",
    }
    assert list(tmp_path.iterdir()) == [tmp_path / "secret.txt"]


@pytest.mark.parametrize(
    "options, named",
    [
        ({"memory_mb": 64}, "memory_mb=64 is invalid; valid: 128 or more"),
        ({"timeout_s": "fast"}, "timeout_s must be a positive number, got 'fast'"),
        ({"persistent": "maybe"}, "persistent='maybe' is invalid; valid: true or false"),
        ({"max_calls": 0}, "max_calls (tool calls an episode may make) must be 1 or more, got 0"),
    ],
)
def test_an_option_no_sandbox_can_run_with_is_refused_when_the_env_is_built(options, named):
    """Not every episode's env_error (a config mistake counted as the world's), nor a crash as an omrl bug."""
    with pytest.raises(ConfigError, match=re.escape(named)):
        build(**options)


@pytest.mark.parametrize(
    "options, named",
    [
        ({"options": 5}, "code option options=5 is invalid; valid: a mapping of the wrapped env's options"),
        ({"env": 5}, "code option env=5 is invalid; valid: the name of the env to wrap"),
        ({"warm": 2.5}, "warm=2.5 is invalid; valid: a whole number"),  # was "must be 0 or more, got 2.5"
        (
            {"env": "code"},
            "tool name(s) python clash with the wrapped env CodeEnv's own tools and actions (answer, python)",
        ),
    ],
)
def test_a_wrapped_env_that_cannot_be_is_a_config_error(options, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        create_env(registry.envs.get("code"), {"warm": 0, **options}, "code")


@pytest.mark.parametrize("options", [{"max_calls": 0}, {"env": "code"}])
def test_a_constructor_that_fails_leaves_no_sandbox_started(monkeypatch, options):
    taken = []

    def spy(size, limits):
        key, pool = acquire_pool(size, limits)
        taken.append(pool)
        return key, pool

    monkeypatch.setattr(python_tool, "acquire_pool", spy)
    pools = dict(python_tool._pools)
    with pytest.raises(ConfigError):
        create_env(registry.envs.get("code"), {"warm": 2, **options}, "code")
    assert taken and python_tool._pools == pools  # every pool it took was given back
    for pool in taken:
        pool._thread.join(30)  # its refill thread ends once the pool is closed, killing what it started
        assert pool._closed and not pool._thread.is_alive() and not pool._ready


def test_a_host_without_the_sandbox_is_refused_before_any_code_runs(monkeypatch):
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    with pytest.raises(ConfigError, match="python tool cannot run here: .*needs root"):
        build()


def test_a_sandbox_that_cannot_start_ends_the_episode_as_env_error_never_trained_on(
    monkeypatch, tmp_path, tiny_model_dir
):
    fake = tmp_path / "unshare"  # what unshare does in a container that forbids namespaces
    fake.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = build()
    env.reset(0)
    monkeypatch.setattr(sandbox.shutil, "which", lambda *a, **k: str(fake))
    with pytest.raises(EnvError, match="python sandbox could not start.*Operation not permitted"):
        env.step("python[print(1)]")
    env.close()

    model, tokenizer = load_model(tiny_model_dir)
    template = registry.templates.get("react")()
    backend = ForcedBackend(model, tokenizer, lambda call, i, p: "Think: add.\nAct: python[print(2 + 2)]")
    episodes = collect(
        EnvPool(registry.envs.get(NAME), {"warm": 0}, name=NAME),
        template,
        tokenizer,
        [0, 1],
        backend=backend,
        limits=RolloutLimits(max_new_tokens=64),
    )
    assert [ep.end_reason for ep in episodes] == ["env_error", "env_error"]
    assert all("Operation not permitted" in ep.error for ep in episodes)
    assert trainable(episodes) == []


def test_native_tool_calls_run_the_code_and_answer_with_a_tool_message(tmp_path):
    model_dir = build_qwen3_like(tmp_path / "qwen3", TOOL_ROLE)
    model, tokenizer = load_model(str(model_dir))
    template = registry.templates.get("tool_call")()
    env_class = registry.envs.get(NAME)
    probe = create_env(env_class, {"warm": 0}, NAME)
    probe.reset(0)
    expression = expression_in(probe.reset(0).text)
    probe.close()
    actions = [f"python[print({expression})]", f"answer[{eval(expression)}]"]  # noqa: S307
    backend = ForcedBackend(
        model, tokenizer, lambda call, i, p: template.format_action(actions[min(call, 1)], probe, "Compute it.")
    )
    [ep] = collect(
        EnvPool(env_class, {"warm": 0}, name=NAME),
        template,
        tokenizer,
        [0],
        backend=backend,
        limits=RolloutLimits(max_new_tokens=128, max_context=4096),
    )
    assert ep.won and [m["role"] for m in ep.messages[1:]] == ["user", "assistant", "tool", "assistant"]
    assert ep.messages[2]["tool_calls"][0]["function"] == {
        "name": "python",
        "arguments": {"code": f"print({expression})"},
    }
    assert ep.messages[3]["content"] == f"{eval(expression)}\n"  # noqa: S307
    assert tool_use([ep]) == {"tool_call_rate": 1.0, "tool_calls_per_episode": 1.0, "valid_tool_call_rate": 1.0}


def test_the_warm_sandboxes_end_when_the_last_env_using_them_closes():
    first, second = build(warm=2), build(warm=2)
    pool = first.own_tools["python"].pool
    assert second.own_tools["python"].pool is pool  # one pool per process for the same settings
    deadline = time.monotonic() + 20
    while len(pool._ready) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [interpreter.proc.pid for interpreter in pool._ready]
    assert len(pids) == 2 and all(Path(f"/proc/{pid}").exists() for pid in pids)
    first.close()
    assert all(Path(f"/proc/{pid}").exists() for pid in pids)  # still in use by the second env
    second.close()
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)


def test_code_wraps_any_env_by_name_here_a_gem_task_scored_by_gem():
    env = create_env(registry.envs.get("code"), {"env": "gem:rg:products", "warm": 0}, "code")
    try:
        question = env.reset(env.task_ids("test")[0]).text
        computed = env.step(f"python[print({expression_in(question)})]").observation.strip()
        assert computed == str(eval(expression_in(question)))  # noqa: S307
        assert env.step(f"answer[\\boxed{{{computed}}}]").won
    finally:
        env.close()


def test_after_the_answer_ends_the_episode_no_tool_call_runs():
    env = build()
    try:
        with pytest.raises(EpisodeFinishedError):
            env.step("python[print(1)]")  # before any reset
        env.reset(0)
        assert env.step("answer[0]").done
        with pytest.raises(EpisodeFinishedError, match="episode is over"):
            env.step("python[print(1)]")
        env.reset(1)
        assert env.step("python[print(1)]").observation == "1\n"
    finally:
        env.close()


def test_a_call_cut_off_before_its_bracket_is_neither_run_nor_scored():
    env = build()
    try:
        env.reset(0)
        cut = env.step("python[\n```\nprint(1663 * 5242")
        assert not cut.done and cut.info["tool_error"] and "no closing `]`" in cut.observation
        assert env.calls == 0  # not a call: the budget is intact
        assert env.step("answer[0]").done  # the episode went on to its answer
    finally:
        env.close()


class OddNames:
    """Tools whose names are not identifiers, as MCP servers may name them."""

    def __init__(self, name):
        self.spec = {
            "name": name,
            "description": "",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        }

    def call(self, arguments):
        return ToolResult(f"{self.spec['name']} got {arguments['q']}")

    def end_episode(self):
        pass

    def close(self):
        pass


def test_tools_are_called_by_their_names_as_they_are():
    names = ["files/read", "2fa", "get weather"]
    env = ToolEnv(create_env(registry.envs.get("reasoning-gym:chain_sum"), {}, "x"), [OddNames(n) for n in names])
    env.reset(0)
    for name in names:
        result = env.step(env.action_from_tool_call(name, {"q": "x"}))
        assert result.observation == f"{name} got x" and not result.done


def test_the_tool_call_template_tells_the_model_to_call_tools_not_to_write_their_text_syntax():
    """Its system prompt opened with "Call a tool (python[...]) ... finish with answer[your answer]", then asked
    for <tool_call> JSON: two formats at once. The react template still gets the text syntax it parses."""
    env = build()
    try:
        called = registry.templates.get("tool_call")().system_prompt(env)
        written = registry.templates.get("react")().system_prompt(env)
    finally:
        env.close()
    assert called.startswith("Call a tool (python) to compute something, at most 4 times, then finish with the answer")
    assert "python[" not in called and "answer[" not in called and "<tool_call>" in called
    assert "python[...]" in written and "answer[your answer]" in written
