"""One rule for settings: a preset is a recipe for its env, a trained model is evaluated as it
trained, and every run prints what it plays in one block."""

from __future__ import annotations

import json
import warnings

import pytest
import yaml

TINY = ("--model", "tiny", "logging.tensorboard=false")
SMALL_STEP = ("tasks_per_step=2", "group_size=2", "generation.max_new_tokens=4")


def test_a_webshop_preset_on_gridworld_says_what_it_keeps_and_takes_the_envs_turn_cap(omrl_main, tmp_path):
    run = tmp_path / "run"
    code, out, err = omrl_main("train", "--algo", "grpo", "--env", "gridworld", *TINY, *SMALL_STEP,
                               "--steps", "1", "--output-dir", str(run))  # fmt: skip
    assert code == 0, err
    said = out + err
    assert (
        "preset grpo is a recipe for webshop; on gridworld: env.max_turns=0 (the env's own cap, not webshop's 8)"
        in said
    )
    assert "kept from it: env.demonstration=False, reward.weights={goal: 1, format: 0.1, tag_count: 0.1}" in said
    assert "turns      the env's own cap" in said and "tokens     4 new a reply" in said
    assert "algorithm  grpo: advantage grpo, policy loss ppo_clip (token-mean)\n" in said
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["env"]["max_turns"] == 0
    assert saved["description"] == ""  # the preset's "GRPO on WebShop ..." described another run


def test_a_dpo_run_names_its_loss_and_a_run_of_one_step_says_step(omrl_main, no_model, tmp_path):
    _, out, err = omrl_main("train", "--algo", "dpo", "--env", "gridworld", *TINY, "--steps", "1",
                            "--output-dir", str(tmp_path / "run"))  # fmt: skip
    assert "dpo on gridworld with tiny, 1 step x 2 tasks" in out + err
    assert "algorithm  dpo: pairs of a task's samples whose rewards differ, beta 0.1 against the starting model\n" in (
        out + err
    )


def test_what_the_user_sets_is_kept_and_not_named(omrl_main, tmp_path):
    code, out, err = omrl_main("train", "--algo", "grpo", "--env", "gridworld", *TINY, *SMALL_STEP, "env.max_turns=3",
                               "reward.weights={goal: 1.0}", "env.demonstration=true", "--steps", "1",
                               "--output-dir", str(tmp_path / "run"))  # fmt: skip
    assert code == 0, err
    assert "env.max_turns=0" not in out + err and "kept from it" not in out + err
    assert "turns      3" in out + err


def test_a_value_a_flag_sets_is_not_said_to_be_kept_from_the_preset(omrl_main, tmp_path):
    """``eval --template xml``: "kept from it: env.template=xml", though the preset says react."""
    code, out, err = omrl_main("eval", "--env", "gridworld", "--model", "tiny", "--template", "xml",
                               "--num-tasks", "1", "--output-dir", str(tmp_path / "ev"))  # fmt: skip
    assert code == 0, err
    said = " ".join((out + err).split())
    assert "kept from it: generation.max_new_tokens=64" in said and "env.template=xml" not in said
    assert "template xml" in said  # played with it: eval takes --template as rollout does


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """One GRPO step on gridworld with 2 turns and 4 new tokens a reply, which both commands below play as trained."""
    from omrl.cli import main

    run = tmp_path_factory.mktemp("trained") / "run"
    with pytest.MonkeyPatch.context() as patch:  # what the omrl_main fixture puts back, put back here
        patch.setattr(warnings, "showwarning", warnings.showwarning)
        patch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        try:
            main(["train", "--algo", "grpo", "--env", "gridworld", *TINY, *SMALL_STEP, "env.max_turns=2",
                  "--steps", "1", "--output-dir", str(run)])  # fmt: skip
        except SystemExit as stop:
            assert not stop.code, f"train exited with {stop.code}"
    return run


def test_eval_plays_a_trained_model_with_its_training_settings(omrl_main, trained_run, tmp_path):
    run = trained_run
    code, out, err = omrl_main("eval", "--env", "gridworld", "--model", str(run), "--num-tasks", "1",
                               "--output-dir", str(tmp_path / "eval"))  # fmt: skip
    assert code == 0, err
    assert f"as {run} trained: env.max_turns=2, generation.max_new_tokens=4" in out
    played = json.loads((tmp_path / "eval" / "report.json").read_text())["config"]
    assert (played["env"]["max_turns"], played["generation"]["max_new_tokens"]) == (2, 4)


def test_sweep_plays_a_trained_model_with_its_training_settings(omrl_main, trained_run, tmp_path):
    run = trained_run
    code, out, err = omrl_main("sweep", "--env", "gridworld", "--model", str(run), "--num-tasks", "1",
                               "--strategies", "best_of_n", "--budgets", "16", "--out", str(tmp_path / "sweep"))  # fmt: skip
    assert code == 0, err
    assert f"as {run} trained: env.max_turns=2, generation.max_new_tokens=4" in out


