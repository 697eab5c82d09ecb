"""The commands omrl prints for the user to run next do run: a run's "evaluate it:" line plays the
env with the options it trained with, eval says how many of the split's tasks it played, and each
"look at it/them" line of train, eval and rollout shows what it names."""

from __future__ import annotations

import json
import re
import shlex

from tests.helpers import invoke, train_one_grpo_step


def test_the_evaluate_it_line_of_a_run_with_env_options_runs(tmp_path):
    questions = tmp_path / "qa.jsonl"
    questions.write_text(
        "".join(json.dumps({"question": f"{n} + {n} =", "answer": str(2 * n)}) + "\n" for n in range(12))
    )
    trained = train_one_grpo_step(questions, tmp_path / "run", "plugins.dataset.test_fraction=0.5")
    (line,) = re.findall(r"evaluate it: (.+)", trained.output)
    words = shlex.split(line)
    assert words[:2] == ["omrl", "eval"] and not any("plugins.dataset" in word for word in words)
    report = tmp_path / "report.json"
    evaluated = invoke(*words[1:], "--report", str(report), "--output-dir", str(tmp_path / "eval"))
    assert evaluated.exit_code == 0, evaluated.output
    assert f"plugins.dataset={{path: {questions}" in evaluated.output  # taken from the run, and said so
    metrics = json.loads(report.read_text())["metrics"]
    # a small test split is evaluated whole (6 of the 12 rows), and the report says of how many
    assert metrics["episodes"] == 6 and metrics["split_tasks"] == 6
    assert "eval: 6 of 6 tasks of the test split" in evaluated.output
    # the "look at it" / "look at them" lines of the run and of the eval show what they name
    for shown, printed in ((trained, "look at it"), (evaluated, "look at them")):
        (view,) = re.findall(rf"{printed}: (.+)", shown.output)
        run_view(shlex.split(view), tmp_path / f"{printed.replace(' ', '-')}.html")


def run_view(words: list[str], page) -> None:
    """A printed ``omrl view`` line, run with ``--out`` (a page, not a server): it must write the page."""
    assert words[:2] == ["omrl", "view"], words
    viewed = invoke(*words[1:], "--out", str(page))
    assert viewed.exit_code == 0, viewed.output
    assert page.stat().st_size > 1000


def test_the_look_at_them_line_of_a_rollout_runs(tmp_path):
    rolled = invoke("rollout", "--env", "gridworld", "--expert", "--num-tasks", "2", "-o", str(tmp_path / "x.parquet"))
    assert rolled.exit_code == 0, rolled.output
    (view,) = re.findall(r"look at them: (.+)", rolled.output)
    run_view(shlex.split(view), tmp_path / "page.html")


def test_eval_says_how_many_of_the_splits_tasks_it_played(tmp_path):
    questions = tmp_path / "qa.jsonl"
    questions.write_text(
        "".join(json.dumps({"question": f"{n} + 1 =", "answer": str(n + 1)}) + "\n" for n in range(20))
    )
    args = [
        "eval",
        "--env",
        "dataset",
        "--model",
        "tiny",
        f"plugins.dataset.path={questions}",
        "plugins.dataset.test_fraction=0.6",
    ]
    asked = invoke(*args, "--num-tasks", "3", "--output-dir", str(tmp_path / "a"))
    assert asked.exit_code == 0, asked.output
    assert "eval: 3 of 12 tasks of the test split" in asked.output
