"""The commands that play envs on a mixture of envs (``--env a:0.5,b:0.5``): eval reports each env and
both averages, rollout writes one file naming each episode's env, sweep and train name their outputs
and hints for the mixture, and a bad mixture is one clear line before any model loads."""

from __future__ import annotations

import json
import shlex
from typing import Sequence

import pytest

from omrl.data import read_episodes
from omrl.envs import Env, EnvError, Observation, StepResult, check_task
from omrl.templates import ParsedAction, Template
from tests.fakes import KeyEnv, Registers

#: the `tiny` model's replies sampled (greedy ones are often empty), 4 tokens each, 2 turns an episode
SHORT = ("--model", "tiny", "generation.max_new_tokens=4", "env.max_turns=2", "generation.temperature=1.0")


class HalfWonEnv(Env):
    """Two tasks; any action ends the episode: task 0 won, task 1 lost."""

    action_help = "Reply with anything."

    def task_ids(self, split: str) -> Sequence[int]:
        return [0, 1]

    def reset(self, task_id: int) -> Observation:
        check_task(self, task_id, range(2))
        self.task = task_id
        return Observation("A door.", "Say anything.")

    def step(self, action: str) -> StepResult:
        won = self.task == 0
        return StepResult("The end.", float(won), True, {"won": won, "score": float(won)})

    def expert_action(self) -> str:
        return "knock"


class BrokenEnv(HalfWonEnv):
    """One task, whose every step fails in the env."""

    def task_ids(self, split: str) -> Sequence[int]:
        return [0]

    def step(self, action: str) -> StepResult:
        raise EnvError("the door fell off")


class NotInstalledEnv(KeyEnv):
    package = "omrl-no-such-engine"
    extra = "no-such-engine"


class AnyTemplate(Template):
    """Any reply that is not blank is the action."""

    def system_prompt(self, env: Env) -> str:
        return f"You play a text game. {env.action_help}"

    def parse(self, response: str, env: Env) -> ParsedAction:
        return ParsedAction(response.strip() or None, bool(response.strip()))

    def format_action(self, action: str, env: Env, thought: str = "") -> str:
        return action