def test_eval_of_a_run_without_env_plays_the_env_it_trained_on_and_config_show_shows_it(
    omrl_main, trained_run, tmp_path
):
    run = trained_run
    code, shown, err = omrl_main("config", "show", "eval", f"model.name={run}")
    assert code == 0, err
    shown = yaml.safe_load(shown)
    assert (shown["env"]["name"], shown["env"]["max_turns"], shown["generation"]["max_new_tokens"]) == (
        "gridworld",
        2,
        4,
    )
    code, out, err = omrl_main("eval", "--model", str(run), "--num-tasks", "1", "--output-dir", str(tmp_path / "eval"))
    assert code == 0, err
    played = json.loads((tmp_path / "eval" / "report.json").read_text())["config"]
    assert (played["env"]["name"], played["env"]["max_turns"], played["generation"]["max_new_tokens"]) == (
        "gridworld", 2, 4,
    )  # fmt: skip


def test_a_checkpoints_model_plays_with_its_runs_settings(omrl_main, trained_run):
    """`RUN/checkpoints/step-N/model`, as omrl itself advises giving, played webshop with the preset's settings."""
    model = next((trained_run / "checkpoints").iterdir()) / "model"
    code, shown, err = omrl_main("config", "show", "eval", f"model.name={model}")
    assert code == 0, err
    shown = yaml.safe_load(shown)
    assert (shown["env"]["name"], shown["env"]["max_turns"], shown["generation"]["max_new_tokens"]) == (
        "gridworld", 2, 4,
    )  # fmt: skip


def test_eval_applies_the_preset_config_show_shows(omrl_main, tmp_path):
    code, shown, _ = omrl_main("config", "show", "eval")
    assert code == 0
    preset_tokens = yaml.safe_load(shown)["generation"]["max_new_tokens"]
    code, out, err = omrl_main("eval", "--env", "gridworld", "--model", "tiny", "--num-tasks", "1", "env.max_turns=1",
                               "--output-dir", str(tmp_path / "eval"))  # fmt: skip
    assert code == 0, err
    played = json.loads((tmp_path / "eval" / "report.json").read_text())["config"]
    assert played["generation"]["max_new_tokens"] == preset_tokens
    assert f"tokens     {preset_tokens} new a reply" in out


def test_a_model_fine_tuned_on_rollouts_plays_with_their_template_unless_a_flag_says_otherwise(omrl_main, tmp_path):
    """SFT on `rollout --template xml` episodes, then eval: it played react, the model's every reply a format
    error; and `--template` lost to a trained run's template, as any flag did."""
    data, run = tmp_path / "expert.parquet", tmp_path / "sft"
    code, _, err = omrl_main("rollout", "--env", "gridworld", "--expert", "--template", "xml", "--num-tasks", "4",
                             "--model", "tiny", "-o", str(data))  # fmt: skip
    assert code == 0, err
    code, _, err = omrl_main("sft", "--model", "tiny", "--dataset", str(data), "--output-dir", str(run),
                             "num_train_epochs=1", "logging.tensorboard=false")  # fmt: skip
    assert code == 0, err
    evaluate = ("eval", "--model", str(run), "--num-tasks", "1")
    code, out, err = omrl_main(*evaluate, "--output-dir", str(tmp_path / "ev1"))
    said = " ".join((out + err).split())
    assert code == 0 and f"as {run} trained: env.template=xml" in said and "template xml" in said, said
    assert "turns the env's own cap" in said  # not the eval preset's webshop cap (8), which cut gridworld short
    code, out, err = omrl_main(*evaluate, "--template", "react", "--output-dir", str(tmp_path / "ev2"))
    said = " ".join((out + err).split())
    assert code == 0 and "env.template=xml" not in said and "template react" in said, said


def test_a_game_trained_against_a_fixed_opponent_is_evaluated_against_it(tmp_path):
    """eval of a run trained against the env's scripted player played it against itself, and said nothing."""
    from omrl.cli.settings import settings_as_trained, trained_settings
    from omrl.config import load_config
    from omrl.config.options import EvalRunConfig

    seats = {"player_0": "policy", "player_1": "scripted", "player_2": "past:2"}
    config = {"env": {"name": "duel", "template": "react"}, "seats": {"play": seats}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    trained = trained_settings(str(tmp_path), "duel")
    assert trained["seats.play"] == {"player_0": "policy", "player_1": "scripted"}  # past: the run's own checkpoints
    printed = []
    console = type("Console", (), {"print": lambda self, line, **_: printed.append(line)})()
    cfg = load_config(EvalRunConfig, None, [f"model.name={tmp_path}", "seats.play.player_0=model:tiny"])
    settings_as_trained(cfg, [], trained, console)
    assert cfg.seats.play == {"player_0": "model:tiny", "player_1": "scripted"}  # the command line's seat wins
    assert "seats.play={player_0: model:tiny, player_1: scripted}" in printed[0]
    assert "seats.play" not in trained_settings(str(tmp_path), "gridworld")  # another env: no seats of this game


def test_a_mixture_whose_envs_each_weigh_their_own_rewards_shows_no_run_weights_as_theirs():
    """The block began "reward {goal: 1}", a weighting no env of the run used."""
    from omrl.cli.settings import settings_block
    from omrl.config import command_line_config
    from omrl.config.options import TrainRunConfig

    mix = (
        "env.mix=[{name: gridworld, weight: 0.5, reward: {goal: 1.0, format: 0.1}}, "
        "{name: reasoning-gym:basic_arithmetic, weight: 0.5, reward: {goal: 2.0}}]"
    )
    block = settings_block(command_line_config(TrainRunConfig, [mix], {}))
    assert "reward     each env its own (last_token)\n" in block
    assert "           gridworld: {goal: 1, format: 0.1}" in block
