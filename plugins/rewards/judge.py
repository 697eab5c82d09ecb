"""The ``judge`` reward: an LLM grades each episode against a rubric (LLM-as-judge).

The judge is any OpenAI-compatible endpoint (``base_url``, ``model``, the key from the environment
variable ``api_key_env``) or a model omrl loads itself (``backend=hf``). Each episode's rubric prompt
is filled in from the episode (:data:`PLACEHOLDERS`), the judge's verdict read on the ``scale`` and
normalised to [0, 1], and put on the episode's last turn with the judge's reasoning in that turn's
``info["judge"]``. With ``group=true`` the judge sees a whole GRPO group (the episodes of one task,
``Episode.group``) in one prompt and scores each, as ART's RULER does.

A judge that fails on an episode (an error, no answer in time, a verdict it cannot read) ends that
episode as ``env_error`` (its ``error`` names the judge and why): it is no loss scored 0, it is left
out of training and counted in the step's ``env_errors``.
"""

from __future__ import annotations

import inspect
import json
import math
import re
from pathlib import Path
from typing import Any, Sequence

from omrl.data.trajectory import Episode
from omrl.errors import ConfigError, short_repr
from omrl_plugins.rewards.judge_calls import ask_cached, check_judge, forget, make_judge, reach
from omrl_plugins.rewards.judge_verdicts import Scale, Unreadable, make_scale, read_group, read_one
from omrl_plugins.rewards.outcome import GROUND_TRUTH_KEYS, final_answer

#: what a rubric may use, and what each becomes
PLACEHOLDERS = {
    "task": "the task: the episode's instruction",
    "expected": "the expected answers from the last turn's info (ground_truth or answer), or '(none given)'",
    "answer": "the final answer: the last action, unwrapped from answer[...] and the like (the raw reply if it did not parse)",
    "transcript": "the conversation after the system prompt and the env's worked example, cut to max_chars",
    "last_turn": "the last observation and the reply to it",
    "scale": "how to give the score, e.g. 'a number from 0 to 10 (10 is best)'",
}
#: what a group rubric may use instead of answer, transcript and last_turn
GROUP_PLACEHOLDERS = {
    "task": PLACEHOLDERS["task"],
    "expected": PLACEHOLDERS["expected"],
    "trajectories": "every episode of the group, numbered from 1, each shown as the trajectory option says",
    "count": "how many episodes the group has",
    "scale": PLACEHOLDERS["scale"],
}
TRAJECTORY_VIEWS = ("transcript", "last_turn", "answer")
NONE_GIVEN = "(none given)"

RUBRIC = """You are a strict grader of an AI agent's work.

# Task
{task}

# Expected answer
{expected}

# The agent's conversation
{transcript}

# The agent's final answer
{answer}

Judge how well the final answer accomplishes the task (and whether it matches the expected answer, \
if one is given). Reason briefly, then end your reply with one line:
SCORE: <{scale}>"""

GROUP_RUBRIC = """You are a strict grader comparing {count} attempts by an AI agent at the same task.

# Task
{task}

# Expected answer
{expected}

# The attempts
{trajectories}

Score each attempt by how well it accomplishes the task (and whether it matches the expected answer, \
if one is given): a better attempt gets a higher score. Reason briefly, then end your reply with JSON, \
one entry per attempt:
{"scores": [{"id": 1, "explanation": "...", "score": <{scale}>}, ...]}"""

_PLACEHOLDER = re.compile(r"\{([A-Za-z_]+)\}")


