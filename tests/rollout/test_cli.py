"""`omrl rollout` and `omrl eval` through the real CLI, on the tiny model and the fake `keys` env."""

from __future__ import annotations

import json

import pytest

from omrl.data import read_episodes
from omrl.envs import Observation, StepResult
from omrl.templates import ParsedAction
from tests.fakes import ActionTemplate, KeyEnv, Registers
from tests.helpers import FAST, cli_exit, eval_report, invoke, keys_eval, keys_rollout


def test_rollout_writes_parquet_and_readable_jsonl(fake_plugins, tmp_path):
    out = tmp_path / "runs" / "t.parquet"
    result = invoke(*keys_rollout(2, *FAST, "--group-size", "2", "--output", str(out)))
    assert result.exit_code == 0, result.output
    episodes = read_episodes(out)
    assert [(ep.group, ep.sample) for ep in episodes] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(ep.num_turns == 2 and sum(ep.loss_mask) > 0 for ep in episodes)
    lines = out.with_suffix(".jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 4 and records[0]["messages"][0]["role"] == "system"
    assert records[0]["token_exact"] is True
    assert "wrote 4 episodes" in result.output and "success_rate" in result.output


def test_rollout_expert_makes_winning_sft_data(fake_plugins, tmp_path):
    out = tmp_path / "expert.parquet"
    result = invoke(*keys_rollout(3, "--expert", "-o", str(out)))
    assert result.exit_code == 0, result.output
    episodes = read_episodes(out)
    assert len(episodes) == 3 and all(ep.won for ep in episodes)
    assert episodes[0].messages[2] == {"role": "assistant", "content": "Action: open"}


def test_eval_prints_the_table_and_writes_the_report(fake_plugins, tmp_path):
    result, data = eval_report(tmp_path, *keys_eval(3, "generation.temperature=1.0", "--samples", "2"))
    metrics = data["metrics"]
    assert metrics["episodes"] == 6 and metrics["samples_per_task"] == 2 and "pass@2" in metrics
    assert sum(metrics["end_reasons"].values()) == 6
    assert data["config"]["env"]["split"] == "test"
    assert data["config"]["description"] == "Sampled (temperature 1) evaluation on the test split"  # not the preset's
    assert "pass@2" in result.output and "format_error_rate" in result.output
    for key in (
        "generated_tokens",
        "prefill_tokens",
        "prefill_reused",
        "prefill_hit_rate",
        "decode_tokens_per_s",
        "peak_rss_gb",
    ):  # what generation cost, as a training step logs it
        assert metrics[key] > 0 if key != "prefill_reused" else metrics[key] >= 0, key
        assert key in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["rollout", "eval"], "preset 'eval' is for `omrl eval`, not `omrl rollout`"),
        (["rollout", "--env", "nosuch", "--expert"], "unknown env 'nosuch'"),
        (["eval", "num_taks=3"], "did you mean 'num_tasks'"),
        (
            ["eval", "--samples", "4", "generation.temperature=0"],
            "--samples 4 with greedy decoding gives the same sample every time; valid: "
            "--samples 1, or sampling, e.g. generation.temperature=1.0",
        ),
    ],
)
def test_bad_input_is_one_clear_line(fake_plugins, capsys, args, message):
    code, _, err = cli_exit(capsys, *args)
    assert code == 2
    assert message in " ".join(err.split())


def test_the_paths_and_commands_printed_for_copying_are_never_broken_over_lines(fake_plugins, tmp_path):
    """Piped output (no terminal: 80 columns) keeps a long path and the command that reads it whole."""
    deep = tmp_path / ("a-directory-name-long-enough-to-pass-eighty-columns-" * 2) / "t.parquet"
    result = invoke(*keys_rollout(1, *FAST, "--output", str(deep)))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert f"look at them: omrl view {deep}" in lines
    assert any(line.startswith("wrote 1 episodes to ") and str(deep) in line for line in lines)
    report = deep.with_name("report.json")
    result = invoke(*keys_eval(1, "--report", str(report)))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    episodes = report.with_name("report.episodes.parquet")
    assert f"report: {report}" in lines and f"look at them: omrl view {episodes}" in lines


