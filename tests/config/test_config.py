"""Typed configs: presets, dotted overrides, errors with the key's path and a suggestion."""

from __future__ import annotations

import re

import pytest

from omrl.config import DeprecatedKeyWarning, describe, load_config, parse_overrides, preset_names, read_preset
from omrl.config.options import CONFIG_CLASSES, TrainRunConfig
from omrl.errors import ConfigError


def test_defaults_then_preset_then_overrides():
    cfg = load_config(TrainRunConfig, "grpo", ["algorithm.gamma=0.9", "model.name=tiny", "env.max_turns=3"])
    assert cfg.algorithm.gamma == 0.9 and isinstance(cfg.algorithm.gamma, float)
    assert cfg.model.name == "tiny"
    assert cfg.env.max_turns == 3
    assert cfg.env.name == "webshop"  # from the preset
    assert cfg.optim.max_grad_norm == 1.0  # a default nothing overrode


def test_every_shipped_preset_loads_into_its_config_class():
    assert set(preset_names()) >= {"grpo", "ppo", "sft", "eval"}
    for name in preset_names():
        data = read_preset(name)
        cfg = load_config(CONFIG_CLASSES[data["command"]], name)
        assert cfg.description, f"preset {name} has no description"


def test_unknown_key_names_its_path_and_suggests():
    with pytest.raises(
        ConfigError, match=r"unknown config key 'optim.learning_rat'; did you mean 'optim.learning_rate'"
    ):
        load_config(TrainRunConfig, None, ["optim.learning_rat=0.1"])


def test_a_key_of_a_section_below_is_suggested_with_its_section():
    with pytest.raises(ConfigError, match=r"unknown config key 'strategy'; did you mean 'rollout.strategy'\? Valid"):
        load_config(TrainRunConfig, None, ["strategy=beam"])
    with pytest.raises(ConfigError, match=r"^unknown config key 'zzz'; valid keys here: command, "):
        load_config(TrainRunConfig, None, ["zzz=1"])


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match=r"'group_size' expects int, got 'many'"):
        load_config(TrainRunConfig, None, ["group_size=many"])
    with pytest.raises(ConfigError, match=r"'model.trust_remote_code' expects bool"):
        load_config(TrainRunConfig, None, ["model.trust_remote_code=3"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("eval_tasks=-3", "config key 'eval_tasks' must be >= 0, got -3"),  # once: every test task but 3
        ("eval_temperature=-1", "config key 'eval_temperature' must be >= 0, got -1"),
        ("generation.gpu_memory_utilization=1.5", "'generation.gpu_memory_utilization' must be between 0 and 1"),
        ("optim.max_grad_norm=-1", "config key 'optim.max_grad_norm' must be >= 0, got -1"),
        ("deadlines.eval_s=-5", "config key 'deadlines.eval_s' must be >= 0, got -5"),
    ],
)
def test_a_number_out_of_its_keys_range_is_refused_when_the_config_loads(override, message):
    with pytest.raises(ConfigError) as caught:
        load_config(TrainRunConfig, "grpo", [override])
    assert message in str(caught.value)
    assert load_config(TrainRunConfig, "grpo", ["eval_tasks=0", "deadlines.eval_s=0"]).eval_tasks == 0  # the bounds


def test_an_integer_too_large_for_a_float_is_a_config_error():
    # found by the property test: float() of a 400-digit integer raised OverflowError, "a bug in omrl"
    too_large = r"optim.learning_rate' expects a number, got an integer too large .*400 digits"
    with pytest.raises(ConfigError, match=too_large):
        load_config(TrainRunConfig, None, ["optim.learning_rate=" + "1" * 400])


def test_exponent_without_a_dot_is_a_float():
    cfg = load_config(TrainRunConfig, None, ["optim.learning_rate=1e-4"])
    assert cfg.optim.learning_rate == 1e-4


