"""How much one answer of ``omrl view`` carries: long texts and token lists are cut, visibly.

An episode's texts come from envs and models and can be any size (a web page as an
observation, a reply that never stopped, a traceback as the error): served whole, 200 such
episodes made a 493 MB saved page that no browser opens. So every answer (one episode, one
group, and the saved page, made of those) carries of each text field at most :data:`MAX_TEXT`
characters, of all its texts together at most :data:`MAX_ANSWER_TEXT`, and of each token list
(ids, loss mask, log-probs, token text, advantages, returns, values) at most :data:`MAX_TOKENS`
entries. A cut text ends with a note saying how much was left out; a cut token list comes with one
(``tokens.cut``). The files keep everything: ``omrl rollout``'s JSONL or the parquet itself
hold the whole text. The saved page also stops embedding episodes past
:data:`omrl.view.page.DEFAULT_MAX_BYTES` (see there).
"""

from __future__ import annotations

from typing import Any

MAX_TEXT = 20_000  # characters of one text field (an observation, a reply, the task, an error)
MAX_GROUP_TEXT = 2_000  # of one turn's text in a group's side-by-side columns (up to 64 of them)
MAX_ANSWER_TEXT = 1_000_000  # of all the texts of one answer together
MAX_TOKENS = 32_768  # entries of each token list of one episode


class TextBudget:
    """Cuts the texts of one answer: each past ``limit`` characters, all of them together past ``total``."""

    def __init__(self, limit: int = MAX_TEXT, total: int = MAX_ANSWER_TEXT):
        self.limit, self.left = limit, total

    def __call__(self, text: Any) -> Any:
        """``text`` as the answer carries it; None and other non-strings pass unchanged."""
        if not isinstance(text, str):
            return text
        room = max(0, min(self.limit, self.left))
        if len(text) <= room:
            self.left -= len(text)
            return text
        self.left -= room
        return text[:room] + cut_note(len(text) - room)


def cut_note(left_out: int) -> str:
    """The line that ends a cut text, so no one takes it for the whole."""
    return (
        f"\n[omrl view cut {left_out:,} more characters here: it shows at most {MAX_TEXT:,} characters of one "
        f"text and {MAX_ANSWER_TEXT:,} of one episode; the run's files hold them all]"
    )


def cut_tokens(tokens: dict[str, Any]) -> dict[str, Any]:
    """The token view's lists cut to :data:`MAX_TOKENS` entries each, ``cut`` saying so ("" when whole)."""
    total = len(tokens["ids"])
    tokens["cut"] = ""
    if total <= MAX_TOKENS:
        return tokens
    for name in ("ids", "mask", "logprob", "text", "advantage", "return", "value"):
        if isinstance(tokens.get(name), list):
            tokens[name] = tokens[name][:MAX_TOKENS]
    tokens["cut"] = (
        f"the first {MAX_TOKENS:,} of this episode's {total:,} tokens are shown (omrl view shows at most "
        f"{MAX_TOKENS:,}); the trajectory file holds them all"
    )
    return tokens
