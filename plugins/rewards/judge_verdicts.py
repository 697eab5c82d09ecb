"""The ``judge`` reward's verdicts: the :class:`Scale` a judge scores on, and reading a reply's verdict
on it (:func:`read_one` for one attempt, :func:`read_group` for a group judged together), which raise
:class:`Unreadable` when the reply holds none."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from omrl.errors import ConfigError, short_repr

SCALES = ("number", "yes_no", "likert")
#: a verdict line: ``SCORE: 7``, ``**Final score:** 7/10``, ``Score = yes`` (the last one counts)
_VERDICT = re.compile(r"^.*?\bscore\b[ \t*_]*[:=][ \t*_]*(.*?)[ \t*_.]*$", re.I | re.M)
_YES_NO = re.compile(r"[\W_]*(yes|no)\b", re.I)
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
#: a verdict that is the value and nothing more (``7``, ``7/10``, ``yes``): all a cut reply's last line may hold
#: a line's value that names the scale (``0-10``, ``1 to 5``): the judge describing it, not a verdict
_RANGE = re.compile(r"[-+]?\d+(?:\.\d+)?[ \t]*(?:-|\u2013|to)[ \t]*\d", re.I)
_VALUE_ALONE = re.compile(r"(?:[-+]?\d+(?:\.\d+)?(?:[ \t]*/[ \t]*\d+(?:\.\d+)?)?|yes|no)", re.I)
_THOUGHT = re.compile(r"<think>(.*?)</think>", re.I | re.S)
_THINK_OPEN, _THINK_CLOSE = re.compile(r"<think>", re.I), re.compile(r"</think>", re.I)
_ATTEMPT_ID = re.compile(r"[0-9]+")


class Unreadable(ValueError):
    """A verdict that is not on the scale."""


@dataclass(frozen=True)
class Scale:
    """How the judge gives a score, and how it becomes one in [0, 1]."""

    kind: str
    low: float
    high: float
    points: int

    def describe(self) -> str:
        if self.kind == "yes_no":
            return "yes or no"
        if self.kind == "likert":
            return f"an integer from 1 to {self.points} ({self.points} is best)"
        return f"a number from {self.low:g} to {self.high:g} ({self.high:g} is best)"

    def read(self, value: Any) -> float:
        """``value`` (a verdict's text, or a JSON value) as a score in [0, 1]; :class:`Unreadable` if off the scale."""
        if self.kind == "yes_no":
            found = None if isinstance(value, bool) else _YES_NO.match(str(value))
            word = value if isinstance(value, bool) else found.group(1).lower() if found else None
            if word in (True, "yes"):
                return 1.0
            if word in (False, "no"):
                return 0.0
            raise Unreadable(f"{short_repr(value)} is not yes or no")
        if isinstance(value, bool):
            raise Unreadable(f"{value!r} is no number")
        if isinstance(value, (int, float)):
            number = float(value) if abs(value) < 1e300 else math.inf  # an int too large for a float
        else:
            found = _NUMBER.search(str(value))
            if found is None:
                raise Unreadable(f"{short_repr(value)} holds no number")
            number = float(found.group())  # inf past the float range
        if not math.isfinite(number):
            raise Unreadable(f"{short_repr(value)} is not a finite number")
        if self.kind == "likert":
            if number != int(number) or not 1 <= number <= self.points:
                raise Unreadable(f"{number:g} is not an integer from 1 to {self.points}")
            return (number - 1) / (self.points - 1)
        if not self.low <= number <= self.high:
            raise Unreadable(f"{number:g} is outside [{self.low:g}, {self.high:g}]")
        return (number - self.low) / (self.high - self.low)


def make_scale(kind: str, low: float, high: float, points: int) -> Scale:
    if kind not in SCALES:
        raise ConfigError(
            f"reward 'judge' option scale={kind!r} is invalid; valid: number (from low to high), yes_no, "
            "likert (an integer from 1 to points)"
        )
    numbers = (low, high)
    if any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) for x in numbers):
        raise ConfigError(f"reward 'judge' options low={low!r} and high={high!r} must be finite numbers")
    if kind == "number" and not low < high:
        raise ConfigError(f"reward 'judge' needs low < high for scale=number, got low={low!r} high={high!r}")
    if isinstance(points, bool) or not isinstance(points, int) or points < 2:
        raise ConfigError(f"reward 'judge' option points={points!r} is invalid; valid: an integer >= 2")
    return Scale(kind, float(low), float(high), points)


