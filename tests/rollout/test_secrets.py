"""Secrets never reach a file omrl writes, a resumed run still gets its real one, and `omrl view`
never follows a link out of the run directory."""

from __future__ import annotations

import io
import json
import os

import pytest
from rich.console import Console

from omrl.cli import main
from omrl.config import load_config, to_dict, to_yaml
from omrl.config.options import EvalRunConfig, TrainRunConfig
from omrl.training import checkpoint as ckpt
from omrl.training.resume import resume_checkpoint
from tests.helpers import gridworld_grpo_config, keys_eval

SECRET = "s3cret-tok-9f2c"
REDACTED = "<redacted>"  # what a secret becomes in a written file


def run_cli(*args: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    assert exit_info.value.code in (0, None)


def files_under(folder):
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_the_rule_names_secrets_and_spares_names_that_only_mention_one():
    from omrl.config import is_secret_key, redact

    for key in ("token", "api_key", "hf_token", "X-Api-Key", "Authorization", "db_password", "secret", "key"):
        assert is_secret_key(key), key
    for key in ("api_key_env", "max_new_tokens", "keys", "tokenizer", "keep_checkpoints", "monkey"):
        assert not is_secret_key(key), key
    data = {
        "plugins": {
            "agentgym": {"token": SECRET, "headers": {"Authorization": f"Bearer {SECRET}", "X-Id": 3}},
            "other": {"api_key": None, "password": ""},
        },
        "seed": 0,
    }
    assert redact(data) == {
        "plugins": {
            "agentgym": {"token": REDACTED, "headers": {"Authorization": REDACTED, "X-Id": 3}},
            "other": {"api_key": None, "password": ""},
        },
        "seed": 0,
    }


def test_the_config_written_is_redacted_and_the_live_one_is_not():
    cfg = load_config(EvalRunConfig, None, [f"plugins.agentgym.token={SECRET}"])
    assert SECRET not in to_yaml(cfg) and SECRET not in json.dumps(to_dict(cfg))
    assert to_dict(cfg)["plugins"]["agentgym"]["token"] == REDACTED
    assert cfg.plugins["agentgym"]["token"] == SECRET  # what the env is built with


def test_the_eval_report_and_its_page_hold_no_secret(fake_plugins, tmp_path):
    report, page = tmp_path / "report.json", tmp_path / "page.html"
    run_cli(*keys_eval(1, f"plugins.agentgym.token={SECRET}", "--report", str(report)))
    assert json.loads(report.read_text())["config"]["plugins"]["agentgym"]["token"] == REDACTED
    run_cli("view", str(report), "--out", str(page))
    assert SECRET not in report.read_text() and SECRET not in page.read_text()


def test_view_redacts_the_config_of_a_run_written_before_redaction(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")
    (run / "config.yaml").write_text(f"seed: 0\nplugins:\n  agentgym:\n    token: {SECRET}\n")
    run_cli("view", str(run), "--out", str(tmp_path / "page.html"))
    page = (tmp_path / "page.html").read_text()
    assert SECRET not in page and REDACTED.replace("<", "\\u003c").replace(">", "\\u003e") in page


def test_view_never_follows_a_link_out_of_the_run(tmp_path, capsys):
    private = tmp_path / "private"
    private.mkdir()
    (private / "netrc.yaml").write_text("machine: example.org\nlogin: me\nprivate_note: do-not-share-4711\n")
    (private / "notes.jsonl").write_text(
        json.dumps({"task_id": 0, "turns": [], "instruction": "do-not-share-4711"}) + "\n"
    )
    run = tmp_path / "run"
    (run / "rollouts").mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")
    os.symlink(private / "netrc.yaml", run / "config.yaml")
    os.symlink(private / "notes.jsonl", run / "rollouts" / "notes.jsonl")
    run_cli("view", str(run), "--out", str(tmp_path / "page.html"))
    assert "do-not-share-4711" not in (tmp_path / "page.html").read_text()
    out = " ".join(capsys.readouterr().out.split())
    assert "config.yaml: a link to a file outside the run directory; not followed" in out
    assert "notes.jsonl: a link to a file outside the run directory; not followed" in out


def test_a_checkpoint_with_a_secret_in_clear_still_resumes_with_the_redacted_config(tmp_path, tiny_model):
    model, _ = tiny_model
    ckpt.save_checkpoint(tmp_path, 1, model, config={"seed": 0, "plugins": {"agentgym": {"token": SECRET}}})
    now = {"seed": 0, "plugins": {"agentgym": {"token": REDACTED}}}
    assert resume_checkpoint(tmp_path, now).name == "step-00000001"
    with pytest.raises(ckpt.CheckpointError, match="seed: 0 -> 1"):  # other keys are still compared
        resume_checkpoint(tmp_path, {**now, "seed": 1})


class Stop(Exception):
    pass


@pytest.mark.slow
def test_a_training_run_writes_no_secret_and_resumes_with_a_new_one(tiny_model_dir, tmp_path):
    from omrl.training.rl import run_rl

    out = tmp_path / "run"

    def config(token: str) -> TrainRunConfig:
        return gridworld_grpo_config(
            tiny_model_dir,
            out,
            "generation.max_new_tokens=4",
            "steps=2",
            "tasks_per_step=1",
            "group_size=2",
            "eval_tasks=1",
            "reward.weights={goal: 1.0}",
            "logging.save_steps=1",
            "optim.micro_batch_size=4",
            f"plugins.agentgym.token={token}",
        )

    def stop_after_one(step, metrics):
        if step == 1:
            raise Stop

    quiet = Console(file=io.StringIO())
    with pytest.raises(Stop):
        run_rl(config(SECRET), on_step_end=stop_after_one, console=quiet)
    resumed = config("a-rotated-token")
    resumed.resume = True
    run_rl(resumed, console=quiet)
    assert resumed.plugins["agentgym"]["token"] == "a-rotated-token"
    state = json.loads((ckpt.latest_checkpoint(out) / "state.json").read_text())
    assert state["config"]["plugins"]["agentgym"]["token"] == REDACTED
    leaks = [str(p) for p, data in files_under(out).items() if SECRET.encode() in data or b"a-rotated-token" in data]
    assert leaks == []
