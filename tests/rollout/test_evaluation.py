"""Evaluation metrics, pass@k on hand-checked cases, the table and the JSON report."""

from __future__ import annotations

import json
from math import comb

import pytest

from omrl.data.trajectory import Turn
from omrl.errors import OmrlError
from omrl.evaluation import env_table, evaluate, evaluate_by_env, ks_for, metrics_table, pass_at_k, write_report
from omrl.rollout.progress import PerTaskProgress, RolloutProgress
from tests.helpers import an_episode


def turn(action="go", format_ok=True, invalid=False, truncated=False):
    info = {"invalid": invalid, "rollout": {"truncated": truncated, "token_exact": True, "new_tokens": 3}}
    return Turn("obs", "reply", action, format_ok, 0.0, False, info)


def episode(task, sample, won, score=None, turns=(), end="done", tokens=10, generated=4):
    score = float(won) if score is None else score
    mask = [1] * generated + [0] * (tokens - generated)
    return an_episode(
        env="keys",
        task_id=task,
        split="test",
        sample=sample,
        won=won,
        score=score,
        turns=list(turns),
        end_reason=end,
        token_ids=[0] * tokens,
        loss_mask=mask,
    )


def test_pass_at_k_matches_the_binomial_formula():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 2, 3) == 1.0  # only 2 failures: any 3 samples include a success
    for n, c, k in [(10, 3, 4), (20, 7, 5), (7, 1, 7)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))
    with pytest.raises(OmrlError, match="1 <= k <= n"):
        pass_at_k(3, 1, 4)


def test_ks_reported():
    assert ks_for(1) == [1] and ks_for(4) == [1, 2, 4] and ks_for(6) == [1, 2, 4, 6]


def test_metrics_on_a_hand_checked_set():
    episodes = [
        # task 0: 1 of 4 samples wins -> pass@1 = .25, pass@2 = .5, pass@4 = 1
        episode(0, 0, True, turns=[turn(), turn()]),
        episode(0, 1, False, score=0.5, turns=[turn(invalid=True)], end="max_turns"),
        episode(0, 2, False, turns=[turn(action=None, format_ok=False)], end="env_error"),
        episode(0, 3, False, turns=[turn(truncated=True)], end="max_turns"),
        # task 1: no win -> 0 everywhere
        *[episode(1, s, False, score=0.25, turns=[turn()], end="max_context") for s in range(4)],
    ]
    m = evaluate(episodes)
    assert (m["episodes"], m["tasks"], m["samples_per_task"]) == (8, 2, 4)
    # the env_error episode measured nothing: success, score and pass@k are over the 7 others
    assert m["success_rate"] == pytest.approx(1 / 7)
    assert m["mean_score"] == pytest.approx((1 + 0.5 + 4 * 0.25) / 7)
    assert m["mean_turns"] == pytest.approx(9 / 8)
    assert m["invalid_action_rate"] == pytest.approx(1 / 8)  # 8 turns with an action, 1 invalid
    # the env_error episode's unparsed turn is not a format error: 0 of the measured episodes' 8 turns
    assert m["format_error_rate"] == 0.0
    assert m["truncated_turn_rate"] == pytest.approx(1 / 9)
    # task 0 has 3 measured samples (1 win): pass@1 1/3, pass@2 2/3, and no pass@4 of its own
    assert m["pass@1"] == pytest.approx((1 / 3) / 2) and m["pass@2"] == pytest.approx((2 / 3) / 2)
    assert m["pass@4"] == pytest.approx(0.0)  # task 1 alone has 4 measured samples
    assert m["best_of_4_score"] == pytest.approx((1 + 0.25) / 2)
    assert m["end_reasons"] == {"done": 1, "max_turns": 2, "env_error": 1, "max_context": 4}
    assert m["env_errors"] == 1 and m["env_error_rate"] == pytest.approx(1 / 8)
    assert m["generated_tokens_per_episode"] == 4
    with pytest.raises(OmrlError, match="no episodes"):
        evaluate([])


def test_table_and_report(tmp_path):
    episodes = [episode(0, 0, True, turns=[turn()]), episode(1, 0, False, turns=[turn()], end="max_turns")]
    metrics = evaluate(episodes)
    table = metrics_table(metrics)
    labels = list(table.columns[0]._cells)
    assert "success_rate" in labels and "ended: done" in labels and "ended: max_turns" in labels
    assert "50.0%" in table.columns[1]._cells
    path = write_report(tmp_path / "sub" / "report.json", metrics, episodes, {"seed": 0})
    data = json.loads(path.read_text())
    assert data["metrics"]["success_rate"] == 0.5 and data["config"] == {"seed": 0}
    assert [e["won"] for e in data["episodes"]] == [True, False]
    assert [p.name for p in path.parent.iterdir()] == ["report.json"]  # no temporary file left behind


def test_an_env_with_no_measured_episode_has_no_rates_and_is_left_out_of_macro():
    # all of its episodes failed in the env: a 0% would read as the model's, and pull macro down
    won = [episode(0, 0, True, turns=[turn()]), episode(1, 0, False, turns=[turn()])]
    failed = [episode(0, 0, False, turns=[turn(action=None, format_ok=False)], end="env_error")]
    for ep in failed:
        ep.env = "broken"
    alone = evaluate(failed)
    assert alone["success_rate"] is None and alone["mean_score"] is None and alone["format_error_rate"] is None
    by_env = evaluate_by_env(won + failed, evaluate(won + failed))
    assert by_env["per_env"]["broken"]["success_rate"] is None
    assert by_env["macro"]["success_rate"] == 0.5 and by_env["macro_left_out"] == ["broken"]
    assert "macro_left_out" not in evaluate_by_env(won, evaluate(won))  # only when an env is left out
    table = env_table(by_env)
    assert table.columns[2]._cells[:3] == ["50.0%", "-", "50.0%"]  # keys, broken, macro
    assert "macro leaves out broken" in table.caption and metrics_table(alone).columns[1]._cells[3] == "-"


