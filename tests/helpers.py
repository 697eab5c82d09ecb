"""Helpers the tests share that are not fakes (those are in tests/fakes.py)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, Sequence

import pytest

from omrl.rollout import PlaySpec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
FAST = ["generation.max_new_tokens=4", "env.max_turns=2"]
"""CLI overrides that keep an episode of the `tiny` model short: 4 new tokens a reply, 2 turns."""
REACT_GRIDWORLD = [
    *("env.name=gridworld", "env.template=react", "model.name=tiny"),
    *("generation.max_new_tokens=8", "generation.temperature=1.0"),
]
"""Rollout overrides: the `tiny` model on gridworld with the react template, sampling replies of up to 8 tokens."""


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py`` as a module (the examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def an_episode(**fields: Any) -> Any:
    """An :class:`~omrl.data.Episode` of task 0 of gridworld's train split with no instruction, but for ``fields``."""
    from omrl.data import Episode

    return Episode(**{"env": "gridworld", "task_id": 0, "split": "train", "instruction": "", **fields})


def play_expert(env: Any, task_id: int, admissible: bool = False) -> list[Any]:
    """Reset and follow the env's expert to the end; the results of every step. With ``admissible``,
    each expert action must also be one of the env's admissible actions."""
    env.reset(task_id)
    results = []
    while not results or not results[-1].done:
        action = env.expert_action()
        assert action is not None, f"the expert gave up after {len(results)} steps"
        if admissible:
            assert action in env.admissible_actions()
        results.append(env.step(action))
    return results


@contextmanager
def serving_in_a_thread(server: Any) -> Iterator[Any]:
    """``server`` (a ``socketserver`` server) serving on a daemon thread while the block runs, then shut down
    and closed. It looks for the shutdown every 10 ms: at the default 0.5 s, each test waited that long."""
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def tmpfs(folder: Path, options: str) -> Iterator[Path]:
    """``folder`` with a tmpfs mounted on it with ``options`` (``size=64k``, ``ro``) while the block runs; the
    test is skipped where root cannot mount one here."""
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"root here cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)  # lazy: a file a failed test left open


