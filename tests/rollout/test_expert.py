"""The scripted expert's rollout: an expert with no action for a state loses the episode (``expert_gave_up``),
which counts in its success rate; an env whose expert never acts has no expert, and that is the env's failure."""

from __future__ import annotations

import pytest

from omrl import registry
from omrl.chat.replies import parse_reply
from omrl.data import read_episodes
from omrl.envs import EnvError
from omrl.evaluation import evaluate
from omrl.rollout import EnvPool, collect
from tests.chat.families import family_tokenizer
from tests.fakes import ActionTemplate, KeyEnv
from tests.helpers import expert_rollout_of


class GivingUpKeyEnv(KeyEnv):
    """The `keys` env whose expert has no move on task 1 at all, and none on task 2 once the chest is open
    (as minigrid's bot gives up on some BabyAI layouts, at the start or halfway)."""

    def expert_action(self) -> str | None:
        if self.task == 1 or (self.task == 2 and self.opened):
            return None
        return super().expert_action()


class NoExpertKeyEnv(KeyEnv):
    """The `keys` env without an expert (an env that has none, a server without the expert route)."""

    def expert_action(self) -> str | None:
        return None


def test_an_expert_that_gives_up_loses_the_episode_and_its_success_rate_counts_it(tiny_tokenizer):
    """It ended as env_error, which left it out of the success rate: 2 wins of 4 read 100%."""
    episodes = collect(
        EnvPool(GivingUpKeyEnv, name="keys"), ActionTemplate(), tiny_tokenizer, [0, 1, 2, 3], expert=True
    )
    assert [ep.end_reason for ep in episodes] == ["done", "expert_gave_up", "expert_gave_up", "done"]
    assert [ep.num_turns for ep in episodes] == [2, 0, 1, 2] and not any(ep.error for ep in episodes)
    metrics = evaluate(episodes)
    assert metrics["success_rate"] == 0.5 and metrics["env_errors"] == 0
    assert metrics["end_reasons"] == {"done": 2, "expert_gave_up": 2}


def test_an_env_whose_expert_never_acts_has_no_expert_and_that_is_the_envs_failure(tiny_tokenizer):
    episodes = collect(EnvPool(NoExpertKeyEnv, name="keys"), ActionTemplate(), tiny_tokenizer, [0, 1], expert=True)
    assert [ep.end_reason for ep in episodes] == ["env_error", "env_error"]
    assert "keys has no scripted expert action" in episodes[0].error


def test_omrl_rollout_expert_reports_the_experts_losses(fake_plugins, register_plugin, tmp_path, capsys):
    out = tmp_path / "expert.parquet"
    code, text = expert_rollout_of(capsys, register_plugin, GivingUpKeyEnv, out, num_tasks=4)
    assert code in (0, None), text
    assert "success_rate │ 50.0%" in text and "env_errors │ 0" in text and "ended: expert_gave_up │ 2" in text
    assert [ep.end_reason for ep in read_episodes(out)].count("expert_gave_up") == 2


def test_omrl_rollout_expert_of_an_env_without_one_exits_2(fake_plugins, register_plugin, tmp_path, capsys):
    code, text = expert_rollout_of(capsys, register_plugin, NoExpertKeyEnv, tmp_path / "expert.parquet")
    assert code == 2 and "every episode failed in the keys_NoExpertKeyEnv expert" in text, text
    assert "has no scripted expert action" in text


@pytest.mark.parametrize(
    ("family", "reply"),
    [
        ("deepseek_r1_distill", "</think>\n\nAct: open<｜end▁of▁sentence｜>"),  # closes the block the prompt opened
        ("gptoss", "<|channel|>final<|message|>Act: open<|return|>"),  # its answer's channel
        ("qwen2_5", "Act: open<|im_end|>"),  # a template that writes the text alone
    ],
)
def test_the_expert_replies_as_the_chat_template_writes_a_reply(family, reply):
    """Expert data teaches the model its own format: the expert's first reply is what the template writes after
    its generation prompt, and read back by the chat layer, it is the answer (never reasoning left open)."""
    tokenizer, react = family_tokenizer(family), registry.templates.get("react")()
    (episode,) = collect(EnvPool(KeyEnv, name="keys"), react, tokenizer, [0], expert=True)
    start, end = episode.turns[0].span
    assert tokenizer.decode(episode.token_ids[start:end], skip_special_tokens=False) == reply
    assert episode.won and [turn.action for turn in episode.turns] == ["open", "take key"]
    assert parse_reply(tokenizer, episode.turns[0].response).answer.strip() == "Act: open"


class ServerDownKeyEnv(KeyEnv):
    """An env server's client whose server went down: its expert route cannot be reached."""

    def expert_action(self):
        raise EnvError("agentgym server http://127.0.0.1:9: GET /expert_action failed: cannot connect (refused)")


def test_an_expert_rollout_whose_env_server_is_down_blames_the_env_not_the_expert(
    fake_plugins, register_plugin, tmp_path, capsys
):
    """It said every episode failed in the agentgym expert, though the server could not be reached at all."""
    code, text = expert_rollout_of(capsys, register_plugin, ServerDownKeyEnv, tmp_path / "expert.parquet")
    assert (
        code == 2
        and "every episode failed in the env" in text
        and "failed in the keys_ServerDownKeyEnv expert" not in text
    ), text
