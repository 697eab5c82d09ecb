"""Outcome rewards: task success, and answers compared to a ground truth.

Each is an episode-level reward: its value sits on the episode's last turn.
"""

from __future__ import annotations

import re
import string
from typing import Any

from omrl.data.trajectory import Episode
from omrl.rewards import RewardError, episode_reward

GROUND_TRUTH_KEYS = ("ground_truth", "answer")
# an answer wrapped in a final action, e.g. "answer[42]" or "finish(Paris)"
_ANSWER_ACTION = re.compile(r"^\s*(?:answer|finish|submit|final_answer)\s*[\[(](.*)[\])]\s*$", re.I | re.S)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
# an answer that is one number: a sign, digits (in groups of three between commas, or not), decimals
_WHOLE_NUMBER = re.compile(r"(?P<sign>[-+]?)\s*(?P<digits>\d{1,3}(?:,\d{3})+(?:\.\d*)?|\d+(?:\.\d*)?|\.\d+)")
# punctuation that makes a number what it is: a sign or a point before digits (not after a letter, as in
# "covid-19"), a point, comma or slash between digits ("3.5", "10,00", "1/2")
_NUMBER_PUNCTUATION = re.compile(r"(?<![^\W\d_])[-.](?=\d)|(?<=\d)[.,/](?=\d)")
_MINUS_SIGN = str.maketrans({"\u2212": "-"})  # the typographic minus


@episode_reward
def goal_reward(episode: Episode, binary: bool = False) -> float:
    """Task success: 1.0 if the episode was won, else the env's final score in [0, 1].

    Reads ``Episode.won`` and ``Episode.score``, which the rollout copies from the
    last step's info. With ``binary=True`` only a win counts (1.0 or 0.0), e.g. to
    reward full WebShop purchases and nothing partial.

    >>> from omrl.data import Episode, Turn
    >>> turn = Turn("obs", "Act: buy", "buy", True, 0.0, True)
    >>> partial = Episode(env="webshop", task_id=0, split="train", instruction="",
    ...                   turns=[turn, turn], won=False, score=0.75)
    >>> goal_reward([partial])
    [[0.0, 0.75]]
    >>> goal_reward([partial], binary=True)
    [[0.0, 0.0]]
    """
    if episode.won:
        return 1.0
    return 0.0 if binary else float(episode.score)


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles (a, an, the), single spaces (SQuAD-style); but a sign,
    a decimal point, a comma or a slash in a number stays (``-3`` is not ``3``, ``3.5`` not ``35``,
    ``1/2`` not ``12``), and an answer that is one number is written as its value.

    >>> normalize_answer("  The Eiffel-Tower! ")
    'eiffeltower'
    >>> normalize_answer("\u22123"), normalize_answer("1,000.50"), normalize_answer("x = -3.5"), normalize_answer("10,00")
    ('-3', '1000.5', 'x -3.5', '10,00')
    """
    text = text.lower().translate(_MINUS_SIGN)
    number = _WHOLE_NUMBER.fullmatch(text.strip())
    if number:
        return _number_text(number["sign"], number["digits"])
    kept = {match.start() for match in _NUMBER_PUNCTUATION.finditer(text)}
    text = "".join(ch for i, ch in enumerate(text) if ch not in string.punctuation or i in kept)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _number_text(sign: str, digits: str) -> str:
    """A number as its value reads, exactly (no float rounding): ``+007.50`` -> ``7.5``, ``-0.0`` -> ``0``."""
    whole, _, fraction = digits.replace(",", "").partition(".")
    text = (whole.lstrip("0") or "0") + ("." + fraction.rstrip("0") if fraction.rstrip("0") else "")
    return "-" + text if sign == "-" and text != "0" else text


def final_answer(episode: Episode) -> str:
    """The last turn's action, unwrapped from ``answer[...]``/``finish(...)`` ("" if it did not parse)."""
    action = episode.turns[-1].action or ""
    wrapped = _ANSWER_ACTION.match(action)
    return (wrapped.group(1) if wrapped else action).strip()


def unanswered(episode: Episode) -> bool:
    """Whether the agent gave no answer: its last reply did not parse, or the turn cap or the context
    ended the episode on a step that reported no ground truth (a tool call, a move); the env saw no
    answer, so an answer reward scores such an episode 0 (the agent's failure) instead of stopping."""
    last = episode.turns[-1]
    if last.action is None:
        return True
    cut = episode.end_reason in ("max_turns", "max_context")
    return cut and all(last.info.get(key) is None for key in GROUND_TRUTH_KEYS)


