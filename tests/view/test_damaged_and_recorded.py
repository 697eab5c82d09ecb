"""What a trajectory file records and what part of it is damaged: the viewer takes the tokenizer the file
names (and refuses one of another vocabulary), shows the row groups it can read, and opens an eval's
episodes from its report."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from omrl.data.trajectory import write_episodes
from omrl.errors import OmrlError
from omrl.models import load_tokenizer
from omrl.view import open_run
from omrl.view.server import make_server

from .conftest import make_episode
from .test_eval_folder import eval_folder


def recorded_file(tmp_path, count=3):
    """Episodes written with the tiny tokenizer recorded, away from any run or report that names a model."""
    episodes = [make_episode(task, 0, task % 2 == 0, 1.0) for task in range(count)]
    return write_episodes(episodes, tmp_path / "beam.parquet", load_tokenizer("tiny"))


def test_the_tokenizer_a_file_records_gives_the_token_text(tmp_path):
    store = open_run(recorded_file(tmp_path))
    assert store.token_text is not None and "the tokenizer the trajectory file records" in store.tokenizer_note


def test_a_tokenizer_of_another_vocabulary_is_refused_by_name(tmp_path):
    path = recorded_file(tmp_path)
    with pytest.raises(OmrlError, match="--tokenizer 'smollm2-135m': its vocabulary is not the one .* 4096 tokens"):
        open_run(path, tokenizer="smollm2-135m")


def test_a_model_of_another_vocabulary_in_the_run_is_passed_over(tmp_path):
    path = recorded_file(tmp_path)
    (tmp_path / "config.yaml").write_text("model:\n  name: smollm2-135m\n")  # the folder's config names another
    store = open_run(tmp_path)
    assert "the tokenizer the trajectory file records" in store.tokenizer_note  # not smollm2's vocabulary
    assert store.token_text.made(json.loads(pq.read_schema(path).metadata[b"omrl.tokenizer"]))


def damage(path, group):
    """Overwrite the head of every column's first data page in row ``group`` of ``path``."""
    meta = pq.ParquetFile(path).metadata.row_group(group)
    data = bytearray(path.read_bytes())
    for column in (meta.column(i) for i in range(meta.num_columns)):
        data[column.data_page_offset : column.data_page_offset + 16] = b"\xff" * 16
    path.write_bytes(bytes(data))
    return path


def damaged_group_file(tmp_path):
    """150 episodes in three row groups (64, 64, 22), the middle one damaged."""
    path = write_episodes([make_episode(task, 0, True, 1.0) for task in range(150)], tmp_path / "rg.parquet")
    return damage(path, 1)


def test_a_damaged_row_group_costs_its_own_episodes_only(tmp_path):
    store = open_run(damaged_group_file(tmp_path))
    assert len(store.summaries) == 86  # groups 0 and 2
    assert any("rows 64..127 (row group 1) cannot be read" in str(p) for p in store.problems)
    last = store.episode(85)  # the file's row 149, past the damaged group
    assert last["summary"]["task"] == 149 and "unavailable" not in last


def test_a_single_file_none_of_whose_episodes_can_be_read_is_an_error(tmp_path):
    path = damage(write_episodes([make_episode(task, 0, True, 1.0) for task in range(3)], tmp_path / "one.parquet"), 0)
    with pytest.raises(OmrlError, match="one.parquet: rows 0..2 .* cannot be read"):
        open_run(path)


def test_an_eval_report_opened_alone_shows_the_episodes_written_beside_it(tmp_path):
    folder = eval_folder(tmp_path)
    store = open_run(folder / "report.json")
    assert len(store.summaries) == 3
    assert "unavailable" not in store.episode(0)  # read whole from episodes.parquet


def test_a_host_that_cannot_be_bound_is_named_as_the_host(tmp_path):
    store = open_run(recorded_file(tmp_path))
    with pytest.raises(OmrlError, match="--host nosuchhost.invalid: cannot be bound") as error:
        make_server(store, host="nosuchhost.invalid", port=0)
    assert "--port" not in str(error.value)


def test_a_saved_page_of_episodes_whose_rows_cannot_be_read_says_so_and_counts_them_out(tmp_path):
    """The summaries' columns of a row group read, another column of it not: the page said "every episode
    is in this page" and the command "150 of 150 episodes", where 64 were listed without their turns."""
    from omrl.view.page import embedded_data, write_page

    path = write_episodes([make_episode(task, 0, True, 1.0) for task in range(150)], tmp_path / "rg.parquet")
    meta = pq.ParquetFile(path).metadata.row_group(1)
    (logprobs,) = (
        meta.column(i) for i in range(meta.num_columns) if meta.column(i).path_in_schema.startswith("logprobs")
    )
    data = bytearray(path.read_bytes())
    data[logprobs.data_page_offset : logprobs.data_page_offset + 16] = b"\xff" * 16
    path.write_bytes(bytes(data))
    store = open_run(path)
    assert len(store.summaries) == 150  # listed: their summaries read
    note = embedded_data(store, max_episodes=200)["note"]
    assert note.startswith("64 of its 150 episodes cannot be read, so the page lists them without their turns")
    assert write_page(store, tmp_path / "page.html", max_episodes=200)[1] == 86
