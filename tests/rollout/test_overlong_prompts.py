"""Episodes whose opening prompt does not fit ``generation.max_context`` never start: the setting failed, not
the model. They count in no success rate and train nothing, and are counted apart (``overlong_prompts``) with
the setting to raise, as verl's ``filter_overlong_prompts`` leaves such prompts out."""

from __future__ import annotations

import json

from omrl.evaluation import evaluate
from omrl.rollout import EnvPool, RolloutLimits, collect
from omrl.training.metrics import rollout_metrics
from omrl.training.rl_data import trainable
from tests.fakes import ActionTemplate, KeyEnv, Registers
from tests.helpers import cli_exit, keys_rollout


class WordyKeyEnv(KeyEnv):
    """The `keys` env whose chest 1 comes with a description too long for a small context."""

    def reset(self, task_id: int):
        first = super().reset(task_id)
        if task_id == 1:
            first.text += " It is carved all over." * 60
        return first


def test_overlong_prompts_are_no_losses_and_train_nothing(tiny_tokenizer):
    """They counted as losses: the expert, which wins every chest it can play, read 75%."""
    episodes = collect(
        EnvPool(WordyKeyEnv, name="keys"),
        ActionTemplate(),
        tiny_tokenizer,
        [0, 1, 2, 3],
        expert=True,
        limits=RolloutLimits(max_new_tokens=16, max_context=300),
    )
    assert [(ep.end_reason, ep.num_turns) for ep in episodes][1] == ("max_context", 0)
    assert all(ep.won for i, ep in enumerate(episodes) if i != 1)
    metrics = evaluate(episodes)
    assert metrics["success_rate"] == 1.0 and metrics["pass@1"] == 1.0
    assert metrics["overlong_prompts"] == 1 and metrics["env_errors"] == 0
    assert "overlong_prompts" not in evaluate([ep for i, ep in enumerate(episodes) if i != 1])  # none: unsaid
    step = rollout_metrics(episodes, 1.0, {})
    assert step["success"] == 1.0 and step["overlong_prompts"] == 1.0 and step["env_errors"] == 0.0
    assert episodes[1] not in trainable(episodes)


def test_omrl_rollout_says_how_many_prompts_were_too_long_and_what_to_raise(
    fake_plugins, register_plugin, tmp_path, capsys
):
    register_plugin(Registers({"keys_wordy": WordyKeyEnv}), name="keys-wordy")
    words = keys_rollout(4, "--expert", "generation.max_context=300", "-o", str(tmp_path / "expert.parquet"))
    words[words.index("keys")] = "keys_wordy"
    code, stdout, stderr = cli_exit(capsys, *words)
    text = " ".join((stdout + stderr).split())
    assert code in (0, None), text
    assert "success_rate │ 100.0%" in text and "overlong_prompts │ 1" in text and "env_errors │ 0" in text
    assert "1 of 4 episodes never started" in text and "generation.max_context=300" in text
    assert "raise generation.max_context" in text
    records = [json.loads(line) for line in (tmp_path / "expert.jsonl").read_text().splitlines()]
    assert [r["end_reason"] for r in records].count("max_context") == 1  # written all the same
