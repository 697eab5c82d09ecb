"""The conformance suite: every chat template trl ships, in both history modes, each case played the
rollout's way and every row checked against the template (:mod:`omrl.chat.conformance`). A template trl
adds is covered the day it appears. docs/templates.md's table is this suite's result, written by it
(``OMRL_WRITE_TEMPLATE_TABLE=1``) and checked against it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from omrl.chat.conformance import CASES, conformance
from omrl.chat.history import HISTORY_MODES

from .families import family_tokenizer, template_names

DOC = Path(__file__).resolve().parents[2] / "docs" / "templates.md"
BEGIN, END = "<!-- conformance table: written by tests/chat/test_conformance.py -->", "<!-- end of table -->"
_RESULTS: dict[str, list] = {}


def results(name: str):
    if name not in _RESULTS:
        _RESULTS[name] = conformance(family_tokenizer(name))
    return _RESULTS[name]


def test_the_suite_finds_every_template_trl_ships():
    names = template_names()
    assert len(names) >= 70 and "qwen3" in names and "gptoss_training" in names


#: one template of each family's layout stays in the fast tier; the rest, ~0.5 CPU-s each, run in the full one
FAST = {"cohere2", "deepseek_r1_distill", "gemma3", "glm4moe", "gptoss", "lfm2", "llama3_1", "nemotron_3_nano"}
FAST |= {"phi3", "qwen2_5", "qwen3", "qwen3_training", "smolvlm"}


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=() if name in FAST else pytest.mark.slow) for name in template_names()]
)
def test_no_case_is_laid_out_wrongly(name):
    broken = [f"{r.mode} {r.case}: {r.problem}" for r in results(name) if r.status == "broken"]
    assert not broken, broken
    assert {r.status for r in results(name) if r.case == "plain"} & {"ok"}, "no mode plays plain episodes"


def table() -> str:
    short = {"ok": "ok", "n/a": "–", "refused": "refused", "broken": "BROKEN"}
    head = ["template", *(f"{mode} {case}" for mode in HISTORY_MODES for case in CASES)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in template_names():
        status = {(r.mode, r.case): short[r.status] for r in results(name)}
        lines.append("| " + " | ".join([f"`{name}`", *(status[(m, c)] for m in HISTORY_MODES for c in CASES)]) + " |")
    return "\n".join(lines)


@pytest.mark.slow  # every template trl ships played: its table
def test_the_docs_table_is_the_suites_result():
    text = DOC.read_text()
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    if os.environ.get("OMRL_WRITE_TEMPLATE_TABLE"):
        DOC.write_text(text[:start] + "\n" + table() + "\n" + text[stop:])
        text = DOC.read_text()
        start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    assert text[start:stop].strip() == table(), "run with OMRL_WRITE_TEMPLATE_TABLE=1 to write docs/templates.md"


def test_a_run_refuses_a_template_its_mode_would_lay_out_wrongly_before_a_reply(tiny_tokenizer):
    import copy

    from omrl.chat.conformance import check_run_template
    from omrl.errors import OmrlError
    from omrl.rollout import RolloutLimits
    from tests.fakes import ScriptedBackend
    from tests.helpers import play_keys

    from .test_check_template import NUMBERED

    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = NUMBERED
    tokenizer.add_tokens(["<think>", "</think>"])  # as a thinking model's tokenizer has them
    check_run_template(tokenizer, "as_template")  # the template's own render every turn: right
    backend = ScriptedBackend(tokenizer, lambda call, index, prompt: "Action: open")
    with pytest.raises(OmrlError, match=r"wrongly under chat.history=keep \(reasoning episodes: after reply 2"):
        play_keys(
            tokenizer,
            backend,
            limits=RolloutLimits(history="keep"),
        )
    assert backend.calls == []  # refused before the first row was generated
