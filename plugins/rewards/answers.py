"""Answer rewards beyond exact match: numbers within a tolerance, and mathematical equivalence.

Both are episode-level (the value sits on the last turn) and read the answer and the ground
truths as ``exact_match`` does (:func:`~omrl_plugins.rewards.outcome.final_answer`,
:func:`~omrl_plugins.rewards.outcome.ground_truths`). The string-level checks
(:func:`numbers_match`, :func:`math_equivalent`) are what the ``dataset`` env scores its
answers with too, so its own reward and these rewards agree.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction
from types import ModuleType
from typing import Any

from omrl.data.trajectory import Episode, Turn
from omrl.rewards import RewardError, episode_reward
from omrl_plugins.rewards import math_worker
from omrl_plugins.rewards.outcome import final_answer, ground_truths, normalize_answer, unanswered

MATH_INSTALL = "pip install 'omrl[math]'"
MATH_TIMEOUT_S = 5.0  # the most one math-verify comparison may take; past it the answer is not equal
MAX_EXPONENT = 1000  # a number written with a longer exponent is no number (its exact value would take long)
# One number as people write it: a sign, a currency sign, thousands separators, decimals, an
# exponent, a fraction a/b, a percent sign. Not inside a word ("x2", "v1.5"): the sign and the
# digits must not follow a letter, a digit or a period.
_NUMBER = re.compile(
    r"""
    (?<![\w.])
    (?P<sign>[-+\u2212])?
    \$?\s?
    (?P<sign2>[-\u2212])?
    (?P<body>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)
    (?:[eE](?P<exp>[-+]?\d+))?
    (?:\s?/\s?(?P<den>\d+)(?![\d.]))?
    (?P<percent>\s?%)?
    """,
    re.X,
)
_LATEX_COMMAND = re.compile(r"\\[a-zA-Z]+")
_PLAIN_NUMBER = re.compile(r"[-+]?\d{1,100}(?:\.\d{1,100})?")
_WORD = re.compile(r"[a-zA-Z]{2,}")


def final_number(text: str) -> list[Fraction]:
    """The last number in ``text`` as exact values: one, or two for a percentage (``50%`` is 50 or 1/2).

    Thousands separators, ``$``, a sign, decimals, an exponent and a fraction ``a/b`` are read; a
    number glued to a word (``x2``), or with an exponent past :data:`MAX_EXPONENT`, is not. Empty when
    ``text`` holds no number.

    >>> final_number("I count 1,200 apples, so $3.50 each")
    [Fraction(7, 2)]
    >>> final_number("-3/4")
    [Fraction(-3, 4)]
    >>> final_number("about 50%")
    [Fraction(50, 1), Fraction(1, 2)]
    >>> final_number("none")
    []
    """
    for match in reversed(list(_NUMBER.finditer(text))):
        exponent = match["exp"] or "0"
        if len(exponent.lstrip("+-0")) > 6 or abs(int(exponent)) > MAX_EXPONENT:  # no int() of thousands of digits
            continue
        # through Decimal: Fraction and int refuse text of more digits than Python's int-from-text limit
        value = Fraction(Decimal(f"{match['body'].replace(',', '')}e{exponent}"))
        if match["den"] is not None:
            denominator = Fraction(Decimal(match["den"]))
            if denominator == 0:
                continue  # "x/0" is no number
            value /= denominator
        if match["sign"] in ("-", "\u2212") or match["sign2"] is not None:
            value = -value
        return [value, value / 100] if match["percent"] else [value]
    return []


def numbers_match(predicted: str, truth: str, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Whether the last number of ``predicted`` equals the last number of ``truth`` within the
    tolerances (``math.isclose``); False when ``predicted`` holds no number.

    >>> numbers_match("The total is $1,234.", "1234")
    True
    >>> numbers_match("0.3333334", "1/3"), numbers_match("0.33", "1/3")
    (True, False)
    >>> numbers_match("12%", "0.12"), numbers_match("7 apples", "#### 8")
    (True, False)
    """
    targets = final_number(truth)
    return any(_close(value, target, rel_tol, abs_tol) for value in final_number(predicted) for target in targets)


def _close(value: Fraction, target: Fraction, rel_tol: float, abs_tol: float) -> bool:
    if value == target:
        return True
    try:
        return math.isclose(float(value), float(target), rel_tol=rel_tol, abs_tol=abs_tol)
    except OverflowError:  # beyond a float: only exact equality counts
        return False


