"""Errors that need no model arrive before one loads: a missing env package, unknown algorithm names."""

from __future__ import annotations

import pytest

from tests.fakes import KeyEnv, Registers


class NotInstalledEnv(KeyEnv):
    """An env whose engine package is not installed."""

    package = "omrl-no-such-engine"
    extra = "no-such-engine"


@pytest.mark.parametrize("command", ["eval", "rollout", "train"])
def test_a_missing_env_package_is_named_with_its_extra_before_loading(command, omrl_main, register_plugin, no_model,
                                                                      tmp_path):  # fmt: skip
    register_plugin(Registers({"missing-engine": NotInstalledEnv}), name="test-missing-engine")
    out = ("--output-dir", str(tmp_path / "out")) if command != "rollout" else ("-o", str(tmp_path / "e.parquet"))
    code, _, err = omrl_main(command, "--env", "missing-engine", "--model", "tiny", *out)
    assert code == 2
    assert "the missing-engine env needs the package omrl-no-such-engine, not installed: " in err
    assert "pip install 'omrl[no-such-engine]'" in err


@pytest.mark.parametrize(
    "override, message",
    [
        ("algorithm.advantage=foo", "unknown advantage estimator 'foo'"),
        ("algorithm.policy_loss=clip", "unknown policy loss 'clip'"),
        ("algorithm.kl_estimator=k4", "unknown KL estimator 'k4'"),
        ("model.dtype=fp16", "'model.dtype' must be one of 'float32', 'bfloat16', 'float16', got 'fp16'"),
    ],
)
def test_an_unknown_algorithm_or_dtype_is_refused_before_loading(override, message, omrl_main, no_model, tmp_path):
    code, _, err = omrl_main("train", "--env", "gridworld", "--model", "tiny", override,
                             "--output-dir", str(tmp_path / "run"))  # fmt: skip
    assert code == 2
    assert message in err


@pytest.mark.parametrize(
    "override, message",
    [
        ("reward.allocation=foo", "unknown reward allocation 'foo'; valid: "),
        ("reward.gamma=2", "gamma must be a number in [0, 1], got 2.0"),
        ("reward.weights.goall=1", "unknown reward 'goall'"),
    ],
)
def test_a_bad_reward_setting_is_refused_before_the_run_folder_is_made(
    override, message, omrl_main, no_model, tmp_path
):
    code, _, err = omrl_main("train", "--env", "gridworld", "--model", "tiny", override,
                             "--output-dir", str(tmp_path / "run"))  # fmt: skip
    assert code == 2 and message in err, err
    assert not (tmp_path / "run").exists()


REWARD_OPTIONS = {  # a weighted reward's options: what the run says before it plays anything
    "judge scale=foo": "reward 'judge' option scale='foo' is invalid",
    "judge base_url=127.0.0.1:8000/v1 model=m": "is not an http:// or https:// URL with a host",
    "judge model=m": "reward 'judge' with backend=openai needs base_url and model",
    "judge rubric_file=/no/such/rubric.txt": "reward 'judge' cannot read rubric_file='/no/such/rubric.txt'",
    "rm path=/no/such/rm": "reward 'rm' option path='/no/such/rm' holds no reward model",
    "rm": "reward 'rm' needs the option path",
    "goal colour=red": "reward 'goal' does not take options ['colour']",
}


@pytest.mark.parametrize("words", list(REWARD_OPTIONS))
@pytest.mark.parametrize("command", ["train", "rollout"])
def test_a_rewards_bad_option_is_refused_before_anything_is_played(command, words, omrl_main, no_model, tmp_path):
    """Each was found only once the first rollout had been played, to be scored."""
    name, *options = words.split()
    out = ("--output-dir", str(tmp_path / "run")) if command == "train" else ("-o", str(tmp_path / "e.parquet"))
    code, _, err = omrl_main(command, "--env", "gridworld", "--model", "tiny", *out,
                             f"reward.weights.{name}=1", *(f"plugins.{name}.{o}" for o in options))  # fmt: skip
    assert code == 2, err
    assert REWARD_OPTIONS[words] in " ".join(err.split())
    assert list(tmp_path.iterdir()) == []


