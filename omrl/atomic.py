"""Writing files so that a crash never leaves one half-written: a temporary sibling, then a rename."""

from __future__ import annotations

import io
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq


def umask() -> int:
    """The process's umask, read without changing it where the kernel says it (Linux 4.7+)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (a moment another thread's new file could see)
    os.umask(mask)
    return mask


def readable_as_umask_allows(folder: str | os.PathLike) -> None:
    """Every file under ``folder`` as readable as a plain ``open()`` would make it: safetensors writes its
    files 0600 whatever the umask, so a model or a checkpoint would be the writer's alone (a vLLM server
    run by another user could not read it)."""
    mode = 0o666 & ~umask()
    for path in Path(folder).rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(mode)


@contextmanager
def naming(path: Path) -> Iterator[None]:
    """An OSError that names no file (a write's: "No space left on device") names ``path``, so the error
    says which file could not be written."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc


def _temporary_sibling(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:  # it names its random temporary file: the user asked for ``path``
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    # mkstemp makes the file private (0600) and the rename would keep that: give it the mode
    # a plain open() would have, so reports and checkpoints are readable as any other file
    os.fchmod(fd, 0o666 & ~umask())
    os.close(fd)
    return Path(tmp)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file, fsync and a rename."""
    path = Path(path)
    with naming(path):
        tmp = _temporary_sibling(path)
        try:
            with tmp.open("wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` (UTF-8) through a temporary file, fsync and a rename."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_save_figure(figure, path: str | os.PathLike, dpi: int = 100) -> None:
    """Save a matplotlib ``figure`` as a PNG at ``path``, whole or not at all (the figure stays open)."""
    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=dpi)
    atomic_write_bytes(path, image.getvalue())


def atomic_write_parquet(table: pa.Table, path: str | os.PathLike, row_group_size: int | None = None) -> None:
    """Write ``table`` to ``path`` through a temporary file and a rename."""
    path = Path(path)
    with naming(path):
        tmp = _temporary_sibling(path)
        try:
            pq.write_table(table, tmp, row_group_size=row_group_size)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
