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