def test_a_reward_plugins_own_option_check_is_run_before_anything_is_played(omrl_main, register_plugin, tmp_path):
    from omrl.errors import ConfigError
    from omrl.hookspecs import hookimpl
    from omrl.rewards import episode_reward

    def check(mode="sum"):
        if mode not in ("sum", "mean"):
            raise ConfigError(f"reward 'tally' option mode={mode!r} is invalid; valid: sum, mean")

    class Tally:
        @hookimpl
        def register_rewards(self, register):
            register("tally", episode_reward(lambda ep, mode="sum": 0.0), check_options=check)

    register_plugin(Tally(), name="test-tally")
    code, _, err = omrl_main("rollout", "--env", "gridworld", "--expert", "-o", str(tmp_path / "e.parquet"),
                             "reward.weights.tally=1", "plugins.tally.mode=max")  # fmt: skip
    assert code == 2 and "reward 'tally' option mode='max' is invalid; valid: sum, mean" in err, err
    code, _, err = omrl_main("rollout", "--env", "gridworld", "--expert", "--num-tasks", "1",
                             "-o", str(tmp_path / "e.parquet"), "reward.weights.tally=1", "plugins.tally.mode=mean")  # fmt: skip
    assert code == 0, err


def test_a_reward_plugins_option_message_that_names_no_reward_is_named_for_it(omrl_main, register_plugin, tmp_path):
    """It printed "error: scale must be >= 0", and nothing said which reward's option it was."""
    from omrl.errors import ConfigError
    from omrl.hookspecs import hookimpl
    from omrl.rewards import episode_reward

    def check(scale=1.0):
        if scale < 0:
            raise ConfigError("scale must be >= 0")

    class Scaled:
        @hookimpl
        def register_rewards(self, register):
            register("scaled", episode_reward(lambda ep, scale=1.0: 0.0), check_options=check)

    register_plugin(Scaled(), name="test-scaled")
    code, _, err = omrl_main("rollout", "--env", "gridworld", "--expert", "-o", str(tmp_path / "e.parquet"),
                             "reward.weights.scaled=1", "plugins.scaled.scale=-1")  # fmt: skip
    assert code == 2 and "reward 'scaled' (plugins.scaled): scale must be >= 0" in err, err


def test_a_familys_block_is_refused_where_only_a_member_of_the_family_plays(omrl_main, register_plugin, tmp_path):
    register_plugin(Registers({"fam": KeyEnv, "fam:one": KeyEnv}), name="test-family")
    out = ("--expert", "--num-tasks", "1", "-o", str(tmp_path / "e.parquet"))
    code, _, err = omrl_main("rollout", "--env", "fam:one", *out, "plugins.fam.max_turns=3")
    assert code == 2, err
    assert "plugins.fam is read by the env 'fam' alone, which this run does not play" in " ".join(err.split())
    assert "plugins.fam:one.NAME=VALUE" in err
    code, _, err = omrl_main("rollout", "--env", "fam:one,fam", *out, "plugins.fam.max_turns=3")
    assert "plugins.fam is read" not in err  # fam plays too: the block is its


def test_a_block_for_an_env_the_run_does_not_play_is_warned_of(omrl_main, tmp_path):
    """A config written for webshop, played with --env gridworld: its webshop options do nothing, and say so."""
    out = ("--expert", "--num-tasks", "1", "-o", str(tmp_path / "e.parquet"))
    code, _, err = omrl_main("rollout", "--env", "gridworld", *out, "plugins.webshop.num_products=100")
    said = " ".join(err.split())
    assert code == 0 and "plugins.webshop sets options of the env 'webshop', which this run does not play" in said
    code, _, err = omrl_main("rollout", "--env", "gridworld,webshop", *out, "plugins.webshop.num_products=100")
    assert code == 0 and "does not play" not in err, err  # webshop plays in the mixture: the block is read


def test_a_block_for_a_reward_the_run_does_not_weight_is_warned_of(omrl_main, tmp_path):
    """plugins.judge.model=... with the judge's weight forgotten trained on the goal alone, and said nothing."""
    out = ("--expert", "--num-tasks", "1", "-o", str(tmp_path / "e.parquet"))
    code, _, err = omrl_main("rollout", "--env", "gridworld", *out, "plugins.length_penalty.budget=10")
    said = " ".join(err.split())
    assert code == 0 and "plugins.length_penalty sets options of the reward 'length_penalty', which no env" in said
    assert "weight it ('reward.weights={length_penalty: 1.0}')" in said
    weighted = "reward.weights={goal: 1.0, length_penalty: 0.1}"
    code, _, err = omrl_main("rollout", "--env", "gridworld", *out, "plugins.length_penalty.budget=10", weighted)
    assert code == 0 and "no env of this run weights" not in err, err


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "afile"
    path.write_text("not a folder")
    return path


