"""Thinking-model formats through the recipes (issue 31): a GRPO step (chain and beam search), a DPO step
and an SFT epoch run on a tiny Qwen3 whose template rewrites history, in both history modes."""

from __future__ import annotations

import json
import math

import pytest
from rich.console import Console

from omrl.config import load_config
from omrl.config.options import TrainRunConfig
from omrl.data.conversations import load_conversations
from omrl.models import load_tokenizer
from omrl.training.metrics import read_metrics
from omrl.training.packing import tokenize_conversations
from omrl.training.rl import run_rl
from tests.helpers import eval_report

from .test_history_modes import qwen3_like  # noqa: F401 - the fixture
from .thinking import ForcedBackend, ThinkingPlugin

QUIET = Console(quiet=True)


def reasoning_dataset(path, count: int):
    """A JSONL of ``count`` two-reply conversations: reasoning as `<think>` text, then as a reasoning_content field."""
    records = [
        {
            "messages": [
                {"role": "system", "content": "Act."},
                {"role": "user", "content": f"Chest {i}."},
                {"role": "assistant", "content": "<think>\nOpen it first.\n</think>\n\nAction: open"},
                {"role": "user", "content": "It is open."},
                {"role": "assistant", "content": "Action: take key", "reasoning_content": "Now the key."},
            ]
        }
        for i in range(count)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def thinking_run(qwen3_like, register_plugin, monkeypatch, tmp_path):  # noqa: F811
    """``thinking_run(history, *overrides)``: one RL step on the keys env with replies that reason; a
    reward by sample index makes each group's rewards differ."""
    register_plugin(ThinkingPlugin(), name="thinking-fakes")

    wrong_odd = {"on": False}  # odd candidates of a call act wrongly (a search's siblings then differ)

    def forced(name, tokenizer, generation, *, model=None, **_):
        def reply(call, index, prompt):
            action = "dance" if wrong_odd["on"] and index % 2 else "open" if call % 2 == 0 else "take key"
            return f"<think>\nStep {call}, sample {index}: {action}.\n</think>\n\nAction: {action}"

        return ForcedBackend(model, tokenizer, reply)

    monkeypatch.setattr("omrl.rollout.session.make_backend", forced)

    def run(history: str, *overrides: str, siblings_differ: bool = False) -> list[dict]:
        wrong_odd["on"] = siblings_differ
        out = tmp_path / f"run-{history}-{len(list(tmp_path.iterdir()))}"
        cfg = load_config(
            TrainRunConfig,
            "grpo",
            [
                f"model.name={qwen3_like('drops_reasoning')}",
                "env.name=keys",
                "env.template=think_action",
                f"chat.history={history}",
                "generation.max_new_tokens=48",
                "generation.max_context=1024",
                f"logging.output_dir={out}",
                "logging.tensorboard=false",
                "steps=1",
                "tasks_per_step=2",
                "group_size=2",
                "eval_tasks=1",
                "reward.weights={sample_index: 1.0}",
                "optim.learning_rate=1e-3",
                *overrides,
            ],
        )
        run_rl(cfg, console=QUIET)
        return read_metrics(out)

    return run


@pytest.mark.parametrize("history", ["keep", "as_template"])
def test_a_grpo_step_trains_every_row(thinking_run, history):
    record = thinking_run(history)[0]
    assert math.isfinite(record["loss"]) and record["grad_norm"] > 0
    if history == "keep":
        assert record["rows_per_episode"] == 1 and record["prefix_breaks"] == 0
    else:  # every reply but the last had its reasoning dropped, so each later turn opened a row
        assert record["rows_per_episode"] > 1 and record["prefix_breaks"] > 0


@pytest.mark.slow  # a training run
def test_a_beam_search_step_trains_on_split_paths(thinking_run):
    record = thinking_run(
        "as_template",
        "rollout.strategy=beam",
        "plugins.beam.width=2",
        "plugins.beam.branch=2",
        "plugins.beam.stop_on_win=false",
        "reward.weights={goal: 1.0}",
        siblings_differ=True,
    )[0]
    assert math.isfinite(record["loss"]) and record["rows_per_episode"] > 1


@pytest.mark.parametrize("history", ["keep", "as_template"])
def test_a_dpo_step_pairs_split_episodes(thinking_run, history):
    record = thinking_run(history, "algorithm.name=dpo")[0]
    assert record["dpo_pairs"] >= 1 and math.isfinite(record["loss"])


def test_sft_rows_follow_the_history_mode(qwen3_like, tmp_path):  # noqa: F811
    """Reasoning as `<think>` text or a reasoning_content field: one row under keep, split under
    as_template where the template drops an earlier reply's reasoning."""
    tokenizer = load_tokenizer(qwen3_like("drops_reasoning"))
    conversations = load_conversations(str(reasoning_dataset(tmp_path / "thinking.jsonl", 3)))
    kept, _, _ = tokenize_conversations(tokenizer, conversations, 512, "keep")
    split, _, _ = tokenize_conversations(tokenizer, conversations, 512, "as_template")
    assert len(kept) == 3 and len(split) == 6
    trained = tokenizer.decode([t for t in kept[0].labels if t >= 0])
    assert "Open it first." in trained and "Now the key." in trained  # the reasoning is learned
    # as_template: the second row's prompt shows the first reply without its reasoning, as deployment does
    second = tokenizer.decode(split[1].input_ids)
    assert "Open it first." not in second and "Action: open" in second and "Now the key." in second


@pytest.mark.parametrize("history", ["keep", "as_template"])
def test_an_sft_epoch_on_reasoning_data(qwen3_like, tmp_path, history):  # noqa: F811
    from omrl.training.sft import run_sft
    from tests.training.sample_data import sft_run_config

    data = reasoning_dataset(tmp_path / "thinking.jsonl", 4)
    cfg = sft_run_config(
        qwen3_like("drops_reasoning"), data, tmp_path / "sft", chat__history=history, num_train_epochs=1.0
    )
    run_sft(cfg, console=QUIET)
    records = read_metrics(tmp_path / "sft")
    assert records and all(math.isfinite(r["loss"]) for r in records if "loss" in r)


@pytest.mark.parametrize("history", ["keep", "as_template"])
def test_omrl_eval_runs_a_qwen3_like_model_with_the_xml_template(
    qwen3_like,  # noqa: F811
    tmp_path,
    monkeypatch,
    history,
):
    """The issue's first report: `omrl eval --env gridworld --model ./qwen3-like env.template=xml` failed on its
    second turn once a reply held </think>, as the xml template asks replies to; here every reply does."""
    from omrl.models import load_model

    def forced(name, tokenizer, generation, *, model=None, model_name="", **_):
        def reply(call, index, prompt):
            move = ["left", "up", "right", "down"][call % 4]
            return f"<think>\nTry {move}.\n</think>\n<action>{move}</action>"

        return ForcedBackend(load_model(model_name)[0], tokenizer, reply)

    monkeypatch.setattr("omrl.rollout.session.make_backend", forced)
    _, data = eval_report(
        tmp_path,
        "eval",
        "--env",
        "gridworld",
        "--model",
        qwen3_like("drops_reasoning"),
        "env.template=xml",
        f"chat.history={history}",
        "num_tasks=2",
        "env.max_turns=3",
        "generation.max_new_tokens=16",
    )
    episodes = data["episodes"]
    assert len(episodes) == 2 and all(ep["turns"] == 3 for ep in episodes)  # no episode ended early


def test_split_episodes_train_alike_with_and_without_shared_prefixes(thinking_run, monkeypatch):
    """The samples of a task share their first prompt: their packed rows run it once (with the packed mask
    omrl builds) and train exactly as when every row runs whole."""
    from omrl.training.shared_prefix import SharedPrefix

    entered = []
    enter = SharedPrefix.__enter__
    monkeypatch.setattr(SharedPrefix, "__enter__", lambda self: entered.append(self.length) or enter(self))
    shared = thinking_run("as_template", "optim.share_prefix=true", "optim.micro_batch_size=1")[0]
    assert entered  # the packed rows did run on shared prefixes
    whole = thinking_run("as_template", "optim.share_prefix=false", "optim.micro_batch_size=1")[0]
    assert shared["rows_per_episode"] > 1
    assert shared["loss"] == pytest.approx(whole["loss"], rel=1e-4, abs=1e-6)
    assert shared["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-4)
