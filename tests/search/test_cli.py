"""`omrl rollout --strategy` and `omrl eval --strategy --budget` through the real CLI, on the tiny model."""

from __future__ import annotations

import json

import pytest

from omrl.data import read_episodes
from tests.helpers import cli_exit, eval_report, invoke

FAST = [
    "generation.max_new_tokens=4",
    "env.max_turns=2",
    "generation.temperature=1.0",
    "--env",
    "chest",
    "--model",
    "tiny",
]


def beam_rollout(out) -> object:
    """``omrl rollout --strategy beam`` (width 1, branch 2, budget 40) on 2 chest tasks into ``out``: its result."""
    return invoke(
        "rollout",
        *FAST,
        "--template",
        "chest-action",
        "--num-tasks",
        "2",
        "--strategy",
        "beam",
        "--budget",
        "40",
        "plugins.beam.width=1",
        "plugins.beam.branch=2",
        "-o",
        str(out),
    )


def test_rollout_writes_every_path_of_every_tree(chest_plugins, tmp_path):
    out = tmp_path / "beam.parquet"
    result = beam_rollout(out)
    assert result.exit_code == 0, result.output
    episodes = read_episodes(out)
    assert {ep.group for ep in episodes} == {0, 1} and len(episodes) >= 4  # at least two paths per tree
    assert all(turn.node_id > turn.parent_id >= 0 for ep in episodes for turn in ep.turns)
    assert all(sum(ep.loss_mask) <= 40 for ep in episodes)
    records = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert len(records) == len(episodes)
    assert "search: beam" in result.output and "generated_tokens" in result.output
    # a tree's paths are no samples of a task: pass@k over them fell as k grew (a stopped tree has fewer paths)
    assert "pass@" not in result.output and "samples_per_task" not in result.output


def test_sft_reads_a_search_file_as_it_reads_chains(chest_plugins, tiny_model_dir, tmp_path):
    """A tree's paths are ordinary episodes: ``omrl sft`` trains on a search's parquet unchanged."""
    trees = tmp_path / "beam.parquet"
    assert beam_rollout(trees).exit_code == 0
    out = tmp_path / "sft"
    result = invoke(
        "sft",
        f"model.name={tiny_model_dir}",
        "--dataset",
        str(trees),
        "--output-dir",
        str(out),
        "--num-train-epochs",
        "1",
        "--per-device-train-batch-size",
        "64",
        "--logging-steps",
        "1",
    )
    assert result.exit_code == 0, result.output
    assert "trained 1 step" in result.output and (out / "model.safetensors").exists()


def test_eval_reports_success_score_and_generated_tokens(chest_plugins, tmp_path):
    _, data = eval_report(
        tmp_path,
        "eval",
        *FAST,
        "env.template=chest-action",
        "--num-tasks",
        "2",
        "--strategy",
        "best_of_n",
        "--budget",
        "48",
        "plugins.best_of_n.n=3",
    )
    metrics = data["metrics"]
    assert metrics["episodes"] == 2  # one answer per task
    assert metrics["search/strategy"] == "best_of_n" and metrics["search/budget_per_task"] == 48
    assert 0 < metrics["search/generated_tokens"] <= 2 * 48
    assert {"success_rate", "mean_score", "search/any_success_rate"} <= set(metrics)
    assert data["config"]["rollout"] == {"strategy": "best_of_n", "budget": 48}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--strategy", "bean"], "unknown rollout strategy 'bean'. Did you mean 'beam'?"),
        (["--budget", "1"], "budget 1 is smaller than one reply"),  # the default strategy, chain, with a budget
        (["--strategy", "beam", "--budget", "2"], "budget 2 is smaller than one reply"),
        (["--strategy", "beam", "plugins.beam.branch=0"], "beam option branch=0 is invalid"),
        (["--strategy", "beam", "--env", "chest-plain"], "env 'chest-plain' (PlainChestEnv) cannot copy one"),
    ],
)
def test_bad_strategy_input_is_one_line(chest_plugins, capsys, tmp_path, args, message):
    code, _, err = cli_exit(
        capsys,
        "rollout",
        *FAST,
        "--template",
        "chest-action",
        "--num-tasks",
        "1",
        *args,
        "-o",
        str(tmp_path / "x.parquet"),
    )
    assert code != 0
    assert message in " ".join(err.split()) and "Traceback" not in err
    assert sum("error" in line for line in err.splitlines()) == 1, err


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "plugins.env_reward.partial_credit=maybe",
            "scorer 'env_reward' option partial_credit='maybe' is invalid; valid: true or false",
        ),
        ("plugins.beam.widht=3", "strategy 'beam' does not take options ['widht']; its options: width,"),
        ("plugins.mcts.iterations=many", "strategy 'mcts' option iterations='many' is invalid; valid: a whole number"),
        # the scorer a strategy names, with no block of its own: it failed after the whole search had played
        ("plugins.beam.scorer=rm", "scorer 'rm' needs the option path (a reward model directory"),
    ],
)
def test_strategy_and_scorer_options_are_checked_before_any_model_loads(capsys, override, message):
    """`omrl config show` loads no model: a scorer's options were read when the search first scored."""
    code, _, err = cli_exit(capsys, "config", "show", "grpo", "rollout.strategy=beam", override)
    assert code == 2 and message in " ".join(err.split()), err


