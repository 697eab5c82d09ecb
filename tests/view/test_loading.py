"""What omrl view reads: runs, trajectory files, metrics, and what it says about bad files."""

from __future__ import annotations

import json

import pytest

from omrl.errors import OmrlError
from omrl.view import discover, open_run
from omrl.view.metrics import columns, panels, read_metrics_file
from omrl.view.plot import plan

from .conftest import make_episode, small_episodes, write_metrics


def test_a_run_directory_is_indexed(small_run):
    store = open_run(small_run)
    overview = store.overview()
    assert overview["episodes"] == 6 and overview["problems"] == []
    assert overview["files"] == [{"file": "rollout.parquet", "episodes": 6}]
    assert overview["metrics"]["step"] == [1, 2, 3]
    assert "model:" in overview["config"]
    assert overview["facets"]["end"] == ["done", "env_error", "max_turns"]
    first = store.summary(0)
    assert (first["task"], first["sample"], first["won"], first["reward"]) == (0, 0, True, 1.0)
    assert (first["turns"], first["tokens"], first["generated"]) == (2, 20, 6)


def test_filters_and_sorts(small_run):
    store = open_run(small_run)
    assert store.query({"success": "won"})["total"] == 2
    assert store.query({"end": "max_turns"})["total"] == 2
    assert store.query({"task": "1"})["total"] == 2
    assert store.query({"rmin": "0.1", "rmax": "0.5"})["total"] == 1
    assert store.query({"group": "0:2"})["total"] == 2
    rewards = [e["reward"] for e in store.query({"sort": "-reward"})["items"]]
    assert rewards == sorted(rewards, reverse=True)
    page = store.query({"limit": "4", "offset": "4"})
    assert (page["total"], len(page["items"])) == (6, 2)


def test_advantages_are_shown_as_recorded_and_never_recomputed(small_run, tmp_path):
    from omrl.data.trajectory import write_episodes

    store = open_run(small_run)  # a file without recorded advantages: nothing is made up
    assert [store.summary(i)["advantage"] for i in range(6)] == [None] * 6
    assert "not recorded" in store.overview()["advantage"]
    assert store.episode(0)["tokens"]["advantage"] is None

    recorded = small_episodes()[:2]
    for ep, value in zip(recorded, (0.75, -0.75)):  # what a trainer wrote: per token, 0 off the trained ones
        ep.advantages = [value if trained else 0.0 for trained in ep.loss_mask]
        ep.returns = list(ep.advantages)
    write_episodes(recorded, tmp_path / "trained.parquet")
    store = open_run(tmp_path / "trained.parquet")
    assert [store.summary(i)["advantage"] for i in range(2)] == [0.75, -0.75]
    assert "as the trainer recorded them" in store.overview()["advantage"]
    tokens = store.episode(1)["tokens"]
    assert [tokens["advantage"][i] for i in (9, 10, 15)] == [None, -0.75, -0.75]  # the trained tokens only
    assert tokens["return"][10] == -0.75 and tokens["value"] is None  # no critic: no values
    assert store.query({})["items"][0]["advantage"] == 0.75


def test_a_step_rollout_saved_before_advantages_were_recorded_says_they_were_not(small_run):
    from omrl.data.trajectory import write_episodes

    store = open_run(small_run)  # omrl rollout's file: never trained on, nothing said of advantages
    assert store.overview()["facets"]["unrecorded"] is False and store.group("0:0")["advantage"] is None
    import pyarrow.parquet as pq

    (small_run / "rollout.parquet").unlink()
    written = write_episodes(small_episodes(), small_run / "new.parquet")
    table = pq.read_table(written).drop_columns(["advantages", "returns", "values"])  # as episode/4 wrote it
    (small_run / "rollouts").mkdir()
    pq.write_table(table.replace_schema_metadata({b"omrl.schema": b"episode/4"}),
                   small_run / "rollouts" / "step-00000001.parquet")  # fmt: skip
    written.unlink()
    store = open_run(small_run)
    assert store.overview()["facets"]["unrecorded"] is True
    assert "not recorded" in store.group("0:0")["advantage"]
    assert store.tasks() is None  # trained on all the same: no per-task pass@k table


