"""The README and the contributor's guides (CONTRIBUTING.md, AGENTS.md): short, linking only files that
exist, and every command in their ``bash`` blocks runs from the repository root and succeeds. A command
that runs a whole test tier is collected instead (a suite cannot run itself inside one of its tests)."""

from __future__ import annotations

import re

import pytest

from tests.docs.commands import FENCE, REPO, shell

LIMITS = {"README.md": 12_000, "CONTRIBUTING.md": 6_000, "AGENTS.md": 6_000}
GUIDES = ("CONTRIBUTING.md", "AGENTS.md")
LINK = re.compile(r"\]\(([^)\s]+)\)")
FAST, FULL = 'HF_HUB_OFFLINE=1 pytest -q -n 2 -m "not slow"', "HF_HUB_OFFLINE=1 pytest -q -n 2"


def commands(name: str) -> list[str]:
    """The command lines of a guide's ``bash`` blocks, in order."""
    text = (REPO / name).read_text(encoding="utf-8")
    return [
        line.strip()
        for lang, body in FENCE.findall(text)
        if lang == "bash"
        for line in body.splitlines()
        if line.strip()
    ]


def runs_a_tier(command: str) -> bool:
    """A pytest command that names no test file runs a whole tier."""
    return re.search(r"(^|\s)pytest(\s|$)", command) is not None and "tests/" not in command


def too_long(name: str, limit: int) -> str | None:
    size = len((REPO / name).read_text(encoding="utf-8"))
    return f"{name} has {size:,} characters, over its {limit:,}" if size > limit else None


def collected(command: str) -> tuple[int, int, int]:
    """(selected, collected, deselected) when ``command`` only collects its tests."""
    done = shell(f"{command} --collect-only")
    assert done.returncode == 0, f"{command} --collect-only\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    found = re.search(r"^(\d+)(?:/(\d+))? tests? collected(?: \((\d+) deselected\))?", done.stdout, re.M)
    assert found, done.stdout[-2000:]
    return int(found[1]), int(found[2] or found[1]), int(found[3] or 0)


@pytest.mark.parametrize("name,limit", LIMITS.items())
def test_the_readme_and_the_guides_stay_short(name, limit):
    assert too_long(name, limit) is None, too_long(name, limit) + ": move detail to the docs page it belongs to"


def test_the_limit_check_fails_past_the_limit():
    size = len((REPO / "AGENTS.md").read_text(encoding="utf-8"))
    assert too_long("AGENTS.md", size) is None
    assert too_long("AGENTS.md", size - 1) == f"AGENTS.md has {size:,} characters, over its {size - 1:,}"


@pytest.mark.parametrize("name", GUIDES)
def test_the_guides_link_only_files_that_exist(name):
    targets = [t.split("#")[0] for t in LINK.findall((REPO / name).read_text(encoding="utf-8"))]
    local = [t for t in targets if t and "://" not in t]
    assert len(local) >= 3
    assert [t for t in local if not (REPO / t).exists()] == []


def test_the_guides_give_both_tiers_and_the_full_one_is_the_readmes():
    for name in GUIDES:
        prose = FENCE.sub("", (REPO / name).read_text(encoding="utf-8"))
        assert {FAST, FULL} <= set(commands(name)) | set(re.findall(r"`([^`\n]+)`", prose)), name
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    test_command = readme.split("```")[3].strip().removeprefix("bash").strip()  # the README's second block
    assert test_command.endswith(" && " + FULL)


def test_a_whole_tier_is_told_from_a_file_of_tests():
    assert runs_a_tier(FAST) and runs_a_tier(FULL)
    assert not runs_a_tier("pytest -q tests/test_architecture.py")
    assert not runs_a_tier("ruff check . && ruff format --check .")


@pytest.mark.slow  # collects the whole suite
def test_the_fast_tier_collects_the_suite_and_leaves_tests_out():
    fast, total, left_out = collected(FAST)
    assert total > 2000 and fast + left_out == total
    assert left_out > 30  # the slow tests (and the gpu ones, where there is no CUDA)


RUN = sorted({command for name in GUIDES for command in commands(name) if not runs_a_tier(command)})


@pytest.mark.slow  # builds the docs site, runs a benchmark
@pytest.mark.parametrize("command", RUN, ids=[command.split(" --")[0] for command in RUN])
def test_a_command_of_the_guides_runs(command):
    done = shell(command)
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
