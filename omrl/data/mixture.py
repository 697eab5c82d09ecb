"""Several datasets in one run, with weights: naming them, and drawing each one's share.

A dataset mixture is named the way an env mixture is (:mod:`omrl.mixture`), in the one ``dataset``
string, on the command line or in YAML::

    dataset=sft/webshop.parquet:0.7,sft/alfworld.jsonl:0.3
    dataset: sft/webshop.parquet:0.7,sft/alfworld.jsonl:0.3

Each entry is a path (a file or a directory of them, whatever the command reads) with an optional
weight after its last colon: what follows the last colon is a weight only when it reads as a number,
so a path with a colon in it keeps it (no weight: 1; weights are normalised). A path cannot contain a
comma, unless the whole string is that one path. One entry is no mixture: the run reads that path
exactly as before.

How a mixture is drawn (:func:`draw_mixture`), once when the run sets up, seeded by the run's seed:
N is the number of examples all sources hold together, and each source gives its weight's share of
N (rounded so the shares add up to N). A source holding more than its share gives a seeded sample
without replacement; one holding fewer gives each of its examples as many whole times as fit, then a
seeded sample without replacement for the rest (so upsampling repeats examples evenly, not at
random). The drawn examples are then shuffled together. An epoch is one pass over this draw: every
epoch walks the same drawn examples in its own order, which is what makes a resumed run see exactly
the data it would have.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from omrl.atomic import atomic_write_text
from omrl.errors import ConfigError
from omrl.mixture import parse_env_spec

MIX_FILE = "data_mix.json"  # where a run keeps its mixture's per-source counts, beside config.yaml


@dataclass(frozen=True)
class DataSource:
    """One dataset of a mixture: its path as written, and its weight (normalised over the mixture)."""

    path: str
    weight: float


def dataset_sources(text: str, key: str = "dataset") -> list[DataSource]:
    """The datasets ``text`` names (``a.parquet:0.7,b.jsonl:0.3``), weights normalised; one source of
    weight 1 for a plain path. Refuses an empty entry, a weight that is not a positive number, a path
    named twice, and (in a mixture of several) a path that does not exist, each by name."""
    if any(not piece.strip() for piece in text.split(",")):
        raise ConfigError(
            f"{key}={text!r} has an empty entry; write paths, each with an optional :weight, between commas"
        )
    if Path(text).expanduser().exists():  # a path that exists as written is one dataset, whatever it holds
        return [DataSource(text, 1.0)]
    entries = parse_env_spec(text)  # the weight after the last colon, as env mixtures read it
    for path, weight in entries:
        if not math.isfinite(weight) or weight <= 0:
            raise ConfigError(f"{key}: {path!r} has weight {weight!r}; a weight must be a positive number")
    seen: dict[Path, str] = {}
    for path, _ in entries:
        resolved = Path(path).expanduser().resolve()
        if resolved in seen:
            named = (
                f"{path!r} is named twice"
                if seen[resolved] == path
                else f"{seen[resolved]!r} and {path!r} name one file"
            )
            raise ConfigError(f"{key}: {named} in the mixture; name each dataset once, with one weight")
        seen[resolved] = path
    if len(entries) > 1:
        for path, _ in entries:
            if not Path(path).expanduser().exists():
                raise ConfigError(f"{key}: {path!r} does not exist{_weight_hint(path)} (in {key}={text})")
    total = sum(weight for _, weight in entries)
    if not math.isfinite(total):  # each weight finite, their sum not: normalising would give every source 0
        raise ConfigError(
            f"{key}={text!r}: the weights add up past the largest number; weights are normalised, so give "
            "smaller ones in the same ratios (e.g. 1 and 1)"
        )
    return [DataSource(path, weight / total) for path, weight in entries]


def dataset_as_saved(text: str) -> str:
    """``text`` with each path that exists here made absolute, weights kept as written: how a run's
    config.yaml keeps it, so the run resumes from any folder. What exists nowhere is left for
    :func:`dataset_sources` to refuse."""
    if not isinstance(text, str) or not text:
        return text
    if Path(text).expanduser().exists():
        return str(Path(text).expanduser().resolve())
    pieces = []
    for piece in (p.strip() for p in text.split(",")):
        head, colon, tail = piece.rpartition(":")
        path, weight = (head, colon + tail) if colon and _is_number(tail) else (piece, "")
        if path and Path(path).expanduser().exists():
            path = str(Path(path).expanduser().resolve())
        pieces.append(path + weight)
    return ",".join(pieces)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def dataset_inputs(text: str, flag: str) -> dict[str, str]:
    """The paths ``text`` names, keyed by how to name each in a message (``--data``, or ``--data[1]``
    in a mixture): the inputs a run's output directory must not overlap."""
    sources = dataset_sources(text) if text else []
    return {f"{flag}[{i}]" if len(sources) > 1 else flag: s.path for i, s in enumerate(sources)}


