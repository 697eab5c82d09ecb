"""The token ledger: every cut of an episode counted per step by its cause, and a row longer than the
model's context window refused before anything plays."""

from __future__ import annotations

from omrl.data.trajectory import read_episodes
from omrl.rollout import RolloutLimits
from omrl.training.metrics import rollout_metrics
from tests.fakes import ScriptedBackend
from tests.helpers import cli_exit, keys_eval, play_keys


def test_each_cut_is_counted_by_its_cause(tiny_tokenizer):
    long_reply = tiny_tokenizer.encode("Action: " + "wait " * 40, add_special_tokens=False)  # never ends

    def reply(call, index, prompt):
        return long_reply if index == 0 else "Action: look"

    def play(**limits):
        return play_keys(
            tiny_tokenizer,
            ScriptedBackend(tiny_tokenizer, reply),
            [0, 1],
            limits=RolloutLimits(**limits),
        )

    by_turns = play(max_new_tokens=10, max_context=1024, max_turns=2)
    assert [ep.end_reason for ep in by_turns] == ["max_turns", "max_turns"]
    metrics = rollout_metrics(by_turns, 1.0, {})
    assert (metrics["cut_replies"], metrics["cut_max_turns"], metrics["cut_max_context"]) == (2.0, 2.0, 0.0)
    by_context = play(max_new_tokens=10, max_context=110, max_turns=50)
    metrics = rollout_metrics(by_context, 1.0, {})
    assert metrics["cut_max_context"] == 2.0 and metrics["cut_max_turns"] == 0.0 and metrics["cut_budget"] == 0.0


def test_a_context_longer_than_the_models_window_is_refused_before_playing(fake_plugins, capsys):
    status, _, err = cli_exit(capsys, *keys_eval(1, "generation.max_context=100000"))
    assert status == 2
    assert "generation.max_context=100000 is longer than the context window of model 'tiny' (4096 positions" in err


def test_an_eval_in_which_no_episode_got_a_model_turn_exits_2_and_keeps_its_report(fake_plugins, capsys, tmp_path):
    out = tmp_path / "eval"
    status, _, err = cli_exit(capsys, *keys_eval(2, "generation.max_context=30", "--output-dir", str(out)))
    assert status == 2
    assert "no episode got a single model turn" in err and "generation.max_context=30" in err
    assert (out / "report.json").is_file() and (out / "episodes.parquet").is_file()  # what it played is kept
    # the message says how they are written, as they are (it said env_error, from the env-error check)
    assert "(they are written, as end_reason max_context)" in " ".join(err.split())
    assert {ep.end_reason for ep in read_episodes(out / "episodes.parquet")} == {"max_context"}
