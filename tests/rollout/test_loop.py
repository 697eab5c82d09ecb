"""The rollout loop: batching, limits and end reasons, bad input, env pools, reproducibility."""

from __future__ import annotations

import pytest

from omrl.backends.hf import HFBackend
from omrl.chat import render
from omrl.data import read_episodes, write_episodes
from omrl.data.conversations import episode_to_record
from omrl.env_results import EMPTY_OBSERVATION
from omrl.envs import DemoTurn
from omrl.errors import OmrlError
from omrl.rollout import EnvPool, RolloutLimits, RolloutProgress, collect
from tests.fakes import ActionTemplate, CountingBackend, IOKeyEnv, KeyEnv, ScriptedBackend


def scripted(tokenizer, replies):
    """A backend answering ``replies[call][index]`` (text) or ``replies(call, index)``."""
    pick = replies if callable(replies) else (lambda call, index: replies[call][index])
    return ScriptedBackend(tokenizer, lambda call, index, prompt: pick(call, index))


def open_then_take(call: int, index: int) -> str:
    """Every episode: open the chest, then take the key."""
    return ["Action: open", "Action: take key"][call]


def run(tokenizer, backend, tasks=(0,), group_size=1, env_class=KeyEnv, options=None, template=None, **limits):
    pool = EnvPool(env_class, options, name="keys")
    episodes = collect(
        pool,
        template or ActionTemplate(),
        tokenizer,
        list(tasks),
        backend=backend,
        group_size=group_size,
        limits=RolloutLimits(**{"max_new_tokens": 24, "max_context": 1024, **limits}),
    )
    return episodes, pool


def test_one_backend_call_per_turn_for_all_live_episodes(tiny_hf):
    model, tokenizer = tiny_hf
    backend = CountingBackend(HFBackend(model, tokenizer, batch_size=4))
    episodes, pool = run(tokenizer, backend, tasks=[0, 1, 2], group_size=2, max_new_tokens=8, max_turns=3)
    assert backend.calls == [6, 6, 6]  # random replies never finish early: all 6 live for 3 turns
    assert [(ep.group, ep.sample, ep.task_id) for ep in episodes] == [
        (0, 0, 0),
        (0, 1, 0),
        (1, 0, 1),
        (1, 1, 1),
        (2, 0, 2),
        (2, 1, 2),
    ]
    assert all(ep.end_reason == "max_turns" and ep.num_turns == 3 for ep in episodes)
    assert pool.created == 6
    for ep in episodes:
        assert all(0 < t.span[1] - t.span[0] <= 8 for t in ep.turns)
        generated = [lp for lp, m in zip(ep.logprobs, ep.loss_mask) if m]
        assert len(generated) == sum(ep.loss_mask) and all(lp < 0 for lp in generated)
        assert all(lp == 0.0 for lp, m in zip(ep.logprobs, ep.loss_mask) if not m)


def test_finished_episodes_leave_the_batch_and_their_envs_play_the_next_task(tiny_tokenizer):
    backend = scripted(tiny_tokenizer, lambda call, index: "Action: open" if call % 2 == 0 else "Action: take key")
    pool = EnvPool(KeyEnv, name="keys")
    episodes = collect(pool, ActionTemplate(), tiny_tokenizer, [0, 1, 2, 3, 4], backend=backend, max_parallel=2)
    assert [ep.task_id for ep in episodes] == [0, 1, 2, 3, 4]
    assert all(ep.won and ep.end_reason == "done" and ep.num_turns == 2 for ep in episodes)
    assert pool.created == 2  # two instances played all five tasks
    assert backend.calls == [2, 2, 2, 2, 1, 1]


def test_seeded_sampling_is_reproducible(tiny_hf):
    model, tokenizer = tiny_hf
    backend = HFBackend(model, tokenizer)

    def ids(seed):
        pool = EnvPool(KeyEnv, name="keys")
        eps = collect(
            pool,
            ActionTemplate(),
            tokenizer,
            [0],
            backend=backend,
            group_size=2,
            seed=seed,
            limits=RolloutLimits(max_new_tokens=6, max_turns=2),
        )
        return [ep.token_ids for ep in eps]

    first = ids(1)
    assert first == ids(1)
    assert first != ids(2)
    assert first[0] != first[1]  # the G samples of a task differ