def test_a_step_rollout_of_an_update_that_trained_no_episode_says_so_not_that_it_is_old(small_run):
    """A search whose every path was cut short: the file records the update's advantages, and none were."""
    from omrl.data.trajectory import write_episodes

    (small_run / "rollout.parquet").unlink()
    write_episodes(small_episodes(), small_run / "rollouts" / "step-00000001.parquet")  # the columns, empty
    store = open_run(small_run)
    overview = store.overview()
    assert "as the trainer recorded them" in overview["advantage"] and overview["facets"]["unrecorded"] is False
    assert store.episode(0)["left_out"] == "Not trained on: the update recorded no advantage for it."
    assert store.tasks() is None  # a training rollout gets no per-task pass@k table


def test_one_episode_in_full(small_run):
    store = open_run(small_run)
    episode = store.episode(0)
    tokens = episode["tokens"]
    assert sum(tokens["mask"]) == 6 and len(tokens["ids"]) == 20
    assert tokens["text"] is not None and len(tokens["text"]) == 20  # config.yaml names the tiny model
    assert tokens["logprob"][10:13] == [-0.5, -1.25, -2.0]
    turn = episode["turns"][1]
    assert (turn["action"], turn["rewards"], turn["reward"]) == ("up1", {"goal": 1.0, "total": 1.0}, 1.0)
    group = store.group("0:0")
    assert [m["summary"]["sample"] for m in group["members"]] == [0, 1]
    with pytest.raises(KeyError):
        store.episode(99)


def test_search_paths_become_a_tree(tmp_path):
    from omrl.data.trajectory import write_episodes

    paths = [
        make_episode(0, 0, False, 0.0, node_ids=(1, 2), group=0),
        make_episode(0, 1, True, 1.0, node_ids=(1, 3), group=0),
    ]
    paths[1].turns[-1].info["search"]["chosen"] = True
    write_episodes(paths, tmp_path / "beam.parquet")
    store = open_run(tmp_path / "beam.parquet", tokenizer="tiny")
    tree = store.tree("0:0")
    nodes = {n["id"]: n for n in tree["nodes"]}
    assert set(nodes) == {0, 1, 2, 3} and nodes[2]["parent"] == 1 and nodes[3]["parent"] == 1
    assert nodes[3]["won"] and nodes[3]["chosen"] and nodes[1]["chosen"] and not nodes[2]["chosen"]
    assert nodes[1]["score"] == 0.5 and sorted(nodes[1]["episodes"]) == [0, 1]


def test_readable_jsonl_and_eval_report(tmp_path):
    from omrl.evaluation import evaluate, write_report
    from omrl.rollout.convert import write_jsonl

    episodes = small_episodes()
    write_jsonl(episodes, tmp_path / "records.jsonl")
    store = open_run(tmp_path / "records.jsonl")
    assert store.overview()["episodes"] == 6
    detail = store.episode(0)
    assert detail["turns"][0]["action"] == "up0" and detail["tokens"]["ids"] == []
    write_report(tmp_path / "eval_report.json", evaluate(episodes), episodes, {"env": {"name": "gridworld"}})
    report = open_run(tmp_path / "eval_report.json")
    assert report.overview()["reports"][0]["metrics"]["episodes"] == 6
    assert report.query({"success": "won"})["total"] == 2
    assert "summary line per episode" in report.episode(0)["unavailable"]


