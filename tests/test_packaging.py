"""The distribution ships every package, preset and asset it needs."""

from __future__ import annotations

from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    listed = set(project["tool"]["setuptools"]["packages"])
    mapping = {"omrl": "omrl", "omrl_plugins": "plugins", "omrl_configs": "configs"}
    assert project["tool"]["setuptools"]["package-dir"] == mapping
    found = set()
    for import_name, folder in mapping.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder)
            found.add(".".join([import_name, *rel.parts]))
    assert found == listed, f"missing: {sorted(found - listed)}, stale: {sorted(listed - found)}"


def test_cpu_constraints_pin_torch():
    text = (REPO / "constraints-cpu.txt").read_text()
    assert "torch==2.13.0" in text


def test_readme_opens_with_the_two_commands_ci_runs():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    blocks = readme.split("```")
    commands = [b.strip().removeprefix("bash").strip() for b in blocks[1::2]]
    main_job, tests = commands[0], commands[1]
    assert "omrl train --algo grpo --env webshop" in main_job
    assert "pytest" in tests
    assert tests in ci, "CI must run the README's test command as written"


def test_every_asset_file_is_package_data():
    """omrl/assets (the tiny tokenizer, the smollm2-135m-webshop delta) reaches the wheel."""
    from fnmatch import fnmatch

    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["omrl"]
    assets = [p.relative_to(REPO / "omrl").as_posix() for p in (REPO / "omrl" / "assets").rglob("*") if p.is_file()]
    assert "assets/smollm2-135m-webshop.delta.safetensors" in assets
    assert [a for a in assets if not any(fnmatch(a, pattern) for pattern in patterns)] == []