def test_plugin_block_is_free_form_per_plugin():
    cfg = load_config(TrainRunConfig, None, ["plugins.webshop.items_path=/data/items.json", "plugins.gridworld.size=7"])
    assert cfg.plugins == {"webshop": {"items_path": "/data/items.json"}, "gridworld": {"size": 7}}


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match="not key=value"):
        parse_overrides(["algo"])
    assert parse_overrides(["a.b=[1, 2]", "c=x y"]) == [(["a", "b"], [1, 2]), (["c"], "x y")]


def test_a_mapping_override_replaces_and_a_dotted_one_sets_a_leaf():
    cfg = load_config(TrainRunConfig, "grpo", ["reward.weights={goal: 2.0}"])
    assert cfg.reward.weights == {"goal": 2.0}  # the preset's format weight is gone
    cfg = load_config(TrainRunConfig, "grpo", ["reward.weights.goal=2.0"])
    assert cfg.reward.weights == {"goal": 2.0, "format": 0.1, "tag_count": 0.1}


def test_a_mistake_in_a_yaml_file_names_the_file(tmp_path):
    """`steps: one` in a file said "config key 'steps' expects int", naming no file; an override's still names none."""
    bad = tmp_path / "mine.yaml"
    bad.write_text("steps: one\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(bad))}: config key 'steps' expects int"):
        load_config(TrainRunConfig, bad)
    with pytest.raises(ConfigError, match=r"^config key 'steps' expects int"):
        load_config(TrainRunConfig, "grpo", ["steps=one"])