@pytest.mark.parametrize(
    "args, what",
    [
        (["--strategy", "chain", "--budget", "200"], "'chain' with a budget (200 tokens)"),
        (["--strategy", "beam"], "'beam'"),
    ],
)
def test_the_expert_with_a_search_or_a_budget_says_what_it_plays(capsys, tmp_path, args, what):
    code, _, err = cli_exit(
        capsys,
        "rollout",
        "--env",
        "gridworld",
        "--expert",
        "--num-tasks",
        "1",
        *args,
        "-o",
        str(tmp_path / "x.parquet"),
    )
    said = " ".join(err.split())
    assert code != 0 and "Traceback" not in err
    assert f"strategy {what} needs a generation backend (a model)" in said
    assert "the scripted expert plays only the chain strategy without a budget (rollout.budget=0)" in said
    assert not (tmp_path / "x.parquet").exists()


def test_plugins_lists_each_strategys_and_scorers_options_with_their_defaults():
    listed = invoke("plugins", "--kind", "strategy")
    assert listed.exit_code == 0, listed.output
    lines = {line.split()[1]: line for line in listed.output.splitlines() if line.startswith("strategy")}
    assert lines["beam"].endswith("options: width=2, branch=3, scorer=env_reward, stop_on_win=true, select=''")
    assert lines["mc_value"].endswith("options: k=4") and lines["chain"].endswith("options: none")
    scorers = json.loads(invoke("plugins", "--kind", "scorer", "--json").output)
    assert {s["name"]: s["options"] for s in scorers}["env_reward"] == {"partial_credit": False}


def test_plugins_lists_the_options_of_envs_rewards_and_templates_too():
    """Every kind that reads a plugins.<name> block shows what it takes; a family row shows what all its
    members take, or sends to --all where they differ."""
    lines = {tuple(line.split()[:2]): line for line in invoke("plugins").output.splitlines()}
    assert lines[("env", "gridworld")].endswith("options: size=5, wall_density=0.3, min_distance=2, max_distance=6, "
                                                "max_turns=12, show_grid=false")  # fmt: skip
    assert "options: items_path=None" in lines[("env", "webshop")]  # no **unknown hiding them any more
    assert lines[("reward", "goal")].endswith("options: binary=false")  # after its episodes
    assert lines[("template", "tool_call")].endswith("options: format=hermes")
    assert lines[("env", "textarena:*")].endswith("options: max_turns=100")  # each member's: one line
    listed = json.loads(invoke("plugins", "--kind", "reward", "--json").output)
    assert {r["name"]: r["options"] for r in listed}["length_penalty"] == {"budget": 64, "per_token": 0.005,
                                                                           "scope": "turn"}  # fmt: skip


def test_a_block_of_a_strategy_the_run_does_not_play_is_warned_of(capsys):
    """`--strategy beam plugins.mcts.iterations=2` ran beam, and nothing said the mcts block was unread."""
    code, _, err = cli_exit(capsys, "config", "show", "eval", "rollout.strategy=beam", "plugins.mcts.iterations=2")
    said = " ".join(err.split())
    assert (
        code == 0
        and "plugins.mcts sets options of the strategy 'mcts', which this run does not play (it plays beam)" in said
    )
    code, _, err = cli_exit(capsys, "config", "show", "eval", "rollout.strategy=mcts", "plugins.mcts.iterations=2")
    assert code == 0 and "does not play" not in err


def test_eval_of_samples_under_a_budget_says_what_it_scores(capsys, monkeypatch, tmp_path):
    """--samples 4 --budget reported episodes 4, samples_per_task 1 and no pass@k, and played 2 of the samples,
    without a word."""
    import warnings

    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main prints warnings its own way
    monkeypatch.setenv("COLUMNS", "400")
    code, _, err = cli_exit(capsys, "eval", "--env", "gridworld", "--model", "tiny", "--num-tasks", "1",
                            "--samples", "4", "--budget", "40", "generation.max_new_tokens=16", "env.max_turns=2",
                            "-o", str(tmp_path / "eval"))  # fmt: skip
    assert code == 0, err
    assert "warning: --samples 4 under --budget: each task's samples are one search" in err
    assert "warning: chain samples=4 with a budget of 40 tokens: 4 first replies of up to 16 tokens need 64" in err