def test_end_reasons_and_truncation(tiny_tokenizer):
    eos = tiny_tokenizer.eos_token_id
    long_reply = tiny_tokenizer.encode("Action: " + "wait " * 40, add_special_tokens=False)
    backend = scripted(tiny_tokenizer, lambda call, index: long_reply)
    (ep,), _ = run(tiny_tokenizer, backend, max_new_tokens=10, max_turns=2)
    assert ep.end_reason == "max_turns" and ep.num_turns == 2
    for turn in ep.turns:
        assert turn.info["rollout"] == {"truncated": True, "token_exact": True, "new_tokens": 10}
        assert turn.info["invalid"]  # a cut turn still counts: it parsed and the env stepped
    first_end = ep.turns[0].span[1]
    assert ep.token_ids[first_end] == eos and ep.loss_mask[first_end] == 0

    (ep,), _ = run(tiny_tokenizer, scripted(tiny_tokenizer, lambda c, i: [eos]))
    assert ep.end_reason == "empty_response" and ep.turns[0].response == "" and not ep.turns[0].format_ok

    backend = scripted(tiny_tokenizer, lambda call, index: "Action: look around")
    (ep,), _ = run(tiny_tokenizer, backend, max_context=70)
    assert ep.end_reason == "max_context" and ep.num_turns >= 1 and len(ep.token_ids) < 70


def test_prompt_longer_than_the_context_ends_with_zero_turns(tiny_tokenizer):
    backend = scripted(tiny_tokenizer, lambda call, index: "Action: open")
    (ep,), _ = run(tiny_tokenizer, backend, max_context=10)
    assert ep.end_reason == "max_context" and ep.num_turns == 0 and sum(ep.loss_mask) == 0
    assert backend.calls == [] and ep.prompt_length == len(ep.token_ids) > 10


def test_unparsable_reply_does_not_step_the_env_and_explains_the_format(tiny_tokenizer):
    backend = scripted(tiny_tokenizer, [["I will open it."], ["Action: open"], ["Action: take key"]])
    (ep,), pool = run(tiny_tokenizer, backend)
    bad = ep.turns[0]
    assert (bad.action, bad.format_ok, bad.reward, bad.done) == (None, False, 0.0, False)
    assert "must start with `Action:`" in bad.parse_error
    feedback = ep.messages[3]
    assert feedback["role"] == "user" and bad.parse_error in feedback["content"]
    assert feedback["content"].count(KeyEnv.action_help) == 1
    assert ep.turns[1].observation == feedback["content"]
    assert ep.won and ep.num_turns == 3
    assert pool.probe().steps == 2  # the unparsable turn never reached the env


def test_env_raising_mid_batch_ends_only_its_episode(tiny_tokenizer):
    episodes, pool = run(
        tiny_tokenizer, scripted(tiny_tokenizer, open_then_take), tasks=[0, 1, 2], options={"fail_task": 1}
    )
    broken = episodes[1]
    assert broken.end_reason == "env_error" and "chest 1 exploded" in broken.error
    assert broken.num_turns == 1 and broken.turns[0].action == "open"
    assert [ep.won for ep in episodes] == [True, False, True]
    assert pool.created == 3 and len(pool._all) == 2  # the broken instance was discarded


def test_unknown_task_fails_its_reset_not_the_rollout(tiny_tokenizer):
    episodes, _ = run(tiny_tokenizer, scripted(tiny_tokenizer, open_then_take), tasks=[0, 99])
    assert episodes[0].won
    assert episodes[1].end_reason == "env_error" and "unknown task id 99" in episodes[1].error
    assert episodes[1].num_turns == 0


def test_empty_observation_gets_a_placeholder(tiny_tokenizer):
    (ep,), _ = run(tiny_tokenizer, scripted(tiny_tokenizer, [["Action: open"]]), options={"empty_task": 0}, max_turns=1)
    assert ep.messages[1]["content"].endswith(EMPTY_OBSERVATION)
    assert ep.turns[0].observation == EMPTY_OBSERVATION


