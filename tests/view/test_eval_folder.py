"""An eval's folder in the viewer: its episodes listed once (the episodes file and the report hold the same
ones), and a token-level view from the model the report names when the trajectory file records none."""

from __future__ import annotations

import json

from omrl.data import write_episodes
from omrl.data.trajectory import Episode
from omrl.view.sources import discover
from omrl.view.store import EpisodeStore
from omrl.view.tokens import find_tokenizer


def eval_folder(tmp_path, episodes: int = 3):
    folder = tmp_path / "evals" / "x"
    folder.mkdir(parents=True)
    played = [
        Episode(env="gridworld", task_id=i, split="test", instruction="", token_ids=[1, 2, 3]) for i in range(episodes)
    ]
    write_episodes(played, folder / "episodes.parquet")  # no tokenizer recorded
    report = {
        "metrics": {"episodes": episodes, "success_rate": 0.0},
        "episodes": [{"env": "gridworld", "task_id": i, "won": False, "score": 0.0} for i in range(episodes)],
        "config": {"model": {"name": "tiny"}},
    }
    (folder / "report.json").write_text(json.dumps(report))
    return folder


def test_an_eval_folder_lists_each_episode_once(tmp_path):
    folder = eval_folder(tmp_path)
    store = EpisodeStore(discover(folder))
    assert len(store.summaries) == 3 and len(store.reports) == 1


def test_the_report_beside_an_episodes_file_names_the_tokenizer(tmp_path):
    folder = eval_folder(tmp_path)
    tokens, where = find_tokenizer(discover(folder / "episodes.parquet"))
    assert tokens is not None and "the eval report beside it names" in where


def custom_report(folder, config: dict, episodes: int = 3):
    """``omrl eval --output-dir D --report D/custom.json``: the episodes in D/episodes.parquet, the report beside."""
    eval_folder(folder.parent.parent, episodes)  # evals/x: episodes.parquet and report.json
    report = json.loads((folder / "report.json").read_text())
    (folder / "report.json").unlink()
    (folder / "custom.json").write_text(json.dumps({**report, "config": {**report["config"], **config}}))
    return folder / "custom.json"


def test_a_custom_named_report_opened_alone_shows_the_episodes_of_its_output_dir(tmp_path):
    folder = tmp_path / "evals" / "x"
    report = custom_report(folder, {"output_dir": str(folder), "report": str(folder / "custom.json")})
    store = EpisodeStore(discover(report))
    assert [f.label for f in store.files] == ["episodes.parquet"]
    assert len(store.summaries) == 3 and "unavailable" not in store.episode(0)


def test_an_episodes_file_the_report_did_not_write_is_not_taken_for_its_own(tmp_path):
    folder = tmp_path / "evals" / "x"
    report = custom_report(folder, {"output_dir": "", "report": str(folder / "custom.json")})  # --report alone
    store = EpisodeStore(discover(report))
    assert [f.label for f in store.files] == ["custom.json"]  # summaries from the report only
    assert "unavailable" in store.episode(0)


def test_a_reports_summaries_leave_token_counts_unknown_and_sort_last(tmp_path):
    folder = tmp_path / "evals" / "x"
    report = custom_report(folder, {"output_dir": ""})
    store = EpisodeStore(discover(report))
    assert [(e["tokens"], e["generated"]) for e in store.summaries] == [(None, None)] * 3
    write_episodes(
        [Episode(env="gridworld", task_id=9, split="test", instruction="", token_ids=[1, 2])], tmp_path / "r.parquet"
    )
    (folder / "episodes.parquet").unlink()  # the run: the report's summaries and another file's whole episode
    store = EpisodeStore(discover(tmp_path))
    for order in ("tokens", "-tokens"):
        assert [e["tokens"] is None for e in store.query({"sort": order})["items"]] == [False, True, True, True]