def fresh_python_json(code: str) -> Any:
    """Run ``code`` in a fresh Python (nothing imported yet; HF_HUB_OFFLINE=1): the JSON its last line printed."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def invoke(*args: str) -> Any:
    """The real CLI (``omrl *args``) in-process through typer's CliRunner: its result (exit code, output).
    An exception other than an exit is raised rather than kept in the result."""
    from typer.testing import CliRunner

    from omrl.cli import build_app

    result = CliRunner().invoke(build_app(), list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def cli_exit(capsys: Any, *args: str) -> tuple[Any, str, str]:
    """The real CLI's ``main(args)`` in-process, which must exit as the console script does: its exit status
    (``SystemExit.code``), what it printed to stdout and to stderr."""
    from omrl.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def eval_report(tmp_path: Path, *args: str) -> tuple[Any, dict[str, Any]]:
    """``omrl *args --report <tmp_path>/report.json``, with ``args`` "eval" and its words, which must exit 0:
    its result and the report it wrote."""
    report = tmp_path / "report.json"
    result = invoke(*args, "--report", str(report))
    assert result.exit_code == 0, result.output
    return result, json.loads(report.read_text())


def train_one_grpo_step(questions: Path, run: Path, *args: str) -> Any:
    """``omrl train`` of one grpo step of the `tiny` model on the ``dataset`` env of ``questions`` (2 tasks x 2
    samples, no eval), written to ``run``, then ``args``: its result, which must exit 0."""
    result = invoke(
        *("train", "--algo", "grpo", "--env", "dataset", "--model", "tiny", "--steps", "1", "--output-dir", str(run)),
        *(f"plugins.dataset.path={questions}", "tasks_per_step=2", "group_size=2", "eval_every=0"),
        *args,
    )
    assert result.exit_code == 0, result.output
    return result


def play_keys(tokenizer: Any, backend: Any, tasks: Sequence[int] = (0,), template: Any = None, **options: Any) -> list:
    """:func:`omrl.rollout.collect` on the fake `keys` env (tests/fakes.KeyEnv) with ``template`` (the fake
    ActionTemplate when None), ``tokenizer`` and ``backend``; ``options`` go to collect (limits, group_size...)."""
    from omrl.rollout import EnvPool, collect
    from tests.fakes import ActionTemplate, KeyEnv

    return collect(
        EnvPool(KeyEnv, name="keys"), template or ActionTemplate(), tokenizer, list(tasks), backend=backend, **options
    )


def keys_rollout(num_tasks: int, *args: str) -> list[str]:
    """The words of ``omrl rollout`` on the fake `keys` env (action template) with the `tiny` model for
    ``num_tasks`` tasks, then ``args``."""
    return ["rollout", "--env", "keys", "--template", "action", "--model", "tiny", "--num-tasks", str(num_tasks), *args]


def expert_rollout_of(
    capsys: Any, register_plugin: Any, env_class: type, out: Path, num_tasks: int = 2
) -> tuple[Any, str]:
    """``omrl rollout --expert -o out`` of ``env_class``, registered as ``keys_<class name>`` beside the fake
    plugins: its exit code and its whole output on one line."""
    from tests.fakes import Registers

    name = f"keys_{env_class.__name__}"
    register_plugin(Registers({name: env_class}), name=name)
    words = keys_rollout(num_tasks, "--expert", "-o", str(out))
    words[words.index("keys")] = name
    code, stdout, stderr = cli_exit(capsys, *words)
    return code, " ".join((stdout + stderr).split())


def keys_eval(num_tasks: int, *args: str, env: str = "keys") -> list[str]:
    """The words of ``omrl eval`` on the fake `keys` env (or another ``env`` that takes its action template)
    with the `tiny` model and short episodes (FAST) for ``num_tasks`` tasks, then ``args``."""
    return ["eval", *FAST, "--env", env, "env.template=action", "--model", "tiny", "--num-tasks", str(num_tasks), *args]


def eval_two_tasks(env_name: str, tmp_path: Path) -> dict[str, Any]:
    """``omrl eval`` of the `tiny` model on 2 tasks of ``env_name`` (2 turns, 4 new tokens a reply), which
    must play both episodes to an end; its report."""
    _, data = eval_report(tmp_path, "eval", "--env", env_name, "--model", "tiny", "--num-tasks", "2", *FAST)
    assert data["metrics"]["episodes"] == 2 and sum(data["metrics"]["end_reasons"].values()) == 2
    return data


def gridworld_grpo_config(model_dir: str, output_dir: Path, *overrides: str) -> Any:
    """The ``TrainRunConfig`` of a grpo run of ``model_dir`` on gridworld (2 turns, 512 tokens of context)
    that writes to ``output_dir`` without tensorboard, then ``overrides`` (steps, tasks, rewards, ...)."""
    from omrl.config import load_config
    from omrl.config.options import TrainRunConfig

    return load_config(
        TrainRunConfig,
        "grpo",
        [
            f"model.name={model_dir}",
            "env.name=gridworld",
            "env.max_turns=2",
            "generation.max_context=512",
            f"logging.output_dir={output_dir}",
            "logging.tensorboard=false",
            *overrides,
        ],
    )


def served_grpo_config(base_url: str, tmp_path: Path, sync: str, *overrides: str) -> Any:
    """The ``TrainRunConfig`` of a grpo run of the `tiny` model on gridworld whose episodes the server at
    ``base_url`` samples (8 new tokens a reply), its weights synced by ``sync`` (``files`` or ``lora``) through
    ``tmp_path / sync``; 2 tasks x 2 samples a step, rewarded by the ``sample_index`` reward (register it), no
    eval, written to ``tmp_path / "run"``; then ``overrides`` (steps, learning rate, ...)."""
    return gridworld_grpo_config(
        "tiny",
        tmp_path / "run",
        "generation.backend=openai",
        f"generation.base_url={base_url}",
        f"generation.weight_sync={sync}",
        f"generation.weight_dir={tmp_path / sync}",
        "generation.max_new_tokens=8",
        *("tasks_per_step=2", "group_size=2", "eval_tasks=0", "reward.weights={sample_index: 1.0}"),
        *overrides,
    )


def expert_and_model_episodes(num_tasks: int, group_size: int = 1) -> tuple[list[Any], list[Any]]:
    """Episodes with both outcomes for a reward model, on the tiny tokenizer: the expert's (it wins in the
    12 turns allowed) and ``group_size`` sampled ones of the random-init `tiny` model (seed 1, it loses),
    on the first ``num_tasks`` train tasks of gridworld (REACT_GRIDWORLD)."""
    from omrl.config import load_config
    from omrl.config.options import RolloutRunConfig
    from omrl.rollout import RolloutSession

    overrides = [*REACT_GRIDWORLD, "env.max_turns=12"]
    with RolloutSession.from_config(load_config(RolloutRunConfig, None, overrides)) as session:
        tasks = session.task_ids("train", num_tasks)
        won = session.play(tasks, PlaySpec(split="train", expert=True)).episodes
        lost = session.play(tasks, PlaySpec(split="train", group_size=group_size, seed=1)).episodes
    return won, lost


#: what a turn records of the engine, not of the episode: a warm cache prefills less of the same turn
MEASURED = ("prefill_tokens", "prefill_reused")


def _unmeasured(turn: Any) -> Any:
    rollout = {k: v for k, v in turn.info.get("rollout", {}).items() if k not in MEASURED}
    return dataclasses.replace(turn, info={**turn.info, "rollout": rollout})


def first_difference(played: Sequence[Any], expected: Sequence[Any], logprob_tolerance: float = 1e-4) -> str | None:
    """Where two lists of episodes first differ, for an assertion message: the episode, the field and, for
    token ids, the position with the ids and log-probs there; None when they are the same. Log-probs may differ
    by ``logprob_tolerance``: a GPU rounds a row differently in batches of other shapes (the ids stay the same)."""
    if len(played) != len(expected):
        return f"{len(played)} episodes, expected {len(expected)}"
    for i, (a, b) in enumerate(zip(played, expected)):
        if a.token_ids != b.token_ids:
            at = next((t for t, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), None)
            if at is None:
                return f"episode {i}: {len(a.token_ids)} tokens, expected {len(b.token_ids)}"
            return (
                f"episode {i}: token {at} is {a.token_ids[at]} (log-prob {a.logprobs[at]:.7f}), expected "
                f"{b.token_ids[at]} (log-prob {b.logprobs[at]:.7f})"
            )
        gap = max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs)), default=0.0)
        if len(a.logprobs) != len(b.logprobs) or gap > logprob_tolerance:
            return f"episode {i}: log-probs differ by up to {gap:.2e}"
        fields = [
            f.name
            for f in dataclasses.fields(a)
            if f.name not in ("logprobs", "turns") and getattr(a, f.name) != getattr(b, f.name)
        ]
        if [_unmeasured(t) for t in a.turns] != [_unmeasured(t) for t in b.turns]:
            fields.append("turns")
        if fields:
            return f"episode {i}: {', '.join(fields)} differ"
    return None


def mask_runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) of each run of equal mask values."""
    runs, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((mask[start], start, i))
            start = i
    return runs