def test_io_bound_envs_step_from_threads_with_the_same_result(tiny_tokenizer):
    inline, _ = run(tiny_tokenizer, scripted(tiny_tokenizer, open_then_take), tasks=[0, 1, 2, 3])
    threaded, pool = run(
        tiny_tokenizer, scripted(tiny_tokenizer, open_then_take), tasks=[0, 1, 2, 3], env_class=IOKeyEnv
    )
    assert pool._threads is not None
    assert [ep.token_ids for ep in threaded] == [ep.token_ids for ep in inline]
    assert all(ep.won for ep in threaded)
    pool.close()
    assert pool._threads is None


def test_expert_plays_through_the_template(tiny_tokenizer):
    pool = EnvPool(KeyEnv, name="keys")
    progress = RolloutProgress()
    episodes = collect(pool, ActionTemplate(), tiny_tokenizer, [0, 1], expert=True, progress=progress)
    assert all(ep.won and ep.end_reason == "done" for ep in episodes)
    assert [t.response for t in episodes[0].turns] == ["Action: open", "Action: take key"]
    assert all(t.format_ok for ep in episodes for t in ep.turns)
    assert (
        progress.episodes == 2
        and progress.success_rate == 1.0
        and progress.tokens == sum(sum(ep.loss_mask) for ep in episodes)
    )


def test_won_and_score_come_from_the_last_step(tiny_tokenizer):
    (ep,), _ = run(tiny_tokenizer, scripted(tiny_tokenizer, [["Action: open"]]), max_turns=1)
    assert (ep.won, ep.score, ep.end_reason) == (False, 0.5, "max_turns")


def test_bad_arguments_raise_clear_errors(tiny_tokenizer):
    pool = EnvPool(KeyEnv, name="keys")
    with pytest.raises(OmrlError, match="group_size must be >= 1"):
        collect(pool, ActionTemplate(), tiny_tokenizer, [0], backend=scripted(tiny_tokenizer, []), group_size=0)
    with pytest.raises(OmrlError, match="needs a generation backend"):
        collect(pool, ActionTemplate(), tiny_tokenizer, [0])


def test_parquet_round_trip_of_real_rollout_output(tiny_hf, tmp_path):
    model, tokenizer = tiny_hf
    episodes, _ = run(tokenizer, HFBackend(model, tokenizer), tasks=[0, 1], group_size=2, max_new_tokens=6, max_turns=2)
    back = read_episodes(write_episodes(episodes, tmp_path / "t.parquet"))
    assert len(back) == 4
    for a, b in zip(episodes, back):
        assert (a.token_ids, a.loss_mask, a.messages, a.group, a.sample) == (
            b.token_ids,
            b.loss_mask,
            b.messages,
            b.group,
            b.sample,
        )
        assert [t.span for t in a.turns] == [t.span for t in b.turns]
        assert [t.info for t in a.turns] == [t.info for t in b.turns]
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-5)


class DemoKeyEnv(KeyEnv):
    """KeyEnv with a worked example of another chest."""

    demonstration = (
        DemoTurn("Chest 99 is locked.", "Open it first.", "open"),
        DemoTurn("Chest 99 is open; a key glints inside.", "Now the key.", "take key"),
    )


def test_a_template_error_that_names_the_actions_is_not_followed_by_them_again(tiny_tokenizer):
    from omrl_plugins.templates.react import ReactTemplate

    backend = scripted(tiny_tokenizer, [["I will open it."], ["Think: ok\nAct: open"], ["Think: ok\nAct: take key"]])
    (ep,), _ = run(tiny_tokenizer, backend, template=ReactTemplate())
    assert ep.won and KeyEnv.action_help in ep.turns[0].parse_error
    assert ep.messages[3]["content"].count(KeyEnv.action_help) == 1