@pytest.mark.parametrize(
    "words, message",
    [
        (("train", "--env", "gridworld", "--output-dir", "{file}"), "output_dir {file} is a file"),
        (("sft", "--dataset", "x.parquet", "--output-dir", "{file}"), "output_dir {file} is a file"),
        (("train", "--env", "gridworld", "--output-dir", ""), "output_dir is empty"),
        (("eval", "--env", "gridworld", "--output-dir", "{file}/sub"), "{file} is a file, not a folder"),
        (("rollout", "--env", "gridworld", "-o", "{file}/x.parquet"), "{file} is a file, not a folder"),
        (("rollout", "--env", "gridworld", "-o", ""), "--output is empty"),
        (("eval", "--env", "gridworld", "generation.top_p=5"), "generation.top_p in (0, 1]"),
        (("rollout", "--env", "gridworld", "generation.temperature=-1", "-o", "x.parquet"), "temperature=-1"),
        (("eval", "--env", "gridworld", "env.max_turns=-3"), "env.max_turns must be >= 0"),
        (
            ("train", "--env", "gridworld", "model.lora_rank=-2", "--output-dir", "{tmp}/run"),
            "model.lora_rank must be >= 0",
        ),
    ],
)
def test_an_output_or_a_setting_no_run_can_use_is_refused_before_any_work(words, message, omrl_main, no_model,
                                                                           a_file, tmp_path, monkeypatch):  # fmt: skip
    """Each used to crash as an omrl bug after the work (a path under a file), write into the current folder
    (an empty output_dir), or run with it (a top_p of 5, a negative turn cap or LoRA rank) and exit 0."""
    monkeypatch.chdir(tmp_path)
    code, _, err = omrl_main(*(w.format(file=a_file, tmp=tmp_path) for w in words), "--model", "tiny")
    assert code == 2, err
    assert message.format(file=a_file) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing written


def test_a_run_folder_without_checkpoints_is_not_started_over(omrl_main, no_model, tmp_path):
    """A run that stopped before its first checkpoint keeps its metrics.jsonl: a fresh run would replace it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    code, _, err = omrl_main("train", "--env", "gridworld", "--model", "tiny", "--output-dir", str(run))
    assert code == 2 and "holds an earlier run (its metrics.jsonl) with no checkpoint to resume" in err
    assert (run / "metrics.jsonl").read_text() == '{"step": 1, "loss": 0.5}\n'


def test_a_run_is_refused_an_output_dir_that_holds_its_own_preset(omrl_main, no_model, tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "config.yaml").write_text("env:\n  name: gridworld\nsteps: 1\n")
    code, _, err = omrl_main("train", str(project / "config.yaml"), "--model", "tiny", "--output-dir", str(project))
    assert code == 2 and "overlaps the input the preset" in err
    assert (project / "config.yaml").read_text() == "env:\n  name: gridworld\nsteps: 1\n"


@pytest.mark.parametrize(
    "words, named",
    [
        (("view", "x.parquet", "--port", "99999"), "--port"),
        (("env", "serve", "gridworld", "--port", "-1"), "--port"),  # 70000 would serve on 4464, forever
        (("plot", "run", "--dpi", "0"), "--dpi"),
        (("view", "x.parquet", "--out", "x.html", "--max-episodes", "-1"), "--max-episodes"),
        (("env", "play", "gridworld", "--max-turns", "-1"), "--max-turns"),
        (("data", "show", "x.jsonl", "-n", "-1"), "--rows"),  # it printed all but the last
    ],
)
def test_an_option_out_of_its_range_is_refused_naming_it(words, named, omrl_main, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = omrl_main(*words)
    assert code == 2 and f"Invalid value for '{named}'" in err


def test_env_serve_port_0_prints_the_port_it_bound(omrl_main, monkeypatch):
    """Port 0 was refused (its banner would have named port 0): now the banner names the port bound."""
    served = []

    def run_server(app, host, port, announce):
        served.append(port)
        announce(43117)  # the free port the system picked

    monkeypatch.setattr("omrl.serve.run_server", run_server)
    code, _, err = omrl_main("env", "serve", "gridworld", "--port", "0")
    assert code == 0 and served == [0], err
    assert "plugins.agentgym.base_url=http://127.0.0.1:43117 " in " ".join(err.split()), err
    assert ":0 " not in err and ":0/" not in err


@pytest.mark.parametrize("command", ["eval", "rollout"])
@pytest.mark.parametrize("policy", [False, True])
def test_a_search_scorers_reward_model_path_is_checked_before_anything_is_played(command, policy, omrl_main, no_model,
                                                                                 tiny_model_dir, tmp_path):  # fmt: skip
    """best_of_n's select=rm met a path without a reward model only when it first scored: after the rollout."""
    path = tiny_model_dir if policy else str(tmp_path / "no-rm")
    out = ("--output-dir", str(tmp_path / "ev")) if command == "eval" else ("-o", str(tmp_path / "e.parquet"))
    code, _, err = omrl_main(command, "--env", "gridworld", "--model", "tiny", *out, "--strategy", "best_of_n",
                             "--budget", "100", "plugins.best_of_n.select=rm", f"plugins.rm.path={path}")  # fmt: skip
    text = " ".join(err.split())
    assert code == 2 and f"scorer 'rm' option path='{path}' holds no reward model" in text, text
    assert ("it is not an omrl reward model" in text) == policy


