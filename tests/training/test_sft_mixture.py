"""``omrl sft`` on several datasets with weights (omrl.data.mixture): naming the mixture, the drawn shares,
one dataset as before, training, resume, bad input, and expert rollouts of several envs in one file."""

from __future__ import annotations

import io
import json
import math
from collections import Counter

import pytest
from rich.console import Console

from omrl.cli import main
from omrl.data.conversations import load_conversations, record_to_conversation, write_conversations
from omrl.data.mixture import dataset_as_saved, dataset_sources, draw_counts, draw_mixture
from omrl.errors import ConfigError
from omrl.rollout import PlaySpec
from omrl.training.checkpoint import CheckpointError
from omrl.training.metrics import read_metrics
from omrl.training.packing import fingerprint, pack_rows, tokenize_conversations
from omrl.training.sft import SftRecipe, run_sft
from tests.training.helpers import sft_stop_then_resume

QUIET = Console(file=io.StringIO())


def arithmetic_records(n: int) -> list[dict]:
    """``n`` short question-and-answer chats, unlike the shell chats of ``agent_records``."""
    return [
        {
            "id": f"math_{i}",
            "conversations": [
                {"role": "system", "content": "Answer with the number alone."},
                {"role": "user", "content": f"What is {i} + {i}?"},
                {"role": "assistant", "content": f"Act: answer({2 * i})"},
            ],
        }
        for i in range(n)
    ]


@pytest.fixture
def math_parquet(tmp_path):
    """A parquet dataset of 30 arithmetic chats: with the 8 of ``agent_jsonl``, 38 conversations in all."""
    conversations = [record_to_conversation(r, f"row {i}") for i, r in enumerate(arithmetic_records(30))]
    return write_conversations(conversations, tmp_path / "math.parquet")


def mixture(agent_jsonl, math_parquet, agent_weight=0.7, math_weight=0.3) -> str:
    return f"{agent_jsonl}:{agent_weight},{math_parquet}:{math_weight}"


def set_up(cfg) -> SftRecipe:
    recipe = SftRecipe(cfg, console=QUIET)
    recipe.setup()
    return recipe


def source_of_each_conversation_in_an_epoch(recipe: SftRecipe) -> Counter:
    """Which dataset every conversation of epoch 0 came from, by the recipe's own record of its rows."""
    return Counter(s for j in recipe.epoch_order(0) for r in recipe.micro[j] for s in recipe.row_sources[r])


# -- naming ------------------------------------------------------------------------------------------
def test_a_mixture_names_paths_with_weights_after_the_last_colon(tmp_path, agent_jsonl, math_parquet):
    sources = dataset_sources(f"{agent_jsonl}:3,{math_parquet}")
    assert [(s.path, s.weight) for s in sources] == [(str(agent_jsonl), 0.75), (str(math_parquet), 0.25)]
    # a colon followed by no number is part of the path; a lone path with a weight is one dataset of weight 1
    odd = tmp_path / "runs:v2" / "data.jsonl"
    odd.parent.mkdir()
    odd.write_text(agent_jsonl.read_text())
    assert [(s.path, s.weight) for s in dataset_sources(f"{odd},{agent_jsonl}:1")] == [
        (str(odd), 0.5),
        (str(agent_jsonl), 0.5),
    ]
    assert [(s.path, s.weight) for s in dataset_sources(f"{agent_jsonl}:0.4")] == [(str(agent_jsonl), 1.0)]
    # a path that exists as written is one dataset even when it reads like a weighted list
    weird = tmp_path / "a,b:2"
    weird.write_text(agent_jsonl.read_text())
    assert [(s.path, s.weight) for s in dataset_sources(str(weird))] == [(str(weird), 1.0)]


def test_a_mixture_is_kept_with_absolute_paths_and_its_weights_as_written(tmp_path, agent_jsonl, monkeypatch):
    """config.yaml keeps each path absolute so the run resumes from any folder; weights and what exists
    nowhere (refused later, by name) stay as typed."""
    monkeypatch.chdir(agent_jsonl.parent)
    name = agent_jsonl.name
    assert dataset_as_saved(f"{name}:0.7, nope.jsonl:0.3") == f"{agent_jsonl}:0.7,nope.jsonl:0.3"
    assert dataset_as_saved(name) == dataset_as_saved(f"./{name}") == str(agent_jsonl)
    assert dataset_as_saved(f"{name},{name}:x") == f"{agent_jsonl},{name}:x"  # ':x' is no weight