def judge_reward(
    episodes: list[Episode],
    rubric: str = "",
    rubric_file: str = "",
    scale: str = "number",
    low: float = 0.0,
    high: float = 10.0,
    points: int = 5,
    group: bool = False,
    trajectory: str = "transcript",
    max_chars: int = 20_000,
    backend: str = "openai",
    base_url: str = "",
    model: str = "",
    api_key_env: str = "OPENAI_API_KEY",
    dtype: str = "float32",
    temperature: float = 0.0,
    max_tokens: int = 1024,
    timeout_s: float = 60.0,
    retries: int = 2,
    concurrency: int = 8,
    cache: bool = True,
) -> list[list[float]]:
    """An LLM judge's score of each episode in [0, 1], on its last turn (see docs/rewards.md#llm-as-judge).

    Each episode's judgement (or why there is none) goes to its last turn's ``info["judge"]``; an
    episode the judge could not score ends as ``env_error``.
    """
    the_scale = make_scale(scale, low, high, points)
    text = _rubric(rubric, rubric_file, group)
    _check(trajectory, max_chars, temperature, max_tokens, timeout_s, retries, concurrency)
    judge = make_judge(
        backend, base_url, model, api_key_env, dtype, temperature, max_tokens, timeout_s, retries, concurrency
    )
    try:
        scored = [ep for ep in episodes if ep.turns]
        units = _groups(scored) if group else [[ep] for ep in scored]
        prompts = [_prompt(text, unit, the_scale, group, trajectory, max_chars) for unit in units]
        replies = ask_cached(judge, prompts, cache)
    finally:
        judge.close()
    scores: dict[int, float] = {}
    for unit, prompt, reply in zip(units, prompts, replies):
        if reply.error:
            _fail(unit, judge.label, reply.error, reply.text)
            continue
        try:
            if group:
                verdicts = read_group(reply.text, len(unit), the_scale, reply.cut)
            else:
                verdicts = [read_one(reply.text, the_scale, reply.cut)]
        except Unreadable as exc:
            forget(judge, prompt)
            cut = f" (the reply was cut at max_tokens={max_tokens})" if reply.cut else ""
            _fail(unit, judge.label, f"answered unparseably: {exc}{cut}", reply.text)
            continue
        ranks = [1 + sum(other[0] > mine[0] for other in verdicts) for mine in verdicts]
        for i, (ep, (score, verdict, reasoning)) in enumerate(zip(unit, verdicts)):
            reasoning = "\n\n".join(part for part in (reply.reasoning, reasoning) if part)
            record = {"judge": judge.label, "score": score, "verdict": verdict, "reasoning": reasoning}
            if group:
                record.update({"group": ep.group, "attempt": i + 1, "rank": ranks[i], "of": len(unit)})
            ep.turns[-1].info["judge"] = {**record, "cached": reply.cached}
            scores[id(ep)] = score
    return [[0.0] * (len(ep.turns) - 1) + [scores.get(id(ep), 0.0)] if ep.turns else [] for ep in episodes]


def check_judge_options(**options: Any) -> None:
    """The ``judge`` reward's options checked without asking the judge (its ``check_options`` trait):
    a bad scale, rubric or endpoint is refused before a run plays its first rollout."""
    bound = inspect.signature(judge_reward).bind([], **options)  # names and types: omrl.rewards checked them
    bound.apply_defaults()
    given = bound.arguments
    make_scale(given["scale"], given["low"], given["high"], given["points"])
    _rubric(given["rubric"], given["rubric_file"], given["group"])
    limits = ("trajectory", "max_chars", "temperature", "max_tokens", "timeout_s", "retries", "concurrency")
    _check(*(given[name] for name in limits))
    check_judge(given["backend"], given["base_url"], given["model"])


def check_judge_reachable(**options: Any) -> None:
    """An endpoint judge whose host takes no connection stops the run before its first rollout (its
    ``check_reachable`` trait): else every episode of that rollout, and of two replays, ends as env_error."""
    bound = inspect.signature(judge_reward).bind([], **options)
    bound.apply_defaults()
    if bound.arguments["backend"] == "openai":
        reach(bound.arguments["base_url"], min(bound.arguments["timeout_s"], 10.0))


def _fail(unit: Sequence[Episode], label: str, why: str, reply: str) -> None:
    """End each episode as env_error: the judge could not score it."""
    for ep in unit:
        ep.end_reason, ep.error = "env_error", f"judge {label}: {why}"
        ep.turns[-1].info["judge"] = {"judge": label, "error": why, "reply": reply}


# -- options ---------------------------------------------------------------------------------------------
def _rubric(rubric: str, rubric_file: str, group: bool) -> str:
    """The rubric to fill in, after checking that it uses only the placeholders of its mode."""
    for name, value in {"rubric": rubric, "rubric_file": rubric_file}.items():
        if not isinstance(value, str):  # `plugins.judge.rubric={task}` on a command line is a YAML mapping
            raise ConfigError(f"reward 'judge' option {name} must be text, got {short_repr(value)}; quote it")
    if rubric and rubric_file:
        raise ConfigError("reward 'judge' takes rubric (the text) or rubric_file (a path to it), not both")
    if rubric_file:
        try:
            rubric = Path(rubric_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"reward 'judge' cannot read rubric_file={rubric_file!r}: {exc}") from exc
    text = rubric or (GROUP_RUBRIC if group else RUBRIC)
    valid = GROUP_PLACEHOLDERS if group else PLACEHOLDERS
    unknown = sorted({name for name in _PLACEHOLDER.findall(text) if name not in valid})
    if unknown:
        mode = "a group rubric (group=true)" if group else "a rubric"
        raise ConfigError(
            f"reward 'judge': {mode} has unknown placeholders {', '.join('{' + n + '}' for n in unknown)}; "
            f"valid: {', '.join('{' + n + '}' for n in valid)}"
        )
    return text