@pytest.mark.parametrize("command", ["eval", "rollout"])
def test_ctrl_c_while_playing_says_how_far_it_got_and_that_nothing_is_written(
    fake_plugins, tmp_path, capsys, monkeypatch, command
):
    out = tmp_path / ("run" if command == "eval" else "t.parquet")

    def interrupted(session, tasks, spec, progress):
        if command == "eval":
            out.mkdir(exist_ok=True)  # as a real run's supervisor makes it, for its heartbeat
        raise KeyboardInterrupt

    monkeypatch.setattr("omrl.search.play_strategy", interrupted)
    words = keys_eval(3, "--output-dir", str(out)) if command == "eval" else keys_rollout(3, "-o", str(out))
    code, _, err = cli_exit(capsys, *words)
    assert code == 130
    assert "interrupted: 0 of 3 tasks were played; nothing is written" in " ".join(err.split())
    assert not out.exists()  # eval's folder, which it made, is not left behind empty


class CtrlCAtTaskTwo(KeyEnv):
    """Tasks other than 2 end at their first step; task 2's second step is the user's Ctrl-C."""

    def reset(self, task_id: int) -> Observation:
        self.turn = 0
        return super().reset(task_id)

    def step(self, action: str) -> StepResult:
        self.turn += 1
        if self.task == 2 and self.turn == 2:
            raise KeyboardInterrupt
        if self.task != 2:
            return StepResult("The chest crumbles.", 0.0, True, {"won": self.task == 0, "score": 0.0})
        return super().step(action)


class AnyReply(ActionTemplate):
    """The whole reply is the action: the `tiny` model's replies step the env too."""

    def parse(self, response: str, env) -> ParsedAction:
        return ParsedAction(response.strip() or "nothing", True)


@pytest.mark.parametrize("command", ["eval", "rollout"])
def test_ctrl_c_keeps_the_tasks_played_to_their_end_unscored(fake_plugins, register_plugin, tmp_path, capsys, command):
    """An hour of play is not lost to a Ctrl-C: the tasks that ended are written, without rewards (none
    were given yet), where a failed reward's episodes go; the output proper is not written."""
    register_plugin(Registers({"ctrl-c": CtrlCAtTaskTwo}, {"any-reply": AnyReply}), name="test-ctrl-c")
    if command == "eval":
        out = ("env.template=any-reply", "generation.temperature=1.0", "--output-dir", str(tmp_path / "run"))
        words, kept = keys_eval(3, *out, env="ctrl-c"), tmp_path / "run"
    else:
        words = ["rollout", "--env", "ctrl-c", "--template", "action", "--expert", "--num-tasks", "3"]
        words, kept = [*words, "-o", str(tmp_path / "t.parquet")], tmp_path
    code, _, err = cli_exit(capsys, *words)
    said = " ".join(err.split())
    assert code == 130, err
    unscored = next(kept.glob("*.unscored.parquet"))
    assert f"2 of 3 tasks were played; their 2 episodes are written without rewards to {unscored}" in said
    episodes = read_episodes(unscored)
    assert sorted(ep.task_id for ep in episodes) == [0, 1] and all(ep.rewards == {} for ep in episodes)
    assert [ep.won for ep in sorted(episodes, key=lambda ep: ep.task_id)] == [True, False]
    assert unscored.with_suffix(".jsonl").is_file()
    assert not (tmp_path / "t.parquet").exists() and not list(kept.glob("*report*.json"))


def test_a_rollouts_heartbeat_is_named_for_its_output_not_left_as_heartbeat_json(fake_plugins, tmp_path):
    out = tmp_path / "t.parquet"
    result = invoke(*keys_rollout(2, *FAST, "deadlines.heartbeat_s=0.01", "--output", str(out)))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "t.heartbeat.json").is_file() and not (tmp_path / "heartbeat.json").exists()


def test_eval_says_when_the_split_has_fewer_tasks_than_asked(fake_plugins, tmp_path):
    result, data = eval_report(tmp_path, *keys_eval(9))
    assert data["metrics"]["tasks"] == 6
    assert "eval: 6 of 6 tasks of the test split (num_tasks 9: the split has only 6)" in result.output