def test_a_demonstration_opens_the_chat_masked_out_and_stays_out_of_sft_records(tiny_tokenizer):
    backend = scripted(tiny_tokenizer, open_then_take)
    (ep,), _ = run(tiny_tokenizer, backend, env_class=DemoKeyEnv)
    assert ep.won and ep.demo_messages == 4
    assert [m["role"] for m in ep.messages[:6]] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert ep.messages[2]["content"] == ActionTemplate().format_action("open", KeyEnv()) == "Action: open"
    assert ep.messages[3]["content"] == "Chest 99 is open; a key glints inside."
    # the demonstration is prompt: it precedes every generated token and the ids decode to the whole chat
    prompt = tiny_tokenizer.decode(ep.token_ids[: ep.prompt_length], skip_special_tokens=False)
    assert "Chest 99 is locked." in prompt and "Action: take key" in prompt
    assert sum(ep.loss_mask[: ep.prompt_length]) == 0
    assert render(tiny_tokenizer, ep.messages).startswith(
        tiny_tokenizer.decode(ep.token_ids, skip_special_tokens=False)
    )
    # the model saw the example, but SFT on this episode learns only the episode's own turns
    record = episode_to_record(ep)
    assert [m["content"] for m in record["conversations"]] == [m["content"] for m in ep.messages[:1] + ep.messages[5:]]
    assert not any("99" in m["content"] for m in record["conversations"])


def test_the_readable_jsonl_of_a_rollout_with_a_demonstration_trains_without_it(tiny_tokenizer, tmp_path):
    from omrl.data.conversations import load_conversations
    from omrl.rollout.convert import write_jsonl

    (ep,), _ = run(tiny_tokenizer, scripted(tiny_tokenizer, open_then_take), env_class=DemoKeyEnv)
    write_jsonl([ep], tmp_path / "r.jsonl")
    (conv,) = load_conversations(tmp_path / "r.jsonl")
    assert [m["content"] for m in conv.messages] == [m["content"] for m in ep.messages[:1] + ep.messages[5:]]


def test_a_template_that_cannot_write_the_worked_example_names_the_option_to_turn_it_off(tiny_tokenizer):
    class TwoArgumentTemplate(ActionTemplate):
        def format_action(self, action, env):  # an older plugin's signature, without the thought
            return f"Action: {action}"

    with pytest.raises(OmrlError, match=r"cannot write DemoKeyEnv's worked example .*set env.demonstration=false"):
        run(
            tiny_tokenizer,
            scripted(tiny_tokenizer, open_then_take),
            env_class=DemoKeyEnv,
            template=TwoArgumentTemplate(),
        )


def test_a_deeply_nested_tool_call_reply_is_a_parse_error(tiny_tokenizer):
    from omrl import registry

    backend = scripted(
        tiny_tokenizer,
        [["<tool_call>" + "[" * 1000], ['<tool_call>{"name": "act", "arguments": {"action": "open"}}</tool_call>']],
    )
    (ep,), _ = run(
        tiny_tokenizer,
        backend,
        template=registry.templates.get("tool_call")(),
        max_turns=2,
        max_new_tokens=1100,
        max_context=4096,
    )
    assert ep.turns[0].response.count("[") == 1000
    assert "not valid JSON" in ep.turns[0].parse_error  # Python 3.11: nested too deeply; 3.12: unterminated
    assert ep.turns[1].action == "open" and ep.end_reason == "max_turns"


class BadValueEnv(KeyEnv):
    """KeyEnv whose every step answers with ``value`` as its ``field`` (reward, observation, info) or info[field]."""

    def __init__(self, field: str = "reward", value=0.0):
        super().__init__()
        self.field, self.value = field, value

    def step(self, action):
        result = super().step(action)
        if self.field in ("reward", "observation", "info"):
            setattr(result, self.field, self.value)
        else:
            result.info[self.field] = self.value
        return result