def check_tolerances(owner: str, rel_tol: Any, abs_tol: Any, error: type[Exception] = RewardError) -> None:
    """Raise ``error`` naming ``owner`` unless both tolerances are finite numbers >= 0."""
    for name, value in (("rel_tol", rel_tol), ("abs_tol", abs_tol)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise error(f"{owner} option {name}={value!r} is invalid; valid: a finite number >= 0 (e.g. 1e-6)")


def require_math_verify(owner: str, error: type[Exception] = RewardError) -> ModuleType:
    """The ``math_verify`` module, or ``error`` naming ``owner`` and the install line."""
    try:
        import math_verify
    except ImportError as exc:
        raise error(
            f"{owner} needs the math-verify package, which is not installed; install it with: {MATH_INSTALL}"
        ) from exc
    return math_verify


def math_equivalent(predicted: str, truth: str, timeout_s: float = MATH_TIMEOUT_S) -> bool:
    """Whether ``predicted`` and ``truth`` are the same mathematical answer by math-verify
    (``\\frac{1}{2}`` and ``0.5``, ``x = 3`` and ``3``, ``\\boxed{42}`` and ``42``), bounded by
    ``timeout_s`` on any thread: an answer that takes longer (``9^{9^{9^{9}}}``) is not equal.

    The same text, and two plain numbers, are answered at once (:func:`plain_verdict`); anything
    else is compared by :func:`compare_math` in a worker process
    (:func:`omrl_plugins.rewards.math_worker.equivalent`), since math-verify's own bound, a signal
    alarm, works on the main thread only and cannot stop a computation inside C.
    """
    verdict = plain_verdict(predicted, truth)
    if verdict is not None:
        return verdict
    require_math_verify("math_verify")  # the friendly error here, not in the worker
    return math_worker.equivalent(predicted, truth, timeout_s)


def plain_verdict(predicted: str, truth: str) -> bool | None:
    """math-verify's verdict where no parsing is needed: True for the same text, or for numbers of
    the same value; False for two different integers; None when math-verify must read them
    (different decimals may still match: it rounds them).

    >>> plain_verdict(" 42", "42"), plain_verdict("3.0", "3"), plain_verdict("-3", "3")
    (True, True, False)
    >>> plain_verdict("3.1416", "3.14159") is None and plain_verdict("x = 3", "3") is None
    True
    """
    predicted, truth = predicted.strip(), truth.strip()
    if predicted == truth:
        return True
    if not (_PLAIN_NUMBER.fullmatch(predicted) and _PLAIN_NUMBER.fullmatch(truth)):
        return None
    if Fraction(predicted) == Fraction(truth):
        return True
    return False if "." not in predicted + truth else None


def compare_math(mv: ModuleType, predicted: str, truth: str, timeout: int | None) -> bool:
    """math-verify's comparison as :func:`math_equivalent` makes it (in a worker process): each
    side read by :func:`read_math`; a ground truth that reads as no expression is compared as text
    (as ``exact_match`` would). ``timeout``: math-verify's own bound on each step, in seconds."""
    gold = read_math(mv, truth, timeout)
    if not gold:
        return normalize_answer(predicted) == normalize_answer(truth)
    answer = read_math(mv, predicted, timeout)
    return bool(answer) and bool(mv.verify(gold, answer, timeout_seconds=timeout))


def read_math(mv: ModuleType, text: str, timeout: int | None) -> list[Any]:
    """math-verify's reading of ``text``: a bare expression (no ``$``, no ``\\boxed``, no words once
    LaTeX commands are dropped: ``2\\sqrt{2}``, ``x^2+1``) as LaTeX math, which math-verify reads
    well only between ``$`` signs; anything else (``The answer is $7$``, ``42 apples``) as it is."""
    bare = "$" not in text and "\\boxed" not in text and not _WORD.search(_LATEX_COMMAND.sub(" ", text))
    parsed = mv.parse(f"${text}$", parsing_timeout=timeout) if bare and text.strip() else []
    return parsed or mv.parse(text, parsing_timeout=timeout)


def answer_of(action: str) -> str:
    """The answer in an action as the answer rewards read it (``answer[42]`` -> ``42``)."""
    turn = Turn("", "", action, True, 0.0, True)
    return final_answer(Episode(env="", task_id=0, split="", instruction="", turns=[turn]))


def _no_number(episode: Episode, truths: list[str]) -> RewardError:
    return RewardError(
        f"reward 'numeric_match': the ground truth {truths[0]!r} of episode (env {episode.env!r}, task "
        f"{episode.task_id}) holds no number; use exact_match, accuracy or math_verify for text answers"
    )


@episode_reward
def numeric_match_reward(episode: Episode, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> float:
    """1.0 when the final answer's last number equals a ground truth's last number, else 0.0.

    Numbers compare within ``rel_tol`` (relative) or ``abs_tol`` (absolute), as ``math.isclose``;
    thousands separators, ``$`` and ``%`` are read (``50%`` matches 50 and 0.5), and a ground
    truth with reasoning before its number (GSM8K's ``... #### 72``) counts by its last number.
    An answer without a number, or a last reply that did not parse, scores 0; a ground truth
    without a number raises.

    >>> from omrl.data import Episode, Turn
    >>> turn = Turn("obs", "Act: answer[$1,200]", "answer[$1,200]", True, 0.0, True,
    ...             info={"ground_truth": "1200.0"})
    >>> numeric_match_reward([Episode(env="qa", task_id=0, split="test", instruction="", turns=[turn])])
    [[1.0]]
    """
    check_tolerances("reward 'numeric_match'", rel_tol, abs_tol)
    if unanswered(episode):
        return 0.0
    truths = ground_truths(episode, "numeric_match")
    if not any(final_number(truth) for truth in truths):
        raise _no_number(episode, truths)
    predicted = final_answer(episode)
    return float(any(numbers_match(predicted, truth, rel_tol, abs_tol) for truth in truths))


@episode_reward
def math_verify_reward(episode: Episode) -> float:
    """1.0 when the final answer is mathematically equivalent to a ground truth by math-verify, else 0.0.

    A last reply that did not parse scores 0. Needs the optional extra: ``pip install 'omrl[math]'``
    (imported at the first use).

    >>> from omrl.data import Episode, Turn
    >>> turn = Turn("obs", "Act: \\\\frac{1}{2}", "\\\\frac{1}{2}", True, 0.0, True, info={"answer": "0.5"})
    >>> math_verify_reward([Episode(env="math", task_id=0, split="test", instruction="", turns=[turn])])
    [[1.0]]
    """
    require_math_verify("reward 'math_verify'")
    if unanswered(episode):
        return 0.0
    predicted = final_answer(episode)
    return float(any(math_equivalent(predicted, truth) for truth in ground_truths(episode, "math_verify")))
