"""A trajectory file cut down after it was written (pyarrow's ``select`` and ``drop_columns`` keep its
``omrl.schema`` tag) is refused naming what it lacks, never read with defaults in the place of what was
cut (``won`` False would pass for a loss). A file of an older layout still reads, with defaults for
what a later layout added."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from omrl.data import Episode, Turn, read_episodes, write_episodes
from omrl.data.layouts import ADDED, READABLE_SCHEMAS, columns_of
from omrl.data.trajectory import SCHEMA
from omrl.errors import OmrlError
from tests.data.episodes import played_episode
from tests.helpers import cli_exit


def _won_episode() -> Episode:
    return Episode(
        "gridworld",
        3,
        "train",
        "reach the goal",
        turns=[Turn("start", "Act: up", "up", True, 1.0, True, {"won": True}, (2, 4), node_id=1, parent_id=0)],
        token_ids=[1, 2, 3, 4],
        loss_mask=[0, 0, 1, 1],
        logprobs=[0.0, 0.0, -0.5, -0.5],
        won=True,
        score=1.0,
        rewards={"total": [1.0]},
        messages=[{"role": "user", "content": "start"}, {"role": "assistant", "content": "Act: up"}],
    )


def _cut(source: Path, target: Path, names: list[str], tag: bytes | None = None) -> Path:
    """``source`` without the columns, and the fields of each turn or message ("turns.reward"), in
    ``names``; its metadata kept (as pyarrow keeps it) or its tag set to ``tag``."""
    table = pq.read_table(source)
    metadata = {**table.schema.metadata, **({b"omrl.schema": tag} if tag else {})}
    for column in ("turns", "messages"):
        cut = {name.split(".")[1] for name in names if name.startswith(f"{column}.")}
        if not cut:
            continue
        lists = table.column(column).combine_chunks()
        items = lists.flatten()
        kept = [field.name for field in items.type if field.name not in cut]
        items = pa.StructArray.from_arrays([items.field(name) for name in kept], names=kept)
        index = table.schema.get_field_index(column)
        table = table.set_column(index, column, pa.ListArray.from_arrays(lists.offsets, items))
    table = table.drop_columns([name for name in names if "." not in name]).replace_schema_metadata(metadata)
    pq.write_table(table, target)
    return target


def _refused(path: Path, names: list[str]) -> None:
    message = f"{path} lacks the column(s) {', '.join(names)}: it is not a whole omrl trajectory file"
    with pytest.raises(OmrlError, match=re.escape(message)):
        read_episodes(path)


@pytest.mark.parametrize(
    "cut",
    [["won"], ["score"], ["env", "turns"], ["rewards"], ["end_reason"], ["info"], ["turns.reward"], ["messages.role"]],
)
def test_a_file_cut_down_to_fewer_columns_is_refused_naming_them(tmp_path, cut):
    whole = write_episodes([_won_episode()], tmp_path / "whole.parquet")
    assert read_episodes(whole)[0].won
    _refused(_cut(whole, tmp_path / "cut.parquet", cut), cut)


@pytest.mark.parametrize("version", sorted(ADDED))
def test_every_older_layout_still_reads_and_must_hold_its_own_columns(tmp_path, version):
    whole = write_episodes([_won_episode()], tmp_path / "whole.parquet")
    later = [name for name in columns_of(len(ADDED)) if name not in columns_of(version)]
    tag = f"episode/{version}".encode()
    old = _cut(whole, tmp_path / "old.parquet", later, tag)
    assert pq.read_schema(old).names == [name for name in columns_of(version) if "." not in name]
    (episode,) = read_episodes(old)
    assert episode.won and episode.score == 1.0 and episode.turns[0].action == "up"
    assert episode.turns[0].node_id == (1 if version >= 3 else -1) and episode.row_starts == []
    assert episode.messages[1] == {"role": "assistant", "content": "Act: up"}
    own = ADDED[version][0]  # what this version added: a file of it that lacks it is cut down
    _refused(_cut(whole, tmp_path / "cut.parquet", [*later, own], tag), [own])


def test_the_newest_layout_is_what_write_episodes_writes():
    assert SCHEMA.metadata[b"omrl.schema"] == READABLE_SCHEMAS[-1] == f"episode/{len(ADDED)}".encode()
    assert [name for name in columns_of(len(ADDED)) if "." not in name] == SCHEMA.names
    turn_fields = [field.name for field in SCHEMA.field("turns").type.value_type]
    assert [name.split(".")[1] for name in columns_of(len(ADDED)) if name.startswith("turns.")] == turn_fields


def test_sft_refuses_a_trajectory_file_without_won(tiny_tokenizer, tmp_path, capsys):
    whole = write_episodes([played_episode(tiny_tokenizer, task) for task in range(4)], tmp_path / "whole.parquet")
    cut = _cut(whole, tmp_path / "no_won.parquet", ["won"])
    args = [
        "--model",
        "tiny",
        "--dataset",
        str(cut),
        "--output-dir",
        str(tmp_path / "sft"),
        "logging.tensorboard=false",
    ]
    code, _, err = cli_exit(capsys, "sft", *args)
    err = " ".join(err.split())
    assert code == 2 and f"{cut} lacks the column(s) won: it is not a whole omrl trajectory file" in err, err