@pytest.mark.parametrize(
    "spec, match",
    [
        ("{a}:0.5,{missing}:0.5", r"'.*nope.jsonl' does not exist"),
        ("{a}:0.5,{b}:x", r"'.*math.parquet:x' does not exist; 'x' after the last colon is not a number"),
        ("{a}:0,{b}:1", r"'.*agent.jsonl' has weight 0.0; a weight must be a positive number"),
        ("{a}:-1,{b}:1", r"has weight -1.0; a weight must be a positive number"),
        ("{a}:nan,{b}:1", r"has weight nan; a weight must be a positive number"),
        ("{a}:0.5,{a}:0.5", r"'.*agent.jsonl' is named twice in the mixture"),
        ("{a}:0.5,{a_again}:0.5", r"'.*agent.jsonl' and '.*agent.jsonl' name one file in the mixture"),
        ("{a},,{b}", r"has an empty entry"),
        ("{a}:1e308,{b}:1e308", r"the weights add up past the largest number"),
    ],
)
def test_a_bad_mixture_is_refused_naming_the_bad_entry(spec, match, agent_jsonl, math_parquet, sft_config, tmp_path):
    a_again = f"{agent_jsonl.parent}/../{agent_jsonl.parent.name}/{agent_jsonl.name}"
    text = spec.format(a=agent_jsonl, b=math_parquet, missing=tmp_path / "nope.jsonl", a_again=a_again)
    with pytest.raises(ConfigError, match=match):
        dataset_sources(text)
    recipe = SftRecipe(sft_config(dataset=text), console=QUIET)
    with pytest.raises(ConfigError, match=match):
        recipe.setup()  # refused before the model loads
    assert not hasattr(recipe, "model")


def test_the_command_line_refuses_a_bad_mixture_naming_it(tiny_model_dir, agent_jsonl, tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        main(
            [
                "sft",
                f"model.name={tiny_model_dir}",
                f"dataset={agent_jsonl}:0.5,{tmp_path}/gone.jsonl:0.5",
                "--output-dir",
                str(out),
            ]
        )
    err = capsys.readouterr().err
    assert info.value.code == 2 and "gone.jsonl' does not exist" in err and "Traceback" not in err
    assert not out.exists()


# -- drawing -----------------------------------------------------------------------------------------
def test_each_source_gives_its_weights_share_upsampling_evenly():
    sizes, weights = [8, 30], [0.7, 0.3]
    counts = draw_counts(sizes, weights)
    assert counts == [27, 11] and sum(counts) == 38  # 0.7 * 38 = 26.6, 0.3 * 38 = 11.4: largest remainder
    drawn = draw_mixture(sizes, weights, seed=5)
    assert drawn == draw_mixture(sizes, weights, seed=5) != draw_mixture(sizes, weights, seed=6)
    per_item = Counter(drawn)
    assert sorted({n for (s, _), n in per_item.items() if s == 0}) == [3, 4]  # 27 of 8: each 3 or 4 times
    assert all(n == 1 for (s, _), n in per_item.items() if s == 1) and len(per_item) - 8 == 11  # 11 of 30, no repeat
    assert {s for s, _ in drawn[:12]} == {0, 1}  # shuffled together, not one source after the other


@pytest.mark.parametrize("packing", [False, True])
def test_an_epoch_draws_each_dataset_in_the_share_of_its_weight(sft_config, agent_jsonl, math_parquet, packing):
    recipe = set_up(sft_config(dataset=mixture(agent_jsonl, math_parquet), packing=packing, max_seq_length=512))
    try:
        seen = source_of_each_conversation_in_an_epoch(recipe)
        assert seen == {0: 27, 1: 11}  # 38 conversations: 70% and 30% of them
        assert abs(seen[0] / 38 - 0.7) < 1 / 38
        assert [(s["conversations"], s["drawn"]) for s in recipe.mix] == [(8, 27), (30, 11)]
        assert sum(row.num_conversations for row in recipe.rows) == 38
        if packing:
            assert len(recipe.rows) < 38  # conversations were packed, and their sources followed them
    finally:
        recipe.cleanup()


def test_one_dataset_is_read_and_trained_on_as_before(sft_config, agent_jsonl, tiny_tokenizer):
    for packing in (False, True):
        recipe = set_up(sft_config(packing=packing, max_seq_length=512))
        try:
            rows, _, _ = tokenize_conversations(tiny_tokenizer, load_conversations(agent_jsonl), 512)
            expected = pack_rows(rows, 512) if packing else rows
            assert recipe.data_fingerprint == fingerprint(expected)  # what the recipe built before mixtures
            assert recipe.epoch_order(0) == recipe.epoch_order(0) and recipe.mix == [] and recipe.row_sources == []
        finally:
            recipe.cleanup()
    weighted = set_up(
        sft_config(dataset=f"{agent_jsonl}:0.3", max_seq_length=512)
    )  # one dataset with a weight: no mixture
    try:
        assert weighted.mix == [] and weighted.data_fingerprint == fingerprint(rows)
    finally:
        weighted.cleanup()


# -- training ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_two_dataset_run_trains_logs_its_mix_and_the_loss_falls(sft_config, agent_jsonl, math_parquet, tmp_path):
    cfg = sft_config(
        dataset=mixture(agent_jsonl, math_parquet),
        num_train_epochs=3.0,
        optim__micro_batch_size=8,
        optim__learning_rate=3e-3,
        logging__output_dir=str(tmp_path / "mixed"),
    )
    console = io.StringIO()
    summary = run_sft(cfg, console=Console(file=console, width=400))
    records = read_metrics(cfg.logging.output_dir)
    losses = [r["loss"] for r in records]
    assert all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]
    agent_key, math_key = f"conversations/{agent_jsonl}", f"conversations/{math_parquet}"
    steps_per_epoch = math.ceil(38 / 8)
    first_epoch = records[:steps_per_epoch]
    assert sum(r[agent_key] for r in first_epoch) == 27 and sum(r[math_key] for r in first_epoch) == 11
    written = json.loads((tmp_path / "mixed" / "data_mix.json").read_text())
    assert written["dataset"] == cfg.dataset and written["seed"] == cfg.seed
    assert [(s["dataset"], s["weight"], s["conversations"], s["drawn"]) for s in written["sources"]] == [
        (str(agent_jsonl), 0.7, 8, 27),
        (str(math_parquet), 0.3, 30, 11),
    ]
    assert summary["data_mix"] == written["sources"]
    assert f"{agent_jsonl} (weight 0.70): 27 drawn of 8 conversations" in console.getvalue()