def test_a_pass_at_k_over_fewer_tasks_says_how_many():
    # task 0 won 0 of 3; task 1 won its one measured sample, the env failed its other two: pass@1 is
    # over both tasks, pass@2 and pass@3 over task 0 alone, so they fall below pass@1 as k grows
    episodes = [episode(0, s, False, turns=[turn()]) for s in range(3)] + [
        episode(1, 0, True, turns=[turn()]),
        *(episode(1, s, False, end="env_error") for s in (1, 2)),
    ]
    m = evaluate(episodes)
    assert m["pass@1"] == 0.5 and m["pass@2"] == m["pass@3"] == 0.0
    assert "pass@1_tasks" not in m and m["pass@2_tasks"] == m["pass@3_tasks"] == 1
    every_task_twice = [episode(t, s, False, turns=[turn()]) for t in range(2) for s in range(2)]
    assert "pass@2_tasks" not in evaluate(every_task_twice)  # over every task: nothing to say
    rows = dict(zip(metrics_table(m).columns[0]._cells, metrics_table(m).columns[1]._cells))
    assert rows["pass@2"] == "0.0%" and rows["pass@2_tasks"] == "1"
    table = env_table(evaluate_by_env(episodes, m))
    assert [column.header for column in table.columns][-2:] == ["pass@2", "pass@3"]
    assert table.columns[-1]._cells[0] == "0.0% (1)" and "pass@k (n): over the n tasks" in table.caption


def test_the_report_is_strict_json_even_with_non_finite_metrics(tmp_path):
    import json

    from omrl.evaluation import write_report

    path = write_report(tmp_path / "report.json", {"success": float("nan"), "score": float("inf")}, [], {})
    report = json.loads(path.read_text(), parse_constant=lambda name: pytest.fail(f"{name} in the report"))
    assert report["metrics"] == {"success": None, "score": None}


def test_pass_at_k_counts_a_games_seats_apart():
    """Two seats of a zero-sum game: one of them wins every game, so pooled as samples of one task
    pass@2 would say 0.83 for a model that never won as player_0."""
    episodes = []
    for sample in range(2):
        for seat, won in (("player_0", False), ("player_1", True)):
            ep = episode(0, sample, won)
            ep.info = {"seat": seat, "players": {"player_0": "policy", "player_1": "policy"}}
            episodes.append(ep)
    metrics = evaluate(episodes)
    assert metrics["samples_per_task"] == 2 and metrics["tasks"] == 1
    assert metrics["pass@1"] == metrics["pass@2"] == 0.5 and "pass@4" not in metrics


def test_a_games_seats_count_once_in_the_progress_of_tasks():
    class Counted(RolloutProgress):
        def __init__(self):
            super().__init__()
            self.tasks = []

        def finished_task(self, episodes):
            self.tasks.append(episodes[0].task_id)

    counted = Counted()
    progress = PerTaskProgress(counted, group_size=2)
    for task in (0, 1):
        for seat_index, seat in enumerate(("player_0", "player_1")):
            for sample in range(2):
                ep = episode(task, sample, False)
                ep.group = task * 2 + seat_index
                ep.info = {"seat": seat, "players": {"player_0": "policy", "player_1": "policy"}}
                progress.finished(ep)
    assert counted.tasks == [0, 1]


def test_the_progress_bars_success_over_a_games_seats_is_the_tables():
    """It counted the seat that finished first alone: 100% on the bar where the table said 50%."""
    counted = RolloutProgress()
    progress = PerTaskProgress(counted, group_size=2)
    played = []
    for task in (0, 1):
        for seat_index, seat in enumerate(("player_0", "player_1")):
            for sample in range(2):
                ep = episode(task, sample, seat_index == 1, turns=[turn()])
                ep.group = task * 2 + seat_index
                ep.info = {"seat": seat, "players": {"player_0": "policy", "player_1": "policy"}}
                played.append(ep)
    for ep in played:
        progress.finished(ep)
    assert counted.episodes == 2 and counted.success_rate == evaluate(played)["success_rate"] == 0.5


def test_the_progress_bars_success_leaves_out_episodes_the_env_failed_as_the_table_does():
    progress = RolloutProgress()
    played = [episode(0, 0, True, turns=[turn()]), episode(1, 0, False, turns=[turn()], end="env_error")]
    for ep in played:
        progress.finished(ep)
    assert progress.episodes == 2 and progress.success_rate == evaluate(played)["success_rate"] == 1.0


def test_the_progress_bars_success_over_several_samples_a_task_is_the_tables():
    """It counted each task's first sample: 50% on the bar over 8 samples the table called 37.5%."""
    played = [episode(task, sample, won, turns=[turn()]) for task, wins in ((0, "1000"), (1, "1100"))
              for sample, won in enumerate(map(int, wins))]  # fmt: skip
    for ep in played:
        ep.group = ep.task_id
    counted = RolloutProgress()
    progress = PerTaskProgress(counted, group_size=4)
    for ep in played:
        progress.finished(ep)
    assert counted.episodes == 2  # tasks
    assert counted.success_rate == evaluate(played)["success_rate"] == 3 / 8
