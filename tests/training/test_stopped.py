"""A run a deadline or a failed reward stops says what it kept and how to go on, never in a circle."""

from __future__ import annotations

import shlex
from types import SimpleNamespace

import pytest

from omrl.errors import EndpointError, FailedStep
from omrl.supervisor import StageStalled
from omrl.training.checkpoint import CheckpointError, checkpoint_path
from omrl.training.recipe import run_recipe
from omrl.training.resume import check_same_config, resume_checkpoint, resume_point
from omrl.training.rollout_health import RolloutHealth


class StoppedRecipe:
    """A recipe that did ``steps`` steps and then stops with ``stop``; its checkpoints are bare markers."""

    def __init__(self, output_dir, steps: int, stop: Exception, failed_reason: str = ""):
        self.cfg = SimpleNamespace(
            logging=SimpleNamespace(output_dir=str(output_dir)), env=SimpleNamespace(name="grid")
        )
        self.output_dir, self.step, self.stop = output_dir, steps, stop
        self.run = SimpleNamespace(health=RolloutHealth(failed_step=failed_reason, failed_tries=3))
        self.saved: list[int] = []

    def setup(self) -> None:
        pass

    def train(self) -> None:
        raise self.stop

    def cleanup(self) -> None:
        pass

    def save_checkpoint(self):
        path = checkpoint_path(self.output_dir, self.step)
        path.mkdir(parents=True)
        (path / "COMPLETE").write_text(f"step {self.step}\n")
        self.saved.append(self.step)
        return path


def stalled(stage: str, keepable: bool) -> StageStalled:
    stall = StageStalled(f"a stage did not finish within deadlines.{stage}_s=5 (step 3)", stage)
    stall.keepable = keepable  # the rollout handed the stalled step's tasks back
    return stall


def test_a_stall_before_the_update_keeps_the_steps_done_and_names_the_resume(tmp_path):
    run = tmp_path / "my run"
    recipe = StoppedRecipe(run, steps=2, stop=stalled("generate", keepable=True))
    with pytest.raises(StageStalled) as stopped:
        run_recipe(recipe, "train")
    message = str(stopped.value)
    assert recipe.saved == [2] and f"the newest checkpoint is {checkpoint_path(run, 2)}" in message
    resume = shlex.split(message.split("continue with ", 1)[1].split(" (", 1)[0])
    assert resume == ["omrl", "train", "--resume", "--output-dir", str(run)]
    assert "deadlines.generate_s" in message and stopped.value.stage == "generate"


def test_a_stall_after_the_update_keeps_only_the_checkpoints_before_it(tmp_path):
    recipe = StoppedRecipe(tmp_path, steps=2, stop=stalled("weight_sync", keepable=False))
    with pytest.raises(StageStalled, match="no step was done before it: nothing to resume") as stopped:
        run_recipe(recipe, "train")
    assert recipe.saved == [] and "another output_dir, or delete this one" in str(stopped.value)


def test_a_run_stopped_before_its_first_checkpoint_is_not_sent_round_in_a_circle(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(CheckpointError) as fresh:
        resume_point(tmp_path, {"seed": 0}, resume=False)
    with pytest.raises(CheckpointError) as resumed:
        resume_checkpoint(tmp_path, {"seed": 0})
    assert "--resume" not in str(fresh.value)  # a fresh run is refused: resuming is no way out either
    assert "without --resume to start fresh" not in str(resumed.value)
    assert "stopped before its first checkpoint" in str(resumed.value) and "another output_dir" in str(resumed.value)


def test_a_hung_reward_is_named_as_the_reward_not_the_env(tmp_path):
    reason = "reward 'hang_reward': a reward function did not finish within deadlines.reward_s=3 (step 1)"
    health = RolloutHealth(failed_step=reason, failed_tries=3)
    failure = FailedStep(health.failed_step_message(1, "grid"), keepable=True)
    recipe = StoppedRecipe(tmp_path, steps=0, stop=failure, failed_reason=reason)
    with pytest.raises(FailedStep) as stopped:
        run_recipe(recipe, "train")
    message = str(stopped.value)
    assert message.startswith("step 1: every episode failed in the reward 'hang_reward' in 3 rollouts in a row")
    assert "env is back" not in message and "every episode failed in the env" not in message
    assert (
        "fix the reward 'hang_reward' or bring back the service it calls (or give it longer: deadlines.reward_s)"
        in message
    )


def test_an_env_that_failed_still_gets_the_env_advice(tmp_path):
    failure = FailedStep("step 3: every episode failed in the env 'grid' (the last reason: 503)", keepable=True)
    recipe = StoppedRecipe(tmp_path, steps=2, stop=failure, failed_reason="503")
    with pytest.raises(FailedStep, match="bring the env back") as stopped:
        run_recipe(recipe, "train")
    assert recipe.saved == [2] and "--resume --output-dir" in str(stopped.value)


def test_a_generation_server_that_failed_names_the_checkpoint_and_the_resume(tmp_path):
    """'cannot reach .../v1/completions' stopped the run (exit 2) without saying how to go on."""
    down = EndpointError("cannot reach http://127.0.0.1:9/v1/completions: [Errno 111] Connection refused")
    recipe = StoppedRecipe(tmp_path, steps=3, stop=down)
    with pytest.raises(EndpointError, match="no checkpoint was written before it: run again once the server"):
        run_recipe(recipe, "train")
    recipe.save_checkpoint()
    with pytest.raises(EndpointError) as stopped:
        run_recipe(recipe, "train")
    message = str(stopped.value)
    assert message.startswith("cannot reach") and f"the newest checkpoint is {checkpoint_path(tmp_path, 3)}" in message
    assert "generation.base_url may change" in message and "--resume --output-dir" in message
    assert recipe.saved == [3]  # the step it stopped in is not kept: its rollout was not finished


def test_the_servers_address_and_patience_may_change_on_resume_its_sampling_not():
    saved = {"generation": {"base_url": "http://a:8000/v1", "request_timeout_s": 120.0, "request_retries": 3}}
    check_same_config(
        saved, {"generation": {"base_url": "http://b:8000/v1", "request_timeout_s": 600.0, "request_retries": 9}}
    )
    with pytest.raises(CheckpointError, match="generation.temperature: 1.0 -> 0.7"):
        check_same_config({"generation": {"temperature": 1.0}}, {"generation": {"temperature": 0.7}})


def test_a_mixtures_env_failures_name_the_env_that_failed_not_the_mixture():
    """It said 2 of the run's 4 episodes failed in the env 'coinflip,strreset': coinflip had failed none."""
    from omrl.errors import EnvFailure

    health = RolloutHealth()
    health.add(4, 2, 2, 10, "reset failed: env 'strreset' returned 5", envs=["strreset", "strreset"])
    with pytest.raises(EnvFailure, match=r"2 of the run's 4 episodes \(50%\) failed in the env 'strreset', more"):
        health.check_error_rate("coinflip,strreset", 0.1, "run")
    health.add(2, 2, 0, 10, "step failed: down", envs=["coinflip"])
    assert health.failed_in("coinflip,strreset") == "the envs 'strreset', 'coinflip'"
    assert RolloutHealth().the_env("gridworld") == "the env 'gridworld'"
    restored = RolloutHealth()
    restored.load_state_dict(health.state_dict())
    assert restored.failed_envs == ["strreset", "coinflip"]