# -- reading replies --------------------------------------------------------------------------------------------
def split_thinking(text: str) -> tuple[str, str]:
    """A reply's thinking and what it says outside it. Thinking is each ``<think>...</think>`` block, an unclosed
    ``<think>`` to the end (a reply cut while thinking), and all before a ``</think>`` that no ``<think>`` opened
    (a chat template that opens the block in the prompt). Only what is outside it holds a verdict."""
    thoughts = []
    closed, opened = _THINK_CLOSE.search(text), _THINK_OPEN.search(text)
    if closed and (opened is None or closed.start() < opened.start()):
        thoughts.append(text[: closed.start()])
        text = text[closed.end() :]

    def drop(block: re.Match[str]) -> str:
        thoughts.append(block.group(1))
        return "\n"

    text = _THOUGHT.sub(drop, text)
    opened = _THINK_OPEN.search(text)
    if opened:
        thoughts.append(text[opened.end() :])
        text = text[: opened.start()]
    return "\n\n".join(t.strip() for t in thoughts if t.strip()), text


def read_one(text: str, scale: Scale, cut: bool = False) -> tuple[float, str, str]:
    """The score, the verdict as written and the reasoning before it (the thinking first), from a reply that
    ends with ``SCORE: <value>`` (or is the bare value), outside its thinking; a line that gives the scale
    (``Note on score: 0-10``) is no verdict. A reply ``cut`` at max_tokens
    counts only when its last line is the verdict alone (``SCORE: 7``): anything after the verdict may have
    gone on to change it."""
    thought, said = split_thinking(text)
    found = [line for line in _VERDICT.finditer(said) if not _RANGE.match(line.group(1).strip())]
    if found:
        verdict = found[-1].group(1).strip()
        if cut and (said[found[-1].end() :].strip() or not _VALUE_ALONE.fullmatch(verdict)):
            raise Unreadable(f"the reply was cut short and its last line is no verdict alone: {short_repr(said)}")
        try:
            score = scale.read(verdict)
        except Unreadable as exc:
            raise Unreadable(f"the verdict {exc}") from None
        reasoning = "\n\n".join(part for part in (thought, said[: found[-1].start()].strip()) if part)
        return score, verdict, reasoning
    bare = said.strip().strip("*_`'\". ").lower()  # a reply that is the value alone: "7", "yes"
    if bare in ("yes", "no") if scale.kind == "yes_no" else _NUMBER.fullmatch(bare):
        try:
            return scale.read(bare), bare, thought
        except Unreadable as exc:
            raise Unreadable(f"the verdict {exc}") from None
    where = " outside its thinking" if thought else ""
    raise Unreadable(f"no line 'SCORE: <{scale.describe()}>'{where} in {short_repr(said.strip() if thought else text)}")


def read_group(text: str, count: int, scale: Scale, cut: bool = False) -> list[tuple[float, str, str]]:
    """Each attempt's score, verdict and explanation, in order, from the reply's JSON
    ``{"scores": [{"id": 1, "explanation": "...", "score": ...}, ...]}`` (its last such object outside its
    thinking). A reply ``cut`` at max_tokens is never read: its ranking may be a draft it went on to change."""
    if cut:
        raise Unreadable("a ranking in a reply that was cut short is not read")
    thought, said = split_thinking(text)
    found = _last_scores_object(said)
    if found is None:
        where = " outside its thinking" if thought else ""
        raise Unreadable(f"no JSON object with 'scores'{where} in {short_repr(said.strip() if thought else text)}")
    entries = found["scores"]
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "score" in e for e in entries):
        raise Unreadable(f"'scores' is not a list of objects with a score: {short_repr(entries)}")
    by_id: dict[int, dict[str, Any]] = {}
    for entry in entries:
        key = entry.get("id")
        if isinstance(key, str) and _ATTEMPT_ID.fullmatch(key.strip()):
            key = int(key)
        if isinstance(key, bool) or not isinstance(key, int):
            raise Unreadable(f"an entry's id {short_repr(entry.get('id'))} is not an attempt number")
        by_id[key] = entry
    if sorted(by_id) != list(range(1, count + 1)) or len(entries) != count:
        raise Unreadable(f"'scores' has ids {sorted(by_id)} for attempts 1 to {count}")
    out = []
    for i in range(1, count + 1):
        entry = by_id[i]
        try:
            score = scale.read(entry["score"])
        except Unreadable as exc:
            raise Unreadable(f"attempt {i}'s score {exc}") from None
        out.append((score, str(entry["score"]), str(entry.get("explanation") or "")))
    return out


def _last_scores_object(text: str) -> dict[str, Any] | None:
    decoder = json.JSONDecoder()
    found, i = None, text.find("{")
    while i != -1:
        try:
            value, end = decoder.raw_decode(text, i)
        except ValueError:
            i = text.find("{", i + 1)
            continue
        if isinstance(value, dict) and "scores" in value:
            found = value
        i = text.find("{", end if isinstance(value, dict) and "scores" in value else i + 1)
    return found
