"""Every `omrl ...` command line in README.md and docs/ parses against the real CLI and config schema."""

from __future__ import annotations

import pytest

from tests.docs.commands import check_command, command_lines, examples, omrl_args

EXAMPLES = examples()


def test_the_docs_hold_command_lines():
    assert len(EXAMPLES) > 40
    assert any(where == "README.md" for where, _, _ in EXAMPLES)


@pytest.mark.parametrize("where,line,inline", EXAMPLES, ids=[f"{w}:{line[:60]}" for w, line, _ in EXAMPLES])
def test_command_line_parses(where, line, inline):
    check_command(omrl_args(line), mention=inline)


def test_command_lines_are_found_in_every_form():
    text = (
        "```bash\nomrl train --algo grpo \\\n  --env webshop\nomrl eval --env gridworld && omrl view runs/x\n"
        "MALLOC_ARENA_MAX=2 omrl sft --dataset a.parquet\n"
        "accelerate launch --config_file configs/accelerate/ddp.yaml -m omrl train --algo grpo\n```\n"
        "```python\nomrl = 1\n```\nInline: `omrl plugins --json`."
    )
    lines = command_lines(text)
    assert [inline for _, inline in lines] == [False] * 5 + [True]
    assert [omrl_args(line) for line, _ in lines] == [
        ["train", "--algo", "grpo", "--env", "webshop"],
        ["eval", "--env", "gridworld"],
        ["view", "runs/x"],
        ["sft", "--dataset", "a.parquet"],
        ["train", "--algo", "grpo"],
        ["plugins", "--json"],
    ]


@pytest.mark.parametrize(
    "args,why",
    [
        (["trian", "--algo", "grpo"], "No such command"),
        (["train", "--algorithm", "grpo"], "No such option"),
        (["env", "lst"], "No such command"),
        (["rollout", "--num-tasks", "many"], "num-tasks"),
        (["train", "--algo", "grpo", "group_sise=8"], "group_sise"),
        (["eval", "generation.temprature=1.0"], "temprature"),
        (["rm", "train", "kind=orm", "optim.learning_rate=fast"], "learning_rate"),
        (["config", "show", "grpo", "stepz=3"], "stepz"),
        (["train", "sft"], "sft"),  # a preset for another command
    ],
)
def test_a_broken_command_line_fails(args, why):
    with pytest.raises(AssertionError, match=why):
        check_command(args)


def test_a_mention_in_prose_needs_only_the_command():
    check_command(["view"], mention=True)
    with pytest.raises(AssertionError, match="Missing argument"):
        check_command(["view"])
    with pytest.raises(AssertionError, match="No such command"):
        check_command(["veiw"], mention=True)


def test_help_and_yaml_presets_of_ones_own_pass():
    check_command(["train", "--help"])
    check_command(["train", "my-run.yaml", "steps=3"])