def test_bad_preset_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown preset 'nope'; valid: .*grpo"):
        read_preset("nope")
    with pytest.raises(ConfigError, match=r"unknown preset 'grpo-gridwrld'; did you mean 'grpo-gridworld'\? Valid: "):
        read_preset("grpo-gridwrld")  # a typo, as env and key typos are answered
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        read_preset(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        read_preset(listy)


def test_every_field_has_help():
    for cls in CONFIG_CLASSES.values():
        for key, _type, _default, help_text in describe(cls):
            assert help_text, f"{cls.__name__}.{key} has no help text"


def test_a_preset_for_another_command_is_refused():
    from omrl.config.options import SftRunConfig

    with pytest.raises(ConfigError, match=r"preset 'grpo' is for `omrl train`, not `omrl sft`"):
        load_config(SftRunConfig, "grpo")


def test_typed_values_apply_last():
    cfg = load_config(TrainRunConfig, "grpo", ["steps=7"], {"steps": 7, "logging.output_dir": "/tmp/a: b"})
    assert cfg.steps == 7 and cfg.logging.output_dir == "/tmp/a: b"  # over the preset's steps: 2


def test_a_flag_and_an_override_that_disagree_are_refused():
    with pytest.raises(ConfigError, match=r"the override steps=3 and the flag for steps \(7\) disagree"):
        load_config(TrainRunConfig, "grpo", ["steps=3"], {"steps": 7})
    with pytest.raises(ConfigError, match=r"override algorithm.name='ppo' and the flag for algorithm.name \('grpo'\)"):
        load_config(TrainRunConfig, "grpo", ["algo=ppo"], {"algorithm.name": "grpo"})  # old key, same setting


def test_renamed_keys_still_work_with_one_warning(tmp_path):
    preset = tmp_path / "old.yaml"
    preset.write_text("command: train\nalgo: ppo\nadvantage: gae\nkl_coef: 0.1\nalgorithm: {gamma: 0.9}\n")
    with pytest.warns(DeprecatedKeyWarning, match="algo -> algorithm.name, advantage -> algorithm.advantage") as seen:
        cfg = load_config(TrainRunConfig, preset)
    assert len(seen) == 1
    assert (cfg.algorithm.name, cfg.algorithm.advantage, cfg.algorithm.kl_coef, cfg.algorithm.gamma) == (
        "ppo",
        "gae",
        0.1,
        0.9,
    )
    preset.write_text("command: train\nalgo: ppo\nalgorithm: {name: grpo}\n")
    with pytest.raises(ConfigError, match="algo='ppo' and algorithm.name='grpo' disagree; give algorithm.name only"):
        load_config(TrainRunConfig, preset)


def test_a_key_below_a_renamed_one_is_an_unknown_key_not_one_inside_its_value():
    """``algo`` was renamed to ``algorithm.name`` (a value): ``algo.gamma`` is no key below it."""
    with pytest.raises(ConfigError, match="unknown config key 'algo'; did you mean 'algorithm'"):
        load_config(TrainRunConfig, "grpo", ["algo.gamma=0.99"])
    with pytest.raises(ConfigError, match=r"override 'nokey' is not key=value \(e.g. optim.learning_rate=1e-5\)"):
        load_config(TrainRunConfig, "grpo", ["nokey"])


def test_a_yaml_file_that_does_not_parse_is_one_line_naming_where(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("command: train\nsteps: [1, 2\nfoo: 3\n")
    with pytest.raises(ConfigError) as refused:
        load_config(TrainRunConfig, bad)
    assert str(refused.value) == f"{bad} is not valid YAML at line 3, column 4: expected ',' or ']', but got ':'"


def test_a_key_given_twice_in_a_yaml_file_is_refused(tmp_path):
    preset = tmp_path / "twice.yaml"
    preset.write_text("command: train\nsteps: 3\nsteps: 5\n")
    with pytest.raises(ConfigError, match="the key 'steps' is given twice"):
        load_config(TrainRunConfig, preset)


def test_setting_one_key_keeps_the_sections_own_defaults():
    from omrl.config.options import EvalRunConfig

    cfg = load_config(EvalRunConfig, None, [], {"env.name": "gridworld"})
    assert cfg.env.name == "gridworld"
    assert cfg.env.split == "test" and cfg.generation.temperature == 0.0  # EvalRunConfig's defaults, not EnvConfig's


def test_a_mapping_written_without_a_space_after_the_colon_is_explained():
    with pytest.raises(ConfigError, match=r"write a space after the colon: \{goal: 1\}"):
        load_config(TrainRunConfig, None, ["reward.weights={goal:1}"])


def test_a_config_file_that_is_not_utf8_is_named(tmp_path):
    preset = tmp_path / "latin1.yaml"
    preset.write_bytes("description: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.yaml is not UTF-8 text \(byte 16\)"):
        load_config(TrainRunConfig, preset)


def test_the_webshop_presets_start_from_the_webshop_model_and_other_envs_from_its_base(tmp_path):
    from rich.console import Console

    from omrl.cli.model_prompts import start_from_base_outside_its_env
    from omrl.config import command_line_config

    console = Console(record=True, width=200)

    def train_config(args, model=None, env=None):  # as `omrl train ARGS --model M --env E` builds it
        cfg = command_line_config(TrainRunConfig, args, {"model.name": model, "env.name": env}, "grpo")
        start_from_base_outside_its_env(cfg, args, model, console)
        return cfg.model.name, cfg.env.demonstration

    for preset in ("grpo", "ppo", "dpo"):
        cfg = load_config(TrainRunConfig, preset)
        assert (cfg.model.name, cfg.env.name, cfg.env.demonstration) == ("smollm2-135m-webshop", "webshop", False)
        assert train_config([preset]) == ("smollm2-135m-webshop", False)  # webshop itself: unchanged
    assert train_config([], env="gridworld") == ("smollm2-135m", True)
    assert "fine-tuned for webshop, not gridworld" in console.export_text()
    assert train_config(["env.name=gridworld", "env.demonstration=false"]) == ("smollm2-135m", False)
    # the user's choice of model is kept: a flag, an override, or their own YAML
    assert train_config([], model="smollm2-135m-webshop", env="gridworld") == ("smollm2-135m-webshop", False)
    assert train_config(["model.name=smollm2-135m-webshop", "env.name=gridworld"])[0] == "smollm2-135m-webshop"
    mine = tmp_path / "mine.yaml"
    mine.write_text(
        "command: train\nmodel: {name: smollm2-135m-webshop}\nenv: {name: gridworld, demonstration: false}\n"
    )
    assert train_config([str(mine)]) == ("smollm2-135m-webshop", False)


def test_eval_rollout_and_sweep_play_a_model_on_the_prompts_it_was_trained_on(tmp_path):
    from rich.console import Console

    from omrl.cli.model_prompts import prompts_as_trained
    from omrl.config import command_line_config
    from omrl.config.options import EvalRunConfig

    console = Console(record=True, width=200)

    def eval_demonstration(args, model):  # as `omrl eval ARGS --model M --env webshop` builds it
        cfg = command_line_config(EvalRunConfig, args, {"model.name": model, "env.name": "webshop"})
        prompts_as_trained(cfg, args, console)
        return cfg.env.demonstration

    assert eval_demonstration([], "smollm2-135m") is True  # the base model: the env's default
    assert eval_demonstration([], "smollm2-135m-webshop") is False  # tuned without the worked example
    assert "smollm2-135m-webshop was trained on webshop without its worked example" in console.export_text()
    assert eval_demonstration(["env.demonstration=true"], "smollm2-135m-webshop") is True  # the user's choice
    # a run directory: its config.yaml says what it trained on, for that env only
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("env:\n  name: webshop\n  demonstration: false\n")
    assert eval_demonstration([], str(run)) is False
    (run / "config.yaml").write_text("env:\n  name: gridworld\n  demonstration: false\n")
    assert eval_demonstration([], str(run)) is True
    (run / "config.yaml").write_text("env: [not, a, run, config\n")
    assert eval_demonstration([], str(run)) is True
    mine = tmp_path / "mine.yaml"
    mine.write_text("command: eval\nenv: {demonstration: true}\n")
    assert eval_demonstration([str(mine)], "smollm2-135m-webshop") is True
    # an SFT run: trained on its episodes' rows, which never hold the worked example, for their envs only
    from omrl.data import Episode, write_episodes

    data = tmp_path / "expert.parquet"
    write_episodes([Episode(env="webshop", task_id=0, split="train", instruction="")], data)
    (run / "config.yaml").write_text(f"command: sft\ndataset: {data}:0.5,{data.with_name('other.jsonl')}:0.5\n")
    data.with_name("other.jsonl").write_text('{"messages": []}\n')
    assert eval_demonstration([], str(run)) is False
    write_episodes([Episode(env="gridworld", task_id=0, split="train", instruction="")], data)
    assert eval_demonstration([], str(run)) is True


def test_a_run_s_model_plays_the_env_it_trained_on_unless_the_command_line_names_one(tmp_path):
    from omrl.cli.play_flags import config_with_select
    from omrl.config.options import EvalRunConfig, RolloutRunConfig, SweepRunConfig

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("env:\n  name: gridworld\n  max_turns: 6\n")

    def env_of(cls, args=(), env=None, preset=None):  # as `omrl eval|rollout|sweep ARGS --model RUN --env ENV`
        cfg = config_with_select(cls, list(args), {"model.name": str(run), "env.name": env}, None, preset)
        return cfg.env.name, cfg.env.mix

    assert env_of(EvalRunConfig, preset="eval") == ("gridworld", [])  # not the eval preset's webshop
    assert env_of(RolloutRunConfig) == env_of(SweepRunConfig) == ("gridworld", [])
    assert env_of(EvalRunConfig, env="webshop", preset="eval")[0] == "webshop"  # --env
    assert env_of(EvalRunConfig, ["env.name=webshop"], preset="eval")[0] == "webshop"
    mine = tmp_path / "mine.yaml"
    mine.write_text("command: eval\nenv: {name: webshop}\n")
    assert env_of(EvalRunConfig, [str(mine)], preset="eval")[0] == "webshop"  # a preset of the user's own
    assert env_of(EvalRunConfig, ["eval"], preset="eval")[0] == "gridworld"  # the shipped one, named
    (run / "config.yaml").write_text("env:\n  name: gridworld\n  mix: [gridworld, webshop]\n")
    assert env_of(EvalRunConfig, preset="eval") == ("gridworld", ["gridworld", "webshop"])
    (run / "config.yaml").write_text("env: [not, a, run, config\n")
    assert env_of(EvalRunConfig, preset="eval")[0] == "webshop"  # not a run's folder: the preset's env


def test_user_sets_sees_overrides_sections_and_the_users_own_yaml_only(tmp_path):
    from omrl.config import user_sets

    assert user_sets(["env.demonstration=false"], "env.demonstration")
    assert user_sets(["grpo", "env={name: webshop, demonstration: false}"], "env.demonstration")
    assert not user_sets(["grpo", "env.name=webshop"], "env.demonstration")
    assert not user_sets(["grpo"], "env.demonstration")  # a shipped preset's value is a default
    mine = tmp_path / "mine.yaml"
    mine.write_text("env: {name: webshop}\n")
    assert not user_sets([str(mine)], "env.demonstration")
    assert user_sets([str(mine)], "env.name")


def test_described_defaults_are_the_commands_own():
    from omrl.config import describe
    from omrl.config.options import EvalRunConfig, SftRunConfig

    eval_rows = {key: default for key, _, default, _ in describe(EvalRunConfig)}
    sft_rows = {key: default for key, _, default, _ in describe(SftRunConfig)}
    assert eval_rows["env.split"] == "'test'" and eval_rows["generation.temperature"] == "0.0"
    assert sft_rows["optim.learning_rate"] == repr(SftRunConfig().optim.learning_rate)
    assert sft_rows["logging.output_dir"] == "'runs/sft'"


def test_a_text_keys_override_keeps_the_text_as_typed():
    """YAML reads 0755, 2024_01_05, 12:30, 007 and 0x10 as numbers: a run wrote to 493/, split '7'."""
    from omrl.config.options import EvalRunConfig

    cfg = load_config(
        TrainRunConfig,
        None,
        ["logging.output_dir=2024_01_05", "description=12:30", "env.split=007", "logging.wandb_project=0x10"],
    )
    assert (cfg.logging.output_dir, cfg.description, cfg.env.split) == ("2024_01_05", "12:30", "007")
    assert cfg.logging.wandb_project == "0x10"
    assert load_config(EvalRunConfig, None, ["output_dir=0755"]).output_dir == "0755"
    assert load_config(TrainRunConfig, None, ["description='quoted'"]).description == "quoted"  # YAML text
    assert load_config(TrainRunConfig, None, ["steps=0x10"]).steps == 16  # a number key reads YAML numbers


def test_a_plugins_text_option_keeps_the_text_as_typed():
    """`plugins.dataset.instruction=Note: be brief` was read as the mapping {Note: be brief} and refused."""
    from omrl.cli.env_options import parse_options

    overrides = ["plugins.dataset.instruction=Note: be brief", "plugins.gridworld.size=7", "plugins.mcp.command=true"]
    plugins = load_config(TrainRunConfig, None, overrides).plugins
    assert plugins["dataset"]["instruction"] == "Note: be brief"
    assert plugins["gridworld"]["size"] == 7  # a number option reads YAML numbers
    assert plugins["mcp"]["command"] is True  # declared text or a list of words: YAML decides, the env refuses
    assert parse_options(["instruction=yes", "max_attempts=2"], "dataset") == {"instruction": "yes", "max_attempts": 2}


@pytest.mark.parametrize("key", ["num_tasks", "group_size"])
def test_a_rollout_of_no_tasks_or_no_samples_is_refused_when_the_config_loads(key):
    """`--group-size 0` started the run (a bar of 0/8) before "group_size must be >= 1"."""
    from omrl.config.options import RolloutRunConfig

    with pytest.raises(ConfigError, match=f"config key '{key}' must be >= 1, got 0"):
        load_config(RolloutRunConfig, None, [f"{key}=0"])