@pytest.fixture
def mix_plugins(register_plugin):
    envs = {"keys": KeyEnv, "half-won": HalfWonEnv, "broken": BrokenEnv, "missing-engine": NotInstalledEnv}
    register_plugin(Registers(envs, {"anything": AnyTemplate}), name="test-mixture-envs")


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: what is refused must be refused before."""

    def from_pretrained(*args, **kwargs):
        raise AssertionError("a model was loaded before the error")

    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", from_pretrained)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def test_eval_on_a_mixture_reports_each_env_and_both_averages(omrl_main, mix_plugins, tmp_path):
    folder = tmp_path / "eval"
    code, out, err = omrl_main("eval", "--env", "keys:0.9,half-won:0.1", "env.template=anything", *SHORT,
                               "--num-tasks", "3", "--output-dir", str(folder))  # fmt: skip
    assert code == 0, err
    report = json.loads((folder / "report.json").read_text())
    episodes = read_episodes(folder / "episodes.parquet")
    by_env = {env: [ep for ep in episodes if ep.env == env] for env in ("keys", "half-won")}
    # num_tasks of each env, whatever the weights (half-won has only 2)
    assert {env: len(eps) for env, eps in by_env.items()} == {"keys": 3, "half-won": 2}
    assert "envs       a mixture of 2: keys, half-won, as many tasks of each" in out  # not the weights 0.9/0.1
    assert [e["env"] for e in report["episodes"]] == [ep.env for ep in episodes]
    assert [ep.won for ep in by_env["half-won"]] == [True, False]  # any reply that is not blank ends it
    for env, eps in by_env.items():
        metrics = report["per_env"][env]
        assert metrics["episodes"] == len(eps)
        assert metrics["success_rate"] == pytest.approx(mean([ep.won for ep in eps]))
        assert metrics["mean_score"] == pytest.approx(mean([ep.score for ep in eps]))
        assert metrics["mean_turns"] == pytest.approx(mean([ep.num_turns for ep in eps]))
        assert metrics["reward/total"] == pytest.approx(mean([ep.total_reward for ep in eps]))
    macro, micro = report["macro"], report["micro"]
    assert macro["success_rate"] == pytest.approx(mean([0.0, 0.5]))  # each env alike
    assert micro["success_rate"] == pytest.approx(1 / 5) == report["metrics"]["success_rate"]  # each episode alike
    assert macro["mean_turns"] == pytest.approx(mean([mean([ep.num_turns for ep in eps]) for eps in by_env.values()]))
    assert micro["mean_turns"] == pytest.approx(mean([ep.num_turns for ep in episodes]))
    assert "episodes" not in macro and "end_reasons" not in macro  # counts are not averaged
    assert report["metrics"]["episodes"] == 5 and "per_env" not in report["metrics"]
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}  # the last row of each
    assert rows["keys"][:3] == ["keys", "3", "0.0%"] and rows["half-won"][:3] == ["half-won", "2", "50.0%"]
    assert rows["macro"][:2] == ["macro", "25.0%"] and rows["micro"][:2] == ["micro", "20.0%"]


def test_a_single_env_report_keeps_its_shape(omrl_main, mix_plugins, tmp_path):
    folder = tmp_path / "eval"
    code, out, err = omrl_main("eval", "--env", "half-won", "env.template=anything", *SHORT, "--num-tasks", "2",
                               "--output-dir", str(folder))  # fmt: skip
    assert code == 0, err
    report = json.loads((folder / "report.json").read_text())
    assert list(report) == ["metrics", "config", "episodes"]
    assert set(report["episodes"][0]) == {"task_id", "sample", "won", "score", "turns", "end_reason", "error", "reward"}
    assert "macro" not in out and "per env" not in out


def test_each_env_of_a_mixture_is_held_to_the_env_error_rate(omrl_main, mix_plugins, tmp_path):
    """1 episode of 4 failed in the env: within max_env_error_rate=0.4 over all, but the whole of its env."""
    folder = tmp_path / "eval"
    code, out, err = omrl_main("eval", "--env", "keys,broken", "env.template=anything", *SHORT, "--num-tasks", "3",
                               "max_env_error_rate=0.4", "--output-dir", str(folder))  # fmt: skip
    assert code != 0
    said = " ".join((out + err).split())
    assert "1 of 1 episodes failed in the env 'broken'" in said
    assert "every one of the 1 episodes failed in the env 'broken'" in said and "Traceback" not in said
    report = json.loads((folder / "report.json").read_text())  # written before the refusal, as for one env
    assert report["per_env"]["broken"]["env_errors"] == 1 and report["per_env"]["keys"]["env_errors"] == 0


def test_an_env_nothing_measured_is_no_0_percent_and_is_left_out_of_macro(omrl_main, mix_plugins, tmp_path):
    """Every episode of broken failed in the env: its rates are null ("-"), macro is half-won's alone, and
    eval exits 2 once the report is written, even where max_env_error_rate=1.0 lets the failures pass."""
    folder = tmp_path / "eval"
    code, out, err = omrl_main("eval", "--env", "half-won,broken", "env.template=anything", *SHORT,
                               "--num-tasks", "2", "max_env_error_rate=1.0", "--output-dir", str(folder))  # fmt: skip
    assert code == 2, err
    report = json.loads((folder / "report.json").read_text())
    broken = report["per_env"]["broken"]
    assert broken["success_rate"] is None and broken["mean_score"] is None and broken["env_errors"] == 1
    assert report["macro_left_out"] == ["broken"]
    assert report["macro"]["success_rate"] == pytest.approx(0.5) == report["per_env"]["half-won"]["success_rate"]
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert rows["broken"][:3] == ["broken", "1", "-"] and rows["macro"][:2] == ["macro", "50.0%"]
    said = " ".join((out + err).split())
    assert "macro leaves out broken" in said
    assert "every one of the 1 episodes of 'broken' failed in the env" in said and "Traceback" not in said


def test_eval_of_one_env_that_failed_every_episode_exits_2_after_its_report(omrl_main, mix_plugins, tmp_path):
    folder = tmp_path / "eval"
    code, out, err = omrl_main("eval", "--env", "broken", "env.template=anything", *SHORT, "--num-tasks", "1",
                               "max_env_error_rate=1.0", "--output-dir", str(folder))  # fmt: skip
    assert code == 2, err
    metrics = json.loads((folder / "report.json").read_text())["metrics"]
    assert metrics["success_rate"] is None and metrics["env_errors"] == 1
    assert "every one of the 1 episodes of 'broken' failed in the env" in " ".join((out + err).split())


def test_a_rollout_one_of_whose_envs_failed_every_episode_exits_2_after_writing_them(omrl_main, mix_plugins,
                                                                                     tmp_path):  # fmt: skip
    out = tmp_path / "mixed.parquet"
    code, said, err = omrl_main("rollout", "--env", "half-won,broken", "env.template=anything", *SHORT,
                                "--num-tasks", "2", "max_env_error_rate=1.0", "-o", str(out))  # fmt: skip
    assert code == 2, err
    assert {ep.env for ep in read_episodes(out)} == {"half-won", "broken"}  # written first, as end_reason env_error
    assert "every one of the 1 episodes of 'broken' failed in the env" in " ".join((said + err).split())


def test_rollout_of_the_expert_on_a_mixture_writes_one_file_naming_each_env(omrl_main, mix_plugins, tmp_path):
    out = tmp_path / "expert.parquet"
    code, said, err = omrl_main("rollout", "--env", "keys:0.5,half-won:0.5", "--template", "anything", "--expert",
                                "--model", "tiny", "--num-tasks", "2", "-o", str(out))  # fmt: skip
    assert code == 0, err
    episodes = read_episodes(out)
    assert [(ep.env, ep.task_id, ep.won) for ep in episodes] == [
        ("keys", 0, True),
        ("keys", 1, True),
        ("half-won", 0, True),
        ("half-won", 1, False),
    ]
    import pyarrow.parquet as pq

    assert pq.read_table(out).column("env").to_pylist() == ["keys", "keys", "half-won", "half-won"]
    records = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert [r["env"] for r in records] == ["keys", "keys", "half-won", "half-won"]
    assert "rollout per env" in said and "wrote 4 episodes" in said
    code, shown, err = omrl_main("data", "show", str(out), "-n", "4")
    assert code == 0, err
    assert '"env": "keys"' in shown and '"env": "half-won"' in shown


def test_a_sweep_on_a_mixture_records_each_envs_success(omrl_main, mix_plugins, tmp_path):
    out = tmp_path / "sweep"
    code, said, err = omrl_main("sweep", "--env", "keys,half-won", "env.template=anything", *SHORT, "--num-tasks",
                                "2", "--strategies", "chain,best_of_n", "--budgets", "8", "--out", str(out))  # fmt: skip
    assert code == 0, err
    record = json.loads((out / "sweep.json").read_text())
    assert record["setup"]["tasks"] == [["keys", "test", 0], ["keys", "test", 1], ["half-won", "test", 0],
                                        ["half-won", "test", 1]]  # fmt: skip
    for cell in record["cells"]:
        assert [t["env"] for t in cell["per_task"]] == ["keys", "keys", "half-won", "half-won"]
        for env, part in cell["per_env"].items():
            mine = [t["won"] for t in cell["per_task"] if t["env"] == env]
            assert (part["tasks"], part["success_rate"]) == (len(mine), pytest.approx(mean(mine)))
        assert cell["success_macro"] == pytest.approx(mean([p["success_rate"] for p in cell["per_env"].values()]))
    assert "sweep: tiny on keys + half-won (test, 4 tasks" in " ".join(said.split())


def test_a_sweep_leaves_an_env_nothing_measured_out_of_its_macro(omrl_main, mix_plugins, tmp_path):
    out = tmp_path / "sweep"
    code, _, err = omrl_main("sweep", "--env", "half-won,broken", "env.template=anything", *SHORT, "--num-tasks",
                             "2", "--strategies", "chain", "--out", str(out))  # fmt: skip
    assert (out / "sweep.json").exists(), err
    (cell,) = json.loads((out / "sweep.json").read_text())["cells"]
    assert cell["per_env"]["broken"]["success_rate"] is None, err
    assert cell["success_macro"] == cell["per_env"]["half-won"]["success_rate"] == pytest.approx(0.5)


@pytest.mark.slow
def test_train_on_a_mixture_names_its_folder_and_a_working_eval_command(omrl_main, mix_plugins, tmp_path,
                                                                        monkeypatch):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    code, out, err = omrl_main("train", "--algo", "grpo", "--env", "keys:0.5,half-won:0.5", "env.template=anything",
                               *SHORT, "--steps", "1", "tasks_per_step=2", "group_size=2", "generation.max_context=512",
                               "logging.tensorboard=false")  # fmt: skip
    assert code == 0, err
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("grpo-mix-keys-half-won-")
    said = (out + err).splitlines()
    assert "envs       a mixture of 2: keys 0.5, half-won 0.5" in said
    (hint,) = [line.removeprefix("evaluate it: ") for line in said if line.startswith("evaluate it: ")]
    assert hint == f"omrl eval --model runs/{run.name} --env keys:0.5,half-won:0.5"
    code, out, err = omrl_main(*shlex.split(hint)[1:], "--num-tasks", "1", "--output-dir", "evals/mine")
    assert code == 0, err
    assert f"as runs/{run.name} trained: env.template=anything, env.max_turns=2, generation.max_new_tokens=4" in out
    assert set(json.loads((tmp_path / "evals/mine/report.json").read_text())["per_env"]) == {"keys", "half-won"}


@pytest.mark.slow
def test_a_mixture_in_env_mix_is_evaluated_by_the_command_train_prints(omrl_main, mix_plugins, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mix = "env.mix=[{name: keys, weight: 3, split: train, max_turns: 1}, half-won]"
    code, out, err = omrl_main("train", "--algo", "grpo", mix, "env.template=anything", *SHORT, "--steps", "1",
                               "tasks_per_step=2", "group_size=2", "logging.tensorboard=false")  # fmt: skip
    assert code == 0, err
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("grpo-mix-keys-half-won-")
    (hint,) = [line.removeprefix("evaluate it: ") for line in (out + err).splitlines() if "evaluate it: " in line]
    words = shlex.split(hint)
    assert words[:4] == ["omrl", "eval", "--model", f"runs/{run.name}"]
    assert words[4] == 'env.mix=[{"name": "keys", "weight": 3, "max_turns": 1}, "half-won"]'  # eval's own split
    code, out, err = omrl_main(*words[1:], "--num-tasks", "1", "--output-dir", "evals/mine")
    assert code == 0, err
    assert f"as runs/{run.name} trained: env.template=anything, env.max_turns=2" in out  # the same mixture
    report = json.loads((tmp_path / "evals/mine/report.json").read_text())
    assert {(e["env"], e["task_id"], e["turns"]) for e in report["episodes"]} == {("keys", 0, 1), ("half-won", 0, 1)}


def test_a_search_on_a_mixture_is_reported_per_env(omrl_main, mix_plugins, tmp_path):
    folder = tmp_path / "eval"
    code, out, err = omrl_main("eval", "--env", "keys,half-won", "env.template=anything", *SHORT, "--num-tasks", "2",
                               "--strategy", "best_of_n", "--budget", "8", "--output-dir", str(folder))  # fmt: skip
    assert code == 0, err
    report = json.loads((folder / "report.json").read_text())
    assert [e["env"] for e in report["episodes"]] == ["keys", "keys", "half-won", "half-won"]  # each task's answer
    for metrics in report["per_env"].values():
        assert metrics["search/strategy"] == "best_of_n" and metrics["episodes"] == 2
        assert metrics["search/generated_tokens"] <= 2 * 8
    tokens = [m["search/generated_tokens"] for m in report["per_env"].values()]
    assert sum(tokens) == report["metrics"]["search/generated_tokens"]


@pytest.mark.parametrize("command", ["eval", "rollout", "sweep", "train"])
@pytest.mark.parametrize(
    "env, message",
    [
        ("keys,nosuch", "unknown env 'nosuch'"),
        ("keys:0,half-won", "env 'keys' has weight 0.0; a weight must be a positive number"),
        ("keys:-1,half-won", "env 'keys' has weight -1.0; a weight must be a positive number"),
        ("keys,half-won,keys:2", "env 'keys' is named twice in the mixture"),
        ("keys,missing-engine", "the missing-engine env needs the package omrl-no-such-engine, not installed"),
    ],
)
def test_a_bad_mixture_is_one_clear_line_before_a_model_loads(command, env, message, omrl_main, mix_plugins, no_model,
                                                              tmp_path):  # fmt: skip
    out = {"rollout": ("-o", str(tmp_path / "e.parquet")), "sweep": ("--out", str(tmp_path / "s"))}
    code, said, err = omrl_main(command, "--env", env, "--model", "tiny",
                                *out.get(command, ("--output-dir", str(tmp_path / "out"))))  # fmt: skip
    assert code == 2
    assert message in " ".join(err.split()) and "Traceback" not in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "s").exists()