@pytest.mark.slow
def test_a_mixture_run_stopped_and_resumed_matches_one_that_ran_through(
    sft_config, sft_reference, agent_jsonl, math_parquet, tmp_path
):
    settings = dict(
        dataset=mixture(agent_jsonl, math_parquet, 0.4, 0.6),
        num_train_epochs=2.0,
        optim__micro_batch_size=2,
        logging__save_steps=3,
        packing=True,
        max_seq_length=300,
    )
    reference = [
        (r["step"], r["loss"], r[f"conversations/{math_parquet}"]) for r in read_metrics(sft_reference(**settings))
    ]
    assert len(reference) > 4

    cfg = sft_config(logging__output_dir=str(tmp_path / "stopped"), **settings)
    sft_stop_then_resume(cfg, 4, console=QUIET)  # one step past the checkpoint at step 3
    resumed = [(r["step"], r["loss"], r[f"conversations/{math_parquet}"]) for r in read_metrics(tmp_path / "stopped")]
    assert [(s, n) for s, _, n in resumed] == [(s, n) for s, _, n in reference]  # the same data, step for step
    for (step, got, _), (_, want, _) in zip(resumed, reference):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6), f"step {step}"

    other = sft_config(logging__output_dir=str(tmp_path / "stopped"), **{**settings, "resume": True})
    other.dataset = mixture(agent_jsonl, math_parquet, 0.6, 0.4)
    with pytest.raises(CheckpointError, match="differs from the checkpoint's in dataset"):  # other weights: other data
        run_sft(other, console=QUIET)


# -- expert rollouts of several envs in one file -------------------------------------------------------
def test_sft_trains_on_one_parquet_of_expert_rollouts_of_two_envs(tiny_model_dir, sft_config, tmp_path):
    from omrl.config import load_config
    from omrl.config.options import RolloutRunConfig
    from omrl.rollout import RolloutSession
    from omrl.rollout.convert import write_trajectories

    envs = ["env.name=gridworld:0.5,reasoning-gym:basic_arithmetic:0.5", "env.template=react"]
    cfg = load_config(RolloutRunConfig, None, [*envs, f"model.name={tiny_model_dir}", "env.max_turns=12"])
    with RolloutSession.from_config(cfg, expert=True) as session:
        episodes = session.play(session.task_ids("train", 3), PlaySpec(split="train", expert=True)).episodes
        parquet, _ = write_trajectories(episodes, tmp_path / "experts.parquet", session.tokenizer)
    assert Counter(ep.env for ep in episodes) == {"gridworld": 3, "reasoning-gym:basic_arithmetic": 3}

    conversations = load_conversations(parquet)
    assert {c.meta["env"] for c in conversations} == {"gridworld", "reasoning-gym:basic_arithmetic"}
    assert len({c.messages[0]["content"] for c in conversations}) >= 2  # each env's own system prompt

    sft = sft_config(
        dataset=str(parquet), num_train_epochs=1.0, optim__micro_batch_size=3, max_seq_length=1024,
        logging__output_dir=str(tmp_path / "sft"),
    )  # fmt: skip
    summary = run_sft(sft, console=QUIET)
    losses = [r["loss"] for r in read_metrics(tmp_path / "sft")]
    assert summary["steps"] == 2 and len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