def test_a_path_that_is_not_a_run(tmp_path):
    with pytest.raises(OmrlError, match="no such file"):
        discover(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(OmrlError, match=r"is not an omrl run: it holds no readable metrics.jsonl"):
        discover(tmp_path)
    with pytest.raises(OmrlError, match="notes.txt: not something omrl view shows"):
        discover(tmp_path / "notes.txt")


def test_a_sweep_folder_is_named_as_such_with_where_its_results_are(tmp_path):
    """`omrl sweep` writes a table and a plot, no episodes: the viewer says where they are."""
    (tmp_path / "sweep.json").write_text('{"cells": []}')
    for given in (tmp_path, tmp_path / "sweep.json"):
        with pytest.raises(OmrlError, match=r"is what `omrl sweep` wrote: its numbers are in .*sweep.json"):
            discover(given)


def test_a_truncated_parquet_is_named_and_the_rest_shown(small_run):
    from omrl.data.trajectory import write_episodes

    write_episodes(small_episodes()[:2], small_run / "step-2.parquet")
    data = (small_run / "step-2.parquet").read_bytes()
    (small_run / "step-2.parquet").write_bytes(data[: len(data) // 2])
    store = open_run(small_run)
    problems = store.overview()["problems"]
    assert [(p["file"], p["level"]) for p in problems] == [("step-2.parquet", "error")]
    assert "truncated, damaged or not a parquet file" in problems[0]["message"]
    assert store.overview()["episodes"] == 6  # the intact file is still shown
    # given alone, the truncated file leaves nothing to show: the command says why
    with pytest.raises(OmrlError, match=r"step-2.parquet: truncated, damaged or not a parquet file"):
        open_run(small_run / "step-2.parquet")


def test_a_trajectory_file_cut_down_to_fewer_columns_is_named_not_shown_with_defaults(small_run):
    import pyarrow.parquet as pq

    from omrl.data.trajectory import write_episodes

    write_episodes(small_episodes()[:2], small_run / "step-2.parquet")
    table = pq.read_table(small_run / "step-2.parquet")
    pq.write_table(table.drop_columns(["won"]), small_run / "step-2.parquet")  # the schema's tag stays
    store = open_run(small_run)
    problems = store.overview()["problems"]
    assert [(p["file"], p["level"]) for p in problems] == [("step-2.parquet", "error")]
    assert problems[0]["message"] == "lacks the column(s) won: not a whole omrl trajectory file; skipped"
    assert store.overview()["episodes"] == 6  # the whole file is still shown
    with pytest.raises(OmrlError, match=r"step-2.parquet: lacks the column\(s\) won"):
        open_run(small_run / "step-2.parquet")


def test_a_metrics_file_with_a_half_written_last_line(small_run):
    write_metrics(small_run / "metrics.jsonl", steps=3, tail='{"step": 4, "rew')
    records, problems = read_metrics_file(small_run / "metrics.jsonl", "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert [str(p) for p in problems] == [
        "metrics.jsonl: the last line is half-written (a run still writing, or killed mid-line); skipped"
    ]
    overview = open_run(small_run).overview()
    assert overview["metrics"]["step"] == [1, 2, 3]
    assert overview["problems"][0]["file"] == "metrics.jsonl"


def test_metric_panels():
    keys = [
        "reward",
        "reward_goal",
        "success",
        "eval_success",
        "kl",
        "entropy",
        "loss",
        "response_tokens",
        "step_time",
        "tokens_per_s",
        "lr",
    ]
    by_title = {p["title"]: p["keys"] for p in panels(keys)}
    assert by_title["Reward"] == ["reward", "reward_goal"]
    assert by_title["Success and score"] == ["success", "eval_success"]
    assert by_title["KL"] == ["kl"] and by_title["Entropy"] == ["entropy"] and by_title["lr"] == ["lr"]
    curves = columns([{"step": 2, "kl": float("nan")}, {"step": 1, "kl": 0.5, "eval_success": 1.0}])
    assert curves == {"step": [1, 2], "series": {"kl": [0.5, None], "eval_success": [1.0, None]}}


def test_time_keys_go_to_the_time_panel_only():
    """GRPO logs the seconds spent scoring as ``time/score``: a time, not a score."""
    by_title = {p["title"]: p["keys"] for p in panels(["success", "time/score", "time/generate", "prefill_time"])}
    assert by_title["Success and score"] == ["success"]
    assert by_title["Where a step's time goes (s)"] == ["time/score", "time/generate", "prefill_time"]
    pngs = {file: panel["keys"] for file, panel in plan(["success", "time/score"])}  # omrl plot's files
    assert pngs == {"success.png": ["success"], "parts.png": ["time/score"]}


def test_an_int_too_large_for_a_float_is_a_gap(tmp_path):
    huge = "1" + "0" * 400
    (tmp_path / "metrics.jsonl").write_text(
        f'{{"step": 1, "grad_norm": {huge}}}\n{{"step": 2, "grad_norm": 3}}\n{{"step": {huge}, "grad_norm": 4}}\n'
    )
    records, problems = read_metrics_file(tmp_path / "metrics.jsonl", "metrics.jsonl")
    assert columns(records) == {"step": [1, 2], "series": {"grad_norm": [None, 3]}}
    assert [str(p) for p in problems] == ["metrics.jsonl: line 3 has no numeric step; skipped"]


def test_non_trajectory_parquet_is_a_warning(small_run):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1, 2]}), small_run / "other.parquet")
    problems = open_run(small_run).overview()["problems"]
    assert problems == [
        {
            "file": "other.parquet",
            "level": "warning",
            "message": "not an omrl trajectory file (no omrl.schema episode/N in its metadata); skipped",
        }
    ]
    assert json.dumps(problems)  # what the page gets


