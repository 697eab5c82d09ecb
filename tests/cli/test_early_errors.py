"""Errors that need no model arrive before one loads: a missing env package, unknown algorithm names."""

from __future__ import annotations

import pytest

from tests.fakes import KeyEnv, Registers


class NotInstalledEnv(KeyEnv):
    """An env whose engine package is not installed."""

    package = "omrl-no-such-engine"
    extra = "no-such-engine"


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: what is refused must be refused before."""

    def from_pretrained(*args, **kwargs):
        raise AssertionError("a model was loaded before the error")

    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", from_pretrained)


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
        ("algorithm.advantage=foo", "unknown algorithm 'foo'"),
        ("algorithm.policy_loss=clip", "unknown policy loss 'clip'"),
        ("algorithm.kl_estimator=k4", "unknown kl 'k4'"),
    ],
)
def test_an_unknown_algorithm_name_is_refused_before_loading(override, message, omrl_main, no_model, tmp_path):
    code, _, err = omrl_main("train", "--env", "gridworld", "--model", "tiny", override,
                             "--output-dir", str(tmp_path / "run"))  # fmt: skip
    assert code == 2
    assert message in err