def _weight_hint(path: str) -> str:
    """Why a missing path may be a typed weight: ``a.parquet:x`` where ``a.parquet`` exists."""
    head, colon, tail = path.rpartition(":")
    if colon and Path(head).expanduser().exists():
        return f"; {tail!r} after the last colon is not a number, so it was read as part of the path"
    return ""


def draw_counts(sizes: Sequence[int], weights: Sequence[float]) -> list[int]:
    """How many examples each source gives: its weight's share of all sources' examples together,
    rounded by largest remainder so the counts add up to that total.

    >>> draw_counts([100, 10], [0.5, 0.5])
    [55, 55]
    """
    total = sum(sizes)
    exact = [w / sum(weights) * total for w in weights]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def draw_mixture(sizes: Sequence[int], weights: Sequence[float], seed: int) -> list[tuple[int, int]]:
    """(source, index in that source) of every drawn example, shuffled together: see the module's
    docstring. The same sizes, weights and seed always give the same draw."""
    if any(size < 1 for size in sizes):
        raise ValueError(f"every source must hold an example to draw from, got sizes {list(sizes)}")
    rng = np.random.default_rng([seed % 2**32, 0xDA7A, 1])  # a stream of its own, apart from the epoch shuffles
    drawn: list[tuple[int, int]] = []
    for source, (size, count) in enumerate(zip(sizes, draw_counts(sizes, weights))):
        whole, rest = divmod(count, size)
        items = list(range(size)) * whole + rng.choice(size, rest, replace=False).tolist()
        drawn += [(source, item) for item in items]
    return [drawn[i] for i in rng.permutation(len(drawn)).tolist()]


def mix_summary(
    sources: Sequence[DataSource], sizes: Sequence[int], drawn: Sequence[tuple[int, int]], unit: str = "examples"
) -> list[dict]:
    """Per source: its path, weight, how many ``unit`` it holds and how many were drawn (a run's record of its mix)."""
    counts = np.bincount([source for source, _ in drawn], minlength=len(sources)).tolist()
    return [
        {"dataset": s.path, "weight": round(s.weight, 6), unit: size, "drawn": count}
        for s, size, count in zip(sources, sizes, counts)
    ]


def mix_line(summary: Sequence[dict], unit: str = "examples") -> str:
    """One line for the log: ``a.parquet (weight 0.70): 84 drawn of 120 examples; b.jsonl (weight 0.30): 36 ...``."""
    return "; ".join(
        f"{s['dataset']} (weight {s['weight']:.2f}): {s['drawn']} drawn of {s[unit]} {unit}"
        + (" (its weight is below one example's share)" if s["drawn"] == 0 else "")
        for s in summary
    )


def mix_json(dataset: str, seed: int, summary: Sequence[dict]) -> str:
    """What a run writes to its ``data_mix.json``: the ``dataset`` string, the seed of the draw, the summary."""
    return json.dumps({"dataset": dataset, "seed": seed, "sources": list(summary)}, indent=2) + "\n"


def report_mix(
    summary: Sequence[dict], unit: str, dataset: str, seed: int, strategy: Any, console: Any, output_dir: Path
) -> None:
    """A mixture's per-source counts (:func:`mix_summary`; none for one dataset): on the main process's
    console at the start of a run, and in ``<output_dir>/data_mix.json``."""
    if not summary:
        return
    if strategy.is_main:
        line = mix_line(summary, unit)
        console.print(f"dataset mixture (seed {seed}): {line}", highlight=False, soft_wrap=True)
    strategy.on_main(atomic_write_text, Path(output_dir) / MIX_FILE, mix_json(dataset, seed, summary))