def _check(
    trajectory: str,
    max_chars: int,
    temperature: float,
    max_tokens: int,
    timeout_s: float,
    retries: int,
    concurrency: int,
) -> None:
    if trajectory not in TRAJECTORY_VIEWS:
        raise ConfigError(
            f"reward 'judge' option trajectory={trajectory!r} is invalid; valid: {', '.join(TRAJECTORY_VIEWS)}"
        )
    checks = {
        "max_chars": (max_chars, 0, "an integer >= 0 (0: no cut)"),
        "max_tokens": (max_tokens, 1, "an integer >= 1"),
        "retries": (retries, 0, "an integer >= 0"),
        "concurrency": (concurrency, 1, "an integer >= 1"),
    }
    for name, (value, least, valid) in checks.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"reward 'judge' option {name}={value!r} is invalid; valid: {valid}")
    numbers = {"temperature": (temperature, "a number >= 0"), "timeout_s": (timeout_s, "seconds > 0")}
    for name, (value, valid) in numbers.items():
        number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
        if not number or value < 0 or (name == "timeout_s" and value == 0):
            raise ConfigError(f"reward 'judge' option {name}={value!r} is invalid; valid: {valid}")


# -- prompts ---------------------------------------------------------------------------------------------
def _groups(episodes: Sequence[Episode]) -> list[list[Episode]]:
    """The episodes by group (env and ``Episode.group``), in the order they first appear."""
    out: dict[tuple[str, int], list[Episode]] = {}
    for ep in episodes:
        out.setdefault((ep.env, ep.group), []).append(ep)
    return list(out.values())


def _prompt(rubric: str, unit: Sequence[Episode], scale: Scale, group: bool, view: str, max_chars: int) -> str:
    first = unit[0]
    values = {"task": first.instruction, "expected": expected(first), "scale": scale.describe()}
    if group:
        shown = [f"## Attempt {i}\n{_view(ep, view, max_chars)}" for i, ep in enumerate(unit, 1)]
        values.update({"trajectories": "\n\n".join(shown), "count": str(len(unit))})
    else:
        values.update(
            {
                "answer": answer(first),
                "transcript": transcript(first, max_chars),
                "last_turn": last_turn(first, max_chars),
            }
        )
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], rubric)


def _view(ep: Episode, view: str, max_chars: int) -> str:
    if view == "answer":
        return f"Final answer: {answer(ep)}"
    shown = transcript(ep, max_chars) if view == "transcript" else last_turn(ep, max_chars)
    return f"{shown}\n\nFinal answer: {answer(ep)}"


def expected(ep: Episode) -> str:
    """The expected answers the env reported on the latest turn that reported them, else at its reset (a
    one-turn episode whose reply did not parse never reached the env's step), or ``(none given)``."""
    for info in [*(turn.info for turn in reversed(ep.turns)), ep.info.get("reset") or {}]:
        for key in GROUND_TRUTH_KEYS:
            value = info.get(key)
            if value is not None and value != []:
                return " or ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return NONE_GIVEN


def answer(ep: Episode) -> str:
    """The final answer: the last action unwrapped, or the last reply itself when it did not parse."""
    return final_answer(ep) if ep.turns[-1].action is not None else ep.turns[-1].answer.strip()


def transcript(ep: Episode, max_chars: int) -> str:
    """The conversation as ``ROLE: text`` blocks, without the system prompt and the env's worked example,
    its start cut when it is longer than ``max_chars`` (0: never)."""
    messages = ep.messages
    if messages:
        start = 1 if messages[0].get("role") == "system" else 0
        shown = messages[start + ep.demo_messages :]
    else:  # hand-made episodes: the turns
        shown = [{"role": "user", "content": ep.instruction}, *_turn_messages(ep.turns)]
    return _cut(_lines(shown), max_chars)


def last_turn(ep: Episode, max_chars: int) -> str:
    """The last observation and the reply to it, as :func:`transcript` shows them."""
    return _cut(_lines(_turn_messages(ep.turns[-1:])), max_chars)


def _turn_messages(turns: Sequence[Any]) -> list[dict[str, Any]]:
    out = []
    for turn in turns:
        out += [{"role": "user", "content": turn.observation}, {"role": "assistant", "content": turn.response}]
    return out


def _lines(messages: Sequence[dict[str, Any]]) -> str:
    blocks = []
    for m in messages:
        role = str(m.get("role") or "?").upper() + (f" ({m['name']})" if m.get("name") else "")
        calls = m.get("tool_calls")
        called = f"\n[tool calls: {calls if isinstance(calls, str) else json.dumps(calls)}]" if calls else ""
        blocks.append(f"{role}: {m.get('content') or ''}{called}")
    return "\n\n".join(blocks)


def _cut(text: str, max_chars: int) -> str:
    if not max_chars or len(text) <= max_chars:
        return text
    return f"[... the first {len(text) - max_chars} characters left out ...]\n{text[-max_chars:]}"