def test_list_lengths_and_sums_with_empty_rows_and_chunks():
    import pyarrow as pa

    from omrl.view.readers import _lengths_and_sums

    rows = [[1, 0, 1], [], [1], [], [0, 0], [1, 1, 1, 1], []]
    column = pa.chunked_array([pa.array(rows[:3], pa.list_(pa.int8())), pa.array(rows[3:], pa.list_(pa.int8()))])
    assert _lengths_and_sums(column) == ([3, 0, 1, 0, 2, 4, 0], [2, 0, 1, 0, 0, 4, 0])
    assert _lengths_and_sums(column.slice(2)) == ([1, 0, 2, 4, 0], [1, 0, 0, 4, 0])


def test_opening_a_run_never_imports_torch(small_run):
    """Importing torch costs seconds; the page for a large run must open in under 3."""
    import subprocess
    import sys

    code = (
        "import sys; from omrl.view import open_run; from omrl.view.server import make_server; "
        "from omrl.view.page import render; from omrl.cli import view_cmd, plot_cmd; "
        f"s = open_run({str(small_run)!r}); s.episode(0); s.group('0:0'); render(); "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _opens_in_time(call, fifos, seconds: float = 20.0):
    """``call()``'s result, failing (not hanging) when it does not return in time: a reader blocked on
    one of ``fifos`` is let go by opening it for writing."""
    import os
    import threading

    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(value=call()), daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        for fifo in fifos:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        pytest.fail(f"still reading after {seconds} s: blocked on a FIFO")
    return result["value"]


def test_a_fifo_in_a_run_is_named_and_never_opened(small_run):
    import os

    fifos = [small_run / name for name in ("live.jsonl", "stream.parquet", "eval_report.json")]
    for fifo in fifos:
        os.mkfifo(fifo)
    store = _opens_in_time(lambda: open_run(small_run), fifos)
    problems = {p["file"]: p for p in store.overview()["problems"]}
    assert set(problems) == {"live.jsonl", "stream.parquet", "eval_report.json"}
    assert all(
        p["level"] == "warning" and p["message"] == "a FIFO (named pipe), not a regular file; not read"
        for p in problems.values()
    )
    assert store.overview()["episodes"] == 6  # the rest is shown
    with pytest.raises(OmrlError, match=r"live.jsonl is a FIFO \(named pipe\), not a regular file"):
        discover(small_run / "live.jsonl")  # named by the user: refused, not waited on


def test_metrics_are_parsed_again_only_when_the_file_changed(small_run, monkeypatch):
    import omrl.view.store as store_module

    calls = []
    real = store_module.read_metrics_file
    monkeypatch.setattr(store_module, "read_metrics_file", lambda *a: calls.append(a) or real(*a))
    store = open_run(small_run)
    for _ in range(5):  # every request of the page asks for the overview
        assert store.overview()["metrics"]["step"] == [1, 2, 3]
    assert len(calls) == 1
    write_metrics(small_run / "metrics.jsonl", steps=4)  # the run logs another step
    assert store.overview()["metrics"]["step"] == [1, 2, 3, 4] and len(calls) == 2


class _CountingKey(str):
    """A metric key that counts how often it is compared: a list's ``in`` compares with every element."""

    compared = 0

    def __eq__(self, other):
        _CountingKey.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_metric_keys_are_collected_in_linear_time():
    steps, keys = 200, 100
    records = [{"step": s, **{_CountingKey(f"metric_{k}"): float(s) for k in range(keys)}} for s in range(steps)]
    _CountingKey.compared = 0
    curves = columns(records)
    assert len(curves["series"]) == keys and curves["series"]["metric_7"][:2] == [0.0, 1.0]
    # a set lookup per key per record and one per value gathered: ~2 * steps * keys, not steps * keys**2 / 2
    assert _CountingKey.compared <= 3 * steps * keys
