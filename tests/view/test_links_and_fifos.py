"""Files in a run that the viewer must not open or follow: a FIFO where it reads a heartbeat or a report,
and links leading out of the run (to a file or a folder), each named by a warning."""

from __future__ import annotations

import json
import os

from omrl.data.trajectory import write_episodes
from omrl.view import open_run

from .conftest import small_episodes
from .test_loading import _opens_in_time

OUTSIDE_FILE = "a link to a file outside the run directory; not followed"
OUTSIDE_FOLDER = "a link to a folder outside the run directory; not followed"


def _beat(step: int, **extra) -> dict:
    return {"time": 1.7e9, "step": step, "stages": {"generate": {"done": 3}}, "open": [], **extra}


def _warnings(store) -> dict[str, str]:
    return {p["file"]: p["message"] for p in store.overview()["problems"] if p["level"] == "warning"}


def test_a_fifo_at_the_heartbeat_is_never_opened(small_run):
    fifo = small_run / "heartbeat.json"
    os.mkfifo(fifo)
    overview = _opens_in_time(lambda: open_run(small_run).overview(), [fifo])
    assert overview["stages"] is None and overview["episodes"] == 6


def test_a_fifo_at_the_report_beside_a_trajectory_file_is_never_opened(tmp_path):
    write_episodes(small_episodes(), tmp_path / "episodes.parquet")
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    store = _opens_in_time(lambda: open_run(tmp_path / "episodes.parquet"), [fifo])
    assert len(store.summaries) == 6


def test_a_heartbeat_linked_from_outside_the_run_is_not_read(small_run, tmp_path):
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps(_beat(9, secret="SECRET")))
    (small_run / "heartbeat.json").symlink_to(outside)
    store = open_run(small_run)
    assert store.overview()["stages"] is None
    assert _warnings(store)["heartbeat.json"] == OUTSIDE_FILE


def test_the_heartbeat_keeps_only_what_the_page_shows(small_run):
    (small_run / "heartbeat.json").write_text(json.dumps(_beat(4, secret="SECRET")))
    assert open_run(small_run).overview()["stages"] == _beat(4)


def test_a_folder_linked_from_outside_the_run_is_named(small_run, tmp_path):
    outside = tmp_path / "elsewhere" / "rollouts"
    outside.mkdir(parents=True)
    write_episodes(small_episodes(), outside / "step-1.parquet")
    (small_run / "rollouts").symlink_to(outside, target_is_directory=True)
    inside = small_run / "kept"
    inside.mkdir()
    (small_run / "kept-again").symlink_to(inside, target_is_directory=True)  # a link within the run: no warning
    store = open_run(small_run)
    assert _warnings(store) == {"rollouts": OUTSIDE_FOLDER}
    assert len(store.summaries) == 6  # rollout.parquet's only


def test_a_metrics_file_linked_from_outside_is_named_once(small_run, tmp_path):
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text('{"step": 1, "loss": 0.5}\n')
    (small_run / "metrics.jsonl").unlink(missing_ok=True)
    (small_run / "metrics.jsonl").symlink_to(outside)
    problems = [p for p in open_run(small_run).overview()["problems"] if p["file"] == "metrics.jsonl"]
    assert [p["message"] for p in problems] == [OUTSIDE_FILE]  # it was named twice


def test_step_rollouts_a_live_run_writes_after_the_viewer_started_are_said_to_be_unlisted(small_run):
    (small_run / "rollouts").mkdir()
    write_episodes(small_episodes(), small_run / "rollouts" / "step-00000001.parquet")
    store = open_run(small_run)
    assert not any("since the viewer read the run" in message for message in _warnings(store).values())
    write_episodes(small_episodes(), small_run / "rollouts" / "step-00000002.parquet")
    assert _warnings(store)["rollouts/step-00000002.parquet"] == (
        "1 step rollout file written since the viewer read the run (named here) is not listed: "
        "restart omrl view to see the episodes"
    )