def ground_truths(episode: Episode, reward: str) -> list[str]:
    """The accepted answers from the last turn's info (``ground_truth`` or ``answer``; a list means any of them).

    Raises instead of scoring 0 when there is none: a reward that silently
    stays 0 looks like a model that never learns.
    """
    info = episode.turns[-1].info
    for key in GROUND_TRUTH_KEYS:
        value: Any = info.get(key)
        if value is None:
            continue
        answers = [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
        if answers:
            return answers
    raise RewardError(
        f"reward {reward!r} needs a ground truth in the last turn's info under "
        f"{' or '.join(map(repr, GROUND_TRUTH_KEYS))}; episode (env {episode.env!r}, task {episode.task_id}) "
        f"has info keys: {', '.join(map(repr, sorted(info))) or '(none)'}. Use an env that reports answers, "
        "or drop this reward from reward.weights"
    )


@episode_reward
def exact_match_reward(episode: Episode) -> float:
    """1.0 when the normalised final answer equals a normalised ground truth, else 0.0.

    >>> from omrl.data import Episode, Turn
    >>> turn = Turn("obs", "Act: answer[The Paris]", "answer[The Paris]", True, 0.0, True,
    ...             info={"ground_truth": "paris"})
    >>> exact_match_reward([Episode(env="qa", task_id=0, split="test", instruction="", turns=[turn])])
    [[1.0]]
    """
    if unanswered(episode):
        return 0.0
    predicted = normalize_answer(final_answer(episode))
    return float(any(predicted == normalize_answer(truth) for truth in ground_truths(episode, "exact_match")))


def _is_correct(predicted: str, truth: str) -> bool:
    """Numeric truth: the answer's last number equals it; text truth: its words appear as a phrase."""
    truth_number = truth.strip().replace(",", "")
    if _NUMBER.fullmatch(truth_number):
        numbers = _NUMBER.findall(predicted.replace(",", ""))
        target = float(truth_number)
        return bool(numbers) and abs(float(numbers[-1]) - target) <= 1e-6 * max(1.0, abs(target))
    truth_norm = normalize_answer(truth)
    if not truth_norm:
        return normalize_answer(predicted) == truth_norm
    return f" {truth_norm} " in f" {normalize_answer(predicted)} "


@episode_reward
def accuracy_reward(episode: Episode) -> float:
    """1.0 when the final answer contains a ground truth, else 0.0; more lenient than exact_match.

    A numeric ground truth matches the last number in the answer (to 1e-6,
    commas ignored); a text ground truth matches when its normalised words appear
    as a whole phrase in the normalised answer.

    >>> from omrl.data import Episode, Turn
    >>> turn = Turn("obs", "Act: answer[about 1,200 files]", "answer[about 1,200 files]", True, 0.0, True,
    ...             info={"answer": "1200"})
    >>> accuracy_reward([Episode(env="os", task_id=0, split="test", instruction="", turns=[turn])])
    [[1.0]]
    """
    if unanswered(episode):
        return 0.0
    predicted = final_answer(episode)
    return float(any(_is_correct(predicted, truth) for truth in ground_truths(episode, "accuracy")))


@episode_reward
def bleu_reward(episode: Episode) -> float:
    """Sentence BLEU (sacrebleu) of the final answer against the ground truths, scaled to [0, 1].

    Needs the optional extra: ``pip install 'omrl[bleu]'``.

    >>> from omrl.data import Episode, Turn
    >>> turn = Turn("obs", "Act: answer[the cat sat on the mat]", "answer[the cat sat on the mat]", True,
    ...             0.0, True, info={"ground_truth": "the cat sat on the mat"})
    >>> bleu_reward([Episode(env="qa", task_id=0, split="test", instruction="", turns=[turn])])
    [[1.0]]
    """
    try:
        import sacrebleu
    except ImportError as exc:
        raise RewardError("reward 'bleu' needs sacrebleu; install it with: pip install 'omrl[bleu]'") from exc
    if unanswered(episode):
        return 0.0
    truths = ground_truths(episode, "bleu")
    # sacrebleu reports 0..100 with float noise (100.00000000000004 on a perfect match)
    return min(1.0, sacrebleu.sentence_bleu(final_answer(episode), truths).score / 100.0)
