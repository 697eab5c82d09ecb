"""omrl.sandbox.process.LineReader on a real pipe: lines split over reads or sharing one, and each way a
line can fail to come (late, the writer gone, too long)."""

from __future__ import annotations

import os
import time

import pytest

from omrl.sandbox.process import LineReader


@pytest.fixture
def pipe():
    read, write = os.pipe()
    yield LineReader(read), write
    os.close(read)
    try:
        os.close(write)
    except OSError:
        pass  # the test closed it


def test_lines_come_whole_whether_split_over_writes_or_sharing_one(pipe):
    reader, write = pipe
    os.write(write, b'{"a": ')
    assert reader.line(time.monotonic() + 0.05) == "late"  # half a line is not a line
    os.write(write, b"1}\nsecond\nthi")
    assert reader.line(time.monotonic() + 1) == b'{"a": 1}'
    assert reader.line(time.monotonic() + 1) == b"second"  # kept from the same read
    os.write(write, b"rd\n")
    assert reader.line(time.monotonic() + 1) == b"third"


def test_a_closed_pipe_is_eof_and_a_line_past_the_limit_is_long(pipe):
    reader, write = pipe
    os.write(write, b"x" * 100)
    assert reader.line(time.monotonic() + 1, limit=50) == "long"
    assert reader.line(time.monotonic() + 0.05) == "late"  # no limit: the line may still end
    os.close(write)
    assert reader.line(time.monotonic() + 1) == "eof"
