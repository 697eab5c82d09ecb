"""omrl vs TRL on a multi-turn tool task, the same job in one run, rounds alternating.

``omrl train --algo grpo`` against TRL's ``GRPOTrainer`` with an ``environment_factory``.

    python3 -m venv /tmp/trl-venv
    /tmp/trl-venv/bin/pip install -c constraints-cpu.txt -r benchmarks/requirements-trl.txt
    python benchmarks/trl_multiturn.py [--trl-python /tmp/trl-venv/bin/python] [--steps 3] [--rounds 2]
    python benchmarks/trl_multiturn.py --quick    # a smoke run: the tiny model, 2 short steps, 1 round

Peer: TRL (pinned in ``benchmarks/requirements-trl.txt``), run by ``--trl-python`` as a subprocess, so
TRL never becomes a dependency of omrl's. ``--trl-python`` defaults to this python when it imports
trl at the pinned version, else to ``/tmp/trl-venv/bin/python``. omrl runs as the real CLI (``omrl
train``) in a subprocess of its own. As in ``trl_grpo.py``, a TRL python whose torch or transformers
differs from omrl's is refused before anything is measured.

The task, expressed natively on both sides: "What is 517 times 839?" (two factors of 2-3 digits,
:func:`make_tasks`) with one tool, ``multiply(a, b)``, a method of :class:`Calculator`. TRL gets the
class as its ``environment_factory`` (its public methods become the tools); omrl gets an env plugin
whose ``tools`` are the JSON schemas transformers derives from those very methods, and a template
plugin (omrl's ``tool_call``, hermes calls) whose system prompt is :data:`SYSTEM`. On both sides a
reply with a tool call gets the tool's result as a ``tool`` message and another turn; a reply
without one ends the episode and is the answer. The reward, on both sides the same function of the
final reply (:func:`answer_reward`): 1 when its last number is the product, plus 0.001 per
character (so replies of different lengths score differently; where all of a step's samples score
alike per task, omrl skips the update and TRL does not: see the steady state below). A
turn cap of ``--turns`` replies (TRL: ``max_tool_calling_iterations = turns - 1``) and
``--max-new-tokens`` per reply (TRL: ``generation_kwargs={"max_new_tokens": ...}``, with
``max_completion_length`` large enough never to cut an episode short: ``turns x (tokens + 64)``).

The model: the same weights (``--model``, default the built-in SmolLM2-135M-Instruct from omrl's
local file) in a directory of symlinks whose chat template is TRL's packaged Qwen2.5 template
(``trl/chat_templates/qwen2_5.jinja``): SmolLM2's own template renders neither tools nor tool
calls, and TRL refuses a template that cannot (``supports_tool_calling``); Qwen2.5's is ChatML,
SmolLM2's own turn format, plus hermes tool calls, and TRL knows how to parse its replies
(``add_response_schema``). SmolLM2-135M-Instruct as shipped never calls the tool, so the benchmark
first fine-tunes that model for ``--warmup-steps`` steps on expert episodes (:func:`warm_up`; cached
under ``$OMRL_HOME/benchmarks/``). Both sides load the result, and the TRL worker checks that its first
prompts are the very ids omrl played.

The same on both sides besides: the tasks in the order omrl plays them, ``--tasks`` prompts a step x
``--group-size`` samples, temperature 1, top-p 1, lr 1e-5 constant, AdamW with no weight decay,
grad-norm clip 1, no KL (TRL's default ``beta=0``), one optimizer step per generation (on-policy),
every episode of a step in one micro-batch (TRL's ``per_device_train_batch_size`` = tasks x group size
with no gradient accumulation; omrl's ``optim.micro_batch_size`` the same: run4 and earlier used omrl's
default of 1 there, one episode at a time), float32 weights (``--bf16``: both sides under bfloat16 autocast, TRL's ``bf16=True`` and omrl's
``bf16=true``), gradient checkpointing off, ``--steps`` steps, ``--threads`` threads.

Reported per run: each step's wall time (TRL: a callback's step begin to end; omrl: its logged
``step_time``), the rollout's share (TRL: ``_generate_and_score_completions``, its tool loop
included; omrl: ``rollout_time``), the tokens sampled (TRL: counted at every ``model.generate``
call, up to each row's end of turn; omrl: its logged ``generated_tokens``), turns and tool calls per
episode, peak RSS (TRL: the worker's VmHWM; omrl: its ``peak_rss_gb``), and for omrl the share of
prompt tokens its KV store reused instead of computing (``prefill_reused / (prefill_reused +
prefill_tokens)``). Steady state: the median over the steps after the first, less omrl's steps that skipped
their update (every advantage of the step 0: TRL updates anyway, so those did less work). The ratios, per round
(min and median over rounds): omrl's steady s/step over TRL's, and the same per sampled token
(``s/step / tokens/step``: the two sides sample different numbers of turns, so this is the
comparison "at equal tokens"). Target: omrl <= 0.5x TRL's time per step at equal tokens, and no more
memory. Then one more run of each side goes under cProfile (``--no-profile``: none) and the time of
their main parts, per step, is printed and recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trl_grpo  # this folder's: the single-turn comparison's helpers (no omrl imports)
from trl_grpo import callees, vm_hwm

TARGET = 0.5
SYSTEM = "Answer with the number. Use multiply for products."
QUESTION = "What is {a} times {b}?"
TEST_START = 100_000
ENV_NAME = "bench_calculator"
TEMPLATE_NAME = "bench_tool_call"
REWARD_NAME = "bench_answer"
TRL_PIN = "1.16.0"
TOOL_SUFFIX_ROOM = 64  # tokens a tool message may add to TRL's completion per turn (the cap never binds)


# -- shared by both sides (no omrl and no trl imports) ----------------------------------------------
def make_tasks(count: int, seed: int) -> list[tuple[int, int]]:
    """``count`` pairs of factors of 2-3 digits, the same on both sides.

    >>> make_tasks(2, 0)
    [(874, 404), (786, 921)]
    """
    rng = random.Random(seed)
    return [(rng.randint(10, 999), rng.randint(10, 999)) for _ in range(count)]


def answer_reward(text: str, product: int) -> float:
    """The reward of a final reply: 1 when its last number is ``product``, plus 0.001 per character.

    >>> answer_reward("It is 2,491.", 2491)
    1.012
    >>> answer_reward("", 6)
    0.0
    """
    numbers = re.findall(r"-?\d+", text.replace(",", ""))
    correct = bool(numbers) and int(numbers[-1]) == product
    return round(float(correct) + 0.001 * len(text), 10)


class Calculator:
    """The tool task's environment, as TRL's ``environment_factory`` builds it; omrl's env takes its
    tool schemas from these methods too."""

    def __init__(self):
        self.calls = 0

    def reset(self, **row) -> None:
        """A new episode (TRL passes the dataset row); the question is already in the prompt."""
        self.calls = 0

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self.calls += 1
        return a * b


# -- the TRL side (may run in TRL's venv: no omrl imports here) -------------------------------------
def trl_reward(completions, product, **kwargs) -> list[float]:
    """TRL's calling convention for :func:`answer_reward`: the episode's last assistant message is the
    answer; an episode that ended on a tool call (the turn cap) answered nothing."""
    out = []
    for messages, answer in zip(completions, product):
        last = next((m for m in reversed(messages) if m["role"] == "assistant"), {})
        out.append(0.0 if last.get("tool_calls") else answer_reward(last.get("content") or "", answer))
    return out


def trl_worker(spec_path: str) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import add_response_schema

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    add_response_schema(tokenizer)  # TRL's parser of Qwen2.5-style replies (hermes tool calls)
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    eos = tokenizer.eos_token_id

    steps: list[dict] = []
    first_prompts: list[list[int]] = []  # the rows of the first generate call: the first step's prompts

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            steps.append({"start": time.perf_counter(), "generate_s": 0.0, "rollout_s": 0.0, "sampled_tokens": 0})
            steps[-1]["replies"] = 0

        def on_step_end(self, args, state, control, **kwargs):
            steps[-1]["step_time"] = time.perf_counter() - steps[-1].pop("start")

    generate = model.generate

    calls = 0

    def timed_generate(*args, **kwargs):
        nonlocal calls
        start = time.perf_counter()
        out = generate(*args, **kwargs)
        if steps:
            steps[-1]["generate_s"] += time.perf_counter() - start
            steps[-1]["replies"] += out.shape[0]
            ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
            for row, new in enumerate(out[:, ids.shape[1] :].tolist()):
                steps[-1]["sampled_tokens"] += new.index(eos) + 1 if eos in new else len(new)
                if len(steps) == 1 and calls == 0:
                    kept = ids[row] if mask is None else ids[row][mask[row].bool()]
                    first_prompts.append(kept.tolist())
        calls += 1
        return out

    model.generate = timed_generate
    turns = spec["turns"]
    config = GRPOConfig(
        **trl_grpo.trl_settings(spec),
        max_completion_length=turns * (spec["max_new_tokens"] + TOOL_SUFFIX_ROOM),
        generation_kwargs={"max_new_tokens": spec["max_new_tokens"]},
        max_tool_calling_iterations=turns - 1,
        gradient_checkpointing=False,
    )
    rows = [{"prompt": messages, "product": product} for messages, product in zip(spec["messages"], spec["products"])]
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=trl_reward,
        args=config,
        processing_class=tokenizer,
        train_dataset=Dataset.from_list(rows),
        callbacks=[StepTimer()],
        environment_factory=Calculator,
    )
    rollout = trainer._generate_and_score_completions  # the rollout: generation, tool loop, rewards

    def timed_rollout(*args, **kwargs):
        start = time.perf_counter()
        try:
            return rollout(*args, **kwargs)
        finally:
            steps[-1]["rollout_s"] += time.perf_counter() - start

    trainer._generate_and_score_completions = timed_rollout
    start = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - start
    keys = ("reward", "loss", "grad_norm", "completions/mean_length", "num_tokens")
    logged = [
        {k: v for k, v in row.items() if k in keys or k.startswith("tools/")}
        for row in trainer.state.log_history
        if "reward" in row
    ]
    for step, row in zip(steps, logged):
        step["tool_calls"] = row.get("tools/call_frequency")  # per episode
        step["turns"] = step["replies"] / (spec["tasks"] * spec["group_size"])
    first = spec["first_prompt_ids"]
    print(
        json.dumps(
            {
                "steps": steps,
                "train_s": train_s,
                "same_prompt_ids": set(map(tuple, first_prompts)) == set(map(tuple, first)),
                "logged": logged,
                "peak_rss": vm_hwm(),
                "versions": trl_grpo.trl_versions(),
                "config": {
                    "loss_type": config.loss_type,
                    "optim": str(config.optim),
                    "max_completion_length": config.max_completion_length,
                    "max_tool_calling_iterations": config.max_tool_calling_iterations,
                },
            }
        )
    )


# -- the omrl side ---------------------------------------------------------------------------------
def omrl_plugin(tasks: int):
    """The task as omrl plugins: the env ``bench_calculator``, the template ``bench_tool_call`` and the
    reward ``bench_answer`` (the env's reward of each turn: :func:`answer_reward` on the final one)."""
    from transformers.utils import get_json_schema

    from omrl.envs import Env, EpisodeFinishedError, Observation, StepResult
    from omrl.hookspecs import hookimpl
    from omrl.templates import ParsedAction
    from omrl_plugins.templates.tool_call import OPEN_TAG, ToolCallTemplate

    pairs = make_tasks(tasks, seed=0)
    test_pairs = make_tasks(16, seed=1)

    class BenchCalculatorEnv(Env):
        """Products of two numbers with a ``multiply`` tool; a reply without a tool call is the answer."""

        tools = [get_json_schema(Calculator().multiply)["function"]]
        action_help = SYSTEM
        max_turns = 3
        deterministic = True

        def __init__(self):
            self.pair: tuple[int, int] | None = None

        def task_ids(self, split: str):
            return range(len(pairs)) if split == "train" else range(TEST_START, TEST_START + len(test_pairs))

        def reset(self, task_id: int) -> Observation:
            self.pair = pairs[task_id] if task_id < TEST_START else test_pairs[task_id - TEST_START]
            text = QUESTION.format(a=self.pair[0], b=self.pair[1])
            return Observation(text, text, {"won": False, "score": 0.0})

        def action_from_tool_call(self, name: str, arguments: dict) -> str:
            return f"{name}[{json.dumps(arguments)}]"

        def step(self, action: str) -> StepResult:
            if self.pair is None:
                raise EpisodeFinishedError(f"{ENV_NAME}: the episode is over; call reset(task_id)")
            if action.startswith("multiply[") and action.endswith("]"):
                arguments = json.loads(action[len("multiply[") : -1])
                result = Calculator().multiply(**arguments)
                return StepResult(str(result), 0.0, False, {"won": False, "score": 0.0, "tool": "multiply"})
            product = self.pair[0] * self.pair[1]
            reward, self.pair = answer_reward(action, product), None
            return StepResult("", reward, True, {"won": reward >= 1.0, "score": float(reward >= 1.0)})

    class BenchToolCallTemplate(ToolCallTemplate):
        """omrl's tool_call template (hermes calls, the env's tools rendered by the chat template) with
        the task's own system prompt; a reply without a ``<tool_call>`` is the final answer."""

        def system_prompt(self, env) -> str:
            return SYSTEM

        def parse(self, response: str, env) -> ParsedAction:
            if OPEN_TAG not in response:
                return ParsedAction(response.strip(), True)
            return super().parse(response, env)

    class Plugin:
        @hookimpl
        def register_envs(self, register):
            register(ENV_NAME, BenchCalculatorEnv)

        @hookimpl
        def register_templates(self, register):
            register(TEMPLATE_NAME, BenchToolCallTemplate)

        @hookimpl
        def register_rewards(self, register):
            register(REWARD_NAME, lambda episodes: [[turn.reward for turn in ep.turns] for ep in episodes])

    return Plugin()


def omrl_overrides(args, model_dir: str) -> list[str]:
    # TRL never stops a run for its tool calls
    health = ("tool_health.max_steps_without_valid_call=0", "tool_health.max_malformed_rate=1.0")
    precision = ("bf16=true",) if args.bf16 else ()
    batch = (f"optim.micro_batch_size={args.tasks * args.group_size}",)  # TRL's per-device batch: the step
    return trl_grpo.omrl_overrides(
        args, model_dir, ENV_NAME, TEMPLATE_NAME, args.turns, REWARD_NAME, health + precision + batch
    )


def omrl_worker(argv: list[str]) -> None:
    """``omrl train ARGV`` through omrl's own CLI, with the benchmark's env and template registered first."""
    from omrl.cli import main as omrl_main
    from omrl.plugins import pm

    tasks = int(os.environ["BENCH_TASKS"])
    pm.register(omrl_plugin(tasks), name="benchmark.trl_multiturn")
    omrl_main(["train", *argv])


def omrl_prompts(args, model_dir: str) -> tuple[list[list[int]], list[list[dict]], list[int]]:
    """The first prompts ``omrl train`` plays, in its order (steps x tasks): their ids, their chat messages
    and the tasks' products."""
    from omrl.config import load_config
    from omrl.config.options import TrainRunConfig
    from omrl.plugins import pm

    name = "benchmark.trl_multiturn"
    if pm.get_plugin(name) is None:
        pm.register(omrl_plugin(task_count(args)), name=name)
    cfg = load_config(TrainRunConfig, "grpo", omrl_overrides(args, model_dir))
    ids, chats, tasks = trl_grpo.played_prompts(cfg, model_dir)
    pairs = make_tasks(task_count(args), seed=0)
    return ids, chats, [pairs[t][0] * pairs[t][1] for t in tasks]


def task_count(args) -> int:
    """The tasks in omrl's train split: enough for every step to draw fresh ones."""
    return max(64, args.steps * args.tasks * 2)


def sampled_tokens(row: dict) -> float:
    """The tokens omrl sampled in a step, from its metrics."""
    for key in ("generated_tokens", "decode_tokens", "completion_tokens", "response_tokens"):
        if key in row:
            return float(row[key])
    return 0.0


def run_omrl(args, model_dir: str, out_dir: str, profile_path: str | None = None) -> dict:
    env = {"OMRL_NUM_THREADS": str(args.threads), "BENCH_TASKS": str(task_count(args))}
    rows, wall = trl_grpo.train_omrl(__file__, out_dir, omrl_overrides(args, model_dir), env, profile_path)
    episodes = args.tasks * args.group_size
    steps = []
    for row in rows:
        reused, computed = row.get("prefill_reused", 0.0), row.get("prefill_tokens", 0.0)
        steps.append(
            {
                "step_time": row["step_time"],
                "rollout_s": row.get("rollout_time", 0.0),
                "sampled_tokens": sampled_tokens(row),
                "turns": row.get("turns"),  # replies per episode
                "tool_calls": row.get("valid_call_turn_rate", 0.0) * row.get("turns", 0.0),  # per episode
                "prefill_reused_share": reused / (reused + computed) if reused + computed else 0.0,
                "reward": row.get("reward"),
                "episodes": episodes,
                "skipped": bool(row.get("skipped_updates")),
            }
        )
    return {
        "steps": steps,
        "peak_rss": max(row.get("peak_rss_gb", 0.0) for row in rows) * 1e9,
        "wall_s": wall,
        "skipped_steps": sum(1 for row in rows if row.get("skipped_updates")),
        "metrics": rows,  # omrl's own per-step record, as logged
    }


def default_trl_python() -> str:
    """This python when it imports trl at the pinned version, else the separate venv's."""
    try:
        import trl

        if trl.__version__ == TRL_PIN:
            return sys.executable
    except ImportError:
        pass
    return "/tmp/trl-venv/bin/python"


def run_trl(args, spec: dict, out_dir: str, profile_path: str | None = None) -> dict:
    return trl_grpo.train_trl(__file__, args, spec, out_dir, {"TRL_EXPERIMENTAL_SILENCE": "1"}, profile_path)


def tool_model_dir(source: str, trl_python: str, into: Path) -> str:
    """``source``'s weights and tokenizer (symlinks) with TRL's packaged Qwen2.5 chat template."""
    found = subprocess.run(
        [trl_python, "-c", "import trl, pathlib; print(pathlib.Path(trl.__file__).parent)"],
        capture_output=True,
        text=True,
        check=True,
    )
    template = Path(found.stdout.strip(), "chat_templates", "qwen2_5.jinja").read_text()
    into.mkdir(parents=True, exist_ok=True)
    for path in Path(source).iterdir():
        if path.name != "chat_template.jinja":
            (into / path.name).symlink_to(path.resolve())
    (into / "chat_template.jinja").write_text(template)
    return str(into)


def warm_up(model_dir: str, out: Path, steps: int, threads: int) -> str:
    """``model_dir``'s model after ``steps`` steps of supervised fine-tuning (8 examples a step, AdamW,
    lr 1e-4) on expert episodes of the task, two kinds alternating: the question, the ``multiply``
    call, the tool's result, the product; and the question answered at once with the product (which a
    model can only imitate by guessing). SmolLM2-135M-Instruct as shipped never calls the tool (0 of 8
    samples at temperature 1, with or without a worked example in the prompt), so without this every
    episode would be one turn; with tool episodes alone it learns to call the tool every time, every
    sample of a task earns the same reward and omrl skips every update (GRPO advantages all 0) while
    TRL still runs its. With both kinds, a group's samples call the tool or guess, and differ.
    Written once to ``out`` (with the tool chat template) and reused; both sides load it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (out / "config.json").exists():
        return str(out)
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tools = [Calculator().multiply]
    examples = []
    for n, (a, b) in enumerate(make_tasks(8 * steps, seed=2)):
        call = {"type": "function", "function": {"name": "multiply", "arguments": {"a": a, "b": b}}}
        chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION.format(a=a, b=b)}]
        if n % 2 == 0:  # the tool's episode
            chat += [
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "name": "multiply", "content": str(a * b)},
            ]
        chat.append({"role": "assistant", "content": str(a * b)})
        prompt = tokenizer.apply_chat_template(chat[:2], tools=tools, add_generation_prompt=True, return_dict=False)
        ids = tokenizer.apply_chat_template(chat, tools=tools, return_dict=False)
        examples.append((ids, len(prompt)))  # trained on everything after the question
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    model.train()
    for step in range(steps):
        batch = examples[8 * step : 8 * step + 8]
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((len(batch), width), tokenizer.pad_token_id)
        labels = torch.full((len(batch), width), -100)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (ids, start) in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, start : len(ids)] = torch.tensor(ids[start:])
            mask[row, : len(ids)] = 1
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"warm-up step {step + 1}/{steps}: loss {loss.item():.3f}", flush=True)
    partial = out.with_name(out.name + ".partial")
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(out)
    return str(out)


def steady_steps(steps: list[dict]) -> list[dict]:
    """The steps a steady state is taken over: those after the first (the only one, when there is only
    one), less omrl's steps that skipped their update (every advantage 0: less work than TRL's, which
    updates anyway) unless every one did."""
    after = steps[1:] if len(steps) > 1 else steps
    return [s for s in after if not s.get("skipped")] or after


def steady(steps: list[dict], key: str = "step_time") -> float:
    """The median of ``key`` over :func:`steady_steps`."""
    return statistics.median(s[key] for s in steady_steps(steps))


def per_token(steps: list[dict]) -> float:
    """Steady seconds per sampled token: steady s/step over the tokens sampled in those steps."""
    tokens = steady(steps, "sampled_tokens")
    return steady(steps) / tokens if tokens else float("nan")


# where to look inside each side's step
PROFILED = {
    "omrl": (
        ("the train loop (rl.py:train) calls", "rl.py", "train"),
        ("the rollout loop (loop.py:collect) calls", "loop.py", "collect"),
        ("the update (rl.py:_update) calls", "rl.py", "_update"),
    ),
    "trl": (
        ("the Trainer's loop (trainer.py:_inner_training_loop) calls", "trainer.py", "_inner_training_loop"),
        (
            "the rollout (grpo_trainer.py:_generate_and_score_completions) calls",
            "grpo_trainer.py",
            "_generate_and_score_completions",
        ),
        ("the tool loop (grpo_trainer.py:_tool_call_loop) calls", "grpo_trainer.py", "_tool_call_loop"),
        ("the training step (trainer.py:training_step: rollout, loss, backward) calls", "trainer.py", "training_step"),
    ),
}


def profile(args, spec: dict, model_dir: str, tmp: str) -> dict:
    """One more run of each side under cProfile: per step, the seconds of what their main parts call."""
    import pstats

    out = {}
    for side in ("omrl", "trl"):
        path = str(Path(tmp, f"{side}.prof"))
        if side == "omrl":
            run = run_omrl(args, model_dir, str(Path(tmp, "omrl-profiled")), profile_path=path)
        else:
            run = run_trl(args, spec, str(Path(tmp, "trl-profiled")), profile_path=path)
        stats = pstats.Stats(path)
        steps = max(1, len(run["steps"]))
        out[side] = {
            "per_step_s": {
                title: [(label, seconds / steps) for label, seconds in callees(stats, file, function, 8)]
                for title, file, function in PROFILED[side]
            },
            "profiled_step_times": [s["step_time"] for s in run["steps"]],
        }
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl-python", default=None, help="python with trl (default: this one if it has trl)")
    parser.add_argument("--model", default="smollm2-135m", help="built-in name or local HF directory")
    parser.add_argument("--steps", type=int, default=3, help="training steps a run")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of one run per side, order alternating")
    parser.add_argument("--tasks", type=int, default=2, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=4, help="samples of each prompt")
    parser.add_argument("--turns", type=int, default=3, help="replies per episode at most (turn cap)")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="tokens per reply at most")
    parser.add_argument("--lr", type=float, default=1e-5, help="learning rate, constant")
    parser.add_argument(
        "--warmup-steps", type=int, default=8, help="SFT steps teaching the tool call first (0: the model as is)"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each side")
    parser.add_argument(
        "--bf16", action="store_true", help="both sides in bfloat16 autocast (TRL bf16=True, omrl bf16=true)"
    )
    parser.add_argument("--omrl-arg", action="append", default=[], help="extra key=value for omrl train")
    parser.add_argument("--no-profile", dest="profile", action="store_false", help="no cProfile run of each side")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny model, 2 steps of 1x2, 1 round")
    parser.add_argument("--json", type=Path, help="where the results go (default: results/trl_multiturn.json)")
    parser.add_argument("--trl-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.steps, args.rounds, args.tasks, args.group_size = "tiny", 2, 1, 1, 2
        args.turns, args.max_new_tokens, args.threads, args.profile, args.warmup_steps = 2, 16, 1, False, 2
    args.trl_python = args.trl_python or default_trl_python()
    return args


def main() -> None:
    if sys.argv[1:2] == ["--omrl-worker"]:
        omrl_worker(sys.argv[2:])
        return
    args = parse_args()
    if args.trl_worker:
        trl_worker(args.trl_worker)
        return

    from omrl.home import omrl_home
    from omrl.models import resolve_model_path

    if not Path(args.trl_python).exists():
        raise SystemExit(f"no TRL python at {args.trl_python}; install it as this file's docstring says")
    trl_grpo.require_same_kernels(args.trl_python)
    print(
        f"settings: {args.model}, {args.tasks} prompts x {args.group_size} samples a step, <= {args.turns} replies "
        f"of <= {args.max_new_tokens} tokens each, lr {args.lr}, {args.steps} steps, {args.rounds} rounds, "
        f"{args.warmup_steps} warm-up SFT steps, "
        f"{args.threads} thread(s), TRL from {args.trl_python}; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    sides = ["trl", "omrl"]
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    found = None
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tool_model_dir(resolve_model_path(args.model), args.trl_python, Path(tmp, "model"))
        if args.warmup_steps:
            cache = omrl_home() / "benchmarks" / f"trl_multiturn-{Path(args.model).name}-warm{args.warmup_steps}-mixed"
            model_dir = warm_up(model_dir, cache, args.warmup_steps, args.threads)
        prompt_ids, messages, products = omrl_prompts(args, model_dir)
        spec = {
            "model_dir": model_dir,
            "messages": messages,
            "products": products,
            "first_prompt_ids": prompt_ids[: args.tasks],
            "steps": args.steps,
            "tasks": args.tasks,
            "group_size": args.group_size,
            "turns": args.turns,
            "max_new_tokens": args.max_new_tokens,
            "lr": args.lr,
            "threads": args.threads,
            "bf16": args.bf16,
        }
        for r in range(args.rounds):
            for side in sides[r % 2 :] + sides[: r % 2]:  # each round starts with the other side
                out = str(Path(tmp, f"{side}-{r}"))
                started = time.perf_counter()
                run = run_trl(args, spec, out) if side == "trl" else run_omrl(args, model_dir, out)
                run["load_average"] = list(os.getloadavg())
                runs[side].append(run)
                print(
                    f"round {r} {side}: {steady(run['steps']):.2f} s/step, {time.perf_counter() - started:.0f} s "
                    f"in all",
                    flush=True,
                )
        ratios = [steady(o["steps"]) / steady(t["steps"]) for o, t in zip(runs["omrl"], runs["trl"])]
        token_ratios = [per_token(o["steps"]) / per_token(t["steps"]) for o, t in zip(runs["omrl"], runs["trl"])]
        memory_ratios = [o["peak_rss"] / t["peak_rss"] for o, t in zip(runs["omrl"], runs["trl"])]
        met = statistics.median(token_ratios) <= TARGET and max(memory_ratios) <= 1.0
        if args.profile:
            found = profile(args, spec, model_dir, tmp)

    trl_version = runs["trl"][0]["versions"]["trl"]
    print(
        f"\nomrl train --algo grpo vs TRL {trl_version} GRPOTrainer(environment_factory=Calculator); identical "
        f"first prompt ids in TRL: {all(t['same_prompt_ids'] for t in runs['trl'])}"
    )
    print(
        f"{'side':5s} {'round':>5s} {'step times s':>22s} {'s/step*':>8s} {'rollout s*':>10s} {'tokens*':>8s} "
        f"{'tok/s*':>7s} {'turns/ep':>8s} {'calls/ep':>8s} {'reuse':>6s} {'peak RSS GiB':>12s}"
    )
    for side, r, run, times in trl_grpo.each_run(sides, runs):
        kept = steady_steps(run["steps"])
        tokens = steady(run["steps"], "sampled_tokens")
        turns = [s.get("turns") for s in kept if s.get("turns") is not None]
        calls = [s.get("tool_calls") for s in kept if s.get("tool_calls") is not None]
        reuse = [s["prefill_reused_share"] for s in kept if "prefill_reused_share" in s]
        print(
            f"{side:5s} {r:5d} {times:>22s} "
            f"{steady(run['steps']):8.2f} {steady(run['steps'], 'rollout_s'):10.2f} {tokens:8.0f} "
            f"{tokens / steady(run['steps']):7.1f} "
            f"{(f'{statistics.mean(turns):.2f}' if turns else '-'):>8s} "
            f"{(f'{statistics.mean(calls):.2f}' if calls else '-'):>8s} "
            f"{(f'{statistics.mean(reuse):.0%}' if reuse else '-'):>6s} {run['peak_rss'] / 2**30:12.2f}"
        )
    print(
        f"* median over the steps after the first, less omrl's that skipped their update; tokens: sampled a step\n"
        f"omrl/TRL s/step: min {min(ratios):.2f}, median {statistics.median(ratios):.2f}; per sampled token "
        f"(at equal tokens): min {min(token_ratios):.2f}, median {statistics.median(token_ratios):.2f} "
        f"(target <= {TARGET}); peak RSS: max {max(memory_ratios):.2f} (target <= 1.0): "
        f"{'met' if met else 'MISSED'}"
    )
    skipped = sum(run["skipped_steps"] for run in runs["omrl"])
    if skipped:
        print(f"omrl skipped {skipped} update(s) (every advantage 0), left out of its steady state (less work)")
    if found:
        for side, part in found.items():
            trl_grpo.print_profile(side, part)
    from _results import save_comparison  # here: the TRL worker's venv has no omrl

    save_comparison(
        args,
        "trl_multiturn",
        f"omrl time per step at equal tokens <= {TARGET} x TRL's, and peak RSS <= TRL's",
        {
            "system": SYSTEM,
            "prompt_lengths": [len(ids) for ids in prompt_ids],
            "runs": runs,
            "ratios": ratios,
            "per_token_ratios": token_ratios,
            "memory_ratios": memory_ratios,
            "met": met,
            "profile": found,
        },
    )


if __name__ == "__main__":
    main()