@pytest.mark.parametrize(
    "field, value, shown",
    [
        ("reward", float("nan"), "reward nan"),
        ("reward", float("-inf"), "reward -inf"),
        ("reward", "1", "reward '1'"),
        ("reward", None, "reward None"),
        ("score", 1e999, "score inf"),
        ("score", "0.5", "score '0.5'"),
        pytest.param("score", 10**400, "score 1000", id="score-10**400"),
        ("won", "yes", "won 'yes'"),
        ("won", 1, "won 1"),
        ("won", None, "won None"),
        ("observation", 5, "observation 5"),
        ("info", ["won"], "info ['won']"),
    ],
)
def test_env_values_outside_the_protocol_end_the_episode_as_env_error(tiny_tokenizer, field, value, shown):
    episodes, pool = run(
        tiny_tokenizer,
        scripted(tiny_tokenizer, open_then_take),
        tasks=[0, 1],
        env_class=BadValueEnv,
        options={"field": field, "value": value},
    )
    for ep in episodes:
        assert ep.end_reason == "env_error" and ep.num_turns == 1
        assert ep.error.startswith(f"step failed: env 'keys' returned {shown}")
        assert not ep.won and ep.score == 0.0 and ep.turns[0].reward == 0.0
    assert pool.created == len(pool._all) == 2  # the instances still work: none was discarded


def test_numpy_values_are_fine(tiny_tokenizer):
    import numpy as np

    for field, value in [("reward", np.float32(0.5)), ("score", np.float64(0.5)), ("won", np.bool_(False))]:
        (ep,), _ = run(
            tiny_tokenizer,
            scripted(tiny_tokenizer, open_then_take),
            env_class=BadValueEnv,
            options={"field": field, "value": value},
        )
        assert ep.end_reason == "done" and ep.error is None, (field, ep.error)


class BadResetEnv(KeyEnv):
    """KeyEnv whose reset answers ``value`` (or an Observation with it as ``field``)."""

    def __init__(self, field: str = "", value=None):
        super().__init__()
        self.field, self.value = field, value

    def reset(self, task_id):
        first = super().reset(task_id)
        if not self.field:
            return self.value
        setattr(first, self.field, self.value)
        return first


@pytest.mark.parametrize(
    "field, value, shown",
    [
        ("", None, "returned a NoneType, not an Observation"),
        ("", "A room.", "returned a str, not an Observation"),
        ("instruction", 42, "returned instruction 42; it must be text"),
        ("info", "x", "returned info 'x'"),
    ],
)
def test_reset_values_outside_the_protocol_end_the_episode_as_env_error(tiny_tokenizer, field, value, shown):
    (ep,), _ = run(
        tiny_tokenizer,
        scripted(tiny_tokenizer, open_then_take),
        env_class=BadResetEnv,
        options={"field": field, "value": value},
    )
    assert ep.end_reason == "env_error" and ep.num_turns == 0
    assert ep.error.startswith(f"reset failed: env 'keys' {shown}")


def test_lone_surrogates_from_an_env_are_replaced_so_the_episode_can_be_written(tiny_tokenizer, tmp_path):
    from omrl.data import write_episodes

    (ep,), _ = run(
        tiny_tokenizer,
        scripted(tiny_tokenizer, open_then_take),
        env_class=BadValueEnv,
        options={"field": "observation", "value": "a chest \ud800 glows"},
    )
    assert ep.end_reason == "max_turns" or ep.end_reason == "done"
    write_episodes([ep], tmp_path / "episodes.parquet")  # a lone surrogate would fail this write
    assert "a chest \ufffd glows" in tiny_tokenizer.decode(ep.token_ids)


def test_an_episode_whose_env_cannot_be_ended_is_an_env_error(tiny_tokenizer):
    """Ending an episode's env can reveal that the env was not its own (a server restarted under it):
    then nothing the episode did is trusted, and the env is never handed out again."""

    class Unendable(KeyEnv):
        def end_episode(self) -> None:
            raise RuntimeError("the server no longer knows this env")

    pool = EnvPool(Unendable, {}, name="keys")
    backend = ScriptedBackend(tiny_tokenizer, lambda call, i, prompt: ["Action: open", "Action: take key"][call % 2])
    episodes = collect(pool, ActionTemplate(), tiny_tokenizer, [0, 1], backend=backend)
    assert [ep.end_reason for ep in episodes] == ["env_error", "env_error"]
    assert all("ending the episode's env failed" in ep.error for ep in episodes)