def test_a_block_for_an_algorithm_component_is_refused_as_read_by_none(omrl_main, no_model, tmp_path):
    """Estimators take no plugin options, yet their names counted as readers: plugins.grpo.scale=2 was ignored."""
    code, _, err = omrl_main("train", "--env", "gridworld", "--model", "tiny", "plugins.grpo.scale=2",
                             "--output-dir", str(tmp_path / "run"))  # fmt: skip
    text = " ".join(err.split())
    assert code == 2 and "plugins.grpo: grpo is an algorithm component, and those take no plugin options" in text


@pytest.mark.parametrize("command", ["eval", "rollout", "train"])
def test_a_model_that_is_not_there_is_refused_before_the_settings_are_printed(command, omrl_main, no_model, tmp_path):
    out = ("--output-dir", str(tmp_path / "out")) if command != "rollout" else ("-o", str(tmp_path / "e.parquet"))
    code, printed, err = omrl_main(command, "--env", "gridworld", "--model", str(tmp_path / "nope"), *out)
    assert code == 2
    assert f"model '{tmp_path / 'nope'}' not found: no such directory" in err
    assert "gridworld (split" not in printed + err, printed + err  # no settings block before it


def test_a_teacher_that_is_not_there_is_named_by_its_key_before_loading(omrl_main, no_model, tmp_path):
    code, _, err = omrl_main("train", "--env", "gridworld", "--model", "tiny", f"algorithm.teacher={tmp_path / 'nope'}",
                             "--output-dir", str(tmp_path / "run"))  # fmt: skip
    assert code == 2
    assert f"algorithm.teacher '{tmp_path / 'nope'}' not found: no such directory" in err, err


def _nothing_listening() -> str:
    """The URL of a local port no server listens on."""
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{free.getsockname()[1]}"


@pytest.mark.parametrize(
    "command, env, options, refusal",
    [
        ("rollout", "agentgym", ("plugins.agentgym.env_name=textcraft",), "agentgym server {url}: GET / failed"),
        ("train", "agentgym", ("plugins.agentgym.env_name=textcraft",), "agentgym server {url}: GET / failed"),
        ("eval", "openenv", (), "openenv server {url}: GET /health failed"),
    ],
)
def test_a_remote_envs_server_that_is_down_is_refused_before_loading(
    command, env, options, refusal, omrl_main, no_model, tmp_path
):
    """The first request went out after the model had loaded: minutes of a real model's load, then this."""
    url = _nothing_listening()
    out = ("--output-dir", str(tmp_path / "out")) if command != "rollout" else ("-o", str(tmp_path / "e.parquet"))
    code, _, err = omrl_main(command, "--env", env, "--model", "tiny", f"plugins.{env}.base_url={url}", *options, *out)
    err = " ".join(err.split())
    assert code == 2 and refusal.format(url=url) in err and "cannot connect" in err, err
    assert "is the server running?" in err and "bug in omrl" not in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "e.parquet").exists()


def test_config_show_asks_no_server(omrl_main):
    url = _nothing_listening()
    code, out, err = omrl_main("config", "show", "grpo", "env.name=agentgym", f"plugins.agentgym.base_url={url}")
    assert code == 0 and url in out, err


def test_under_a_launch_one_process_asks_the_remote_servers(monkeypatch):
    """Every process asked: a blip seen by any one of them ended the whole run."""
    from omrl.cli.play_checks import check_before_loading
    from omrl.config import load_config
    from omrl.config.options import RolloutRunConfig

    url = _nothing_listening()
    cfg = load_config(
        RolloutRunConfig, None, ["env.name=agentgym", f"plugins.agentgym.base_url={url}", "model.name=tiny"]
    )
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    check_before_loading(cfg)  # not asked here
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(Exception, match="cannot connect"):
        check_before_loading(cfg)
