"""An unmodified LangGraph agent learns to use its calculator: SmolLM2-135M trained through the gateway.

    python examples/agents/learn_calculator.py            # the full run (SmolLM2-135M, 2 CPU cores)
    python examples/agents/learn_calculator.py --quick    # the same stages with `tiny`, in minutes

The agent is LangGraph's prebuilt ReAct graph with one tool, ``multiply(a, b)`` (a real Python
function), written as LangGraph's docs write it (:func:`agent`). omrl never sees its code: it serves
the policy behind the OpenAI-compatible endpoint and records every call. The tasks are products of two
numbers of 2-3 digits (``calculator.jsonl``, a fixed 20% held out), scored by the ``dataset`` env
(``match=numeric``: the last number of the agent's final message). A 135M model cannot multiply 517
by 839 in its head; it can learn to copy the numbers into the tool call and the tool's result into
its answer.

Stages, each written under ``--out`` and skipped when its result is there:

1. EXPERT, recorded through the gateway: the same LangGraph agent, with a scripted expert behind the
   endpoint instead of the model. Two kinds, on different training tasks: the expert that calls
   ``multiply`` and then answers with its result, and the expert that answers at once (the right
   number, which a model can only imitate by guessing).
2. SFT on both (``--tool-share`` of the draw from the tool's): the SFT model calls the tool on some
   questions and guesses on others.
3. GRPO through the gateway from the SFT model, reward 1 for a right answer: tool use is never
   rewarded as such.

Measured on the first ``eval_tasks`` test tasks, ``eval_samples`` episodes each at temperature 1,
after SFT and after GRPO: success, the share of episodes that called a tool, the share of tool-call
attempts that parsed (``ok``), each with its standard error over tasks, and the success difference
paired over the same tasks. ``summary.json`` holds every number.
"""

from __future__ import annotations

import json
import math
import random
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path

from omrl.atomic import atomic_write_text
from omrl.backends.base import Backend, Generation
from omrl.config import load_config
from omrl.config.options import EvalRunConfig, RolloutRunConfig, TrainRunConfig
from omrl.data import write_episodes
from omrl.rollout import PlaySpec, RolloutSession
from omrl.training.checkpoint import latest_checkpoint
from omrl.training.rl import run_rl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/common.py
import common  # noqa: E402

QUESTION = re.compile(r"What is (\d+) times (\d+)\?")
AGENT = "learn_calculator:agent"  # this file's agent, imported by module name (run from this folder)


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def agent(task: dict, base_url: str, api_key: str) -> str:
    """The agent as a LangGraph user writes it: a ReAct graph with the calculator."""
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.errors import GraphRecursionError
    from langgraph.prebuilt import create_react_agent

    llm = ChatOpenAI(base_url=base_url, api_key=api_key, model="policy", max_retries=0)
    graph = create_react_agent(llm, [tool(multiply)], prompt="Answer with the number. Use multiply for products.")
    try:
        out = graph.invoke({"messages": [{"role": "user", "content": task["prompt"]}]}, {"recursion_limit": 7})
    except GraphRecursionError:  # the model kept calling tools: the agent gives up with no answer
        return ""
    return out["messages"][-1].content


class Expert(Backend):
    """A scripted expert behind the endpoint: reads the question from the prompt and writes the reply the
    model should: a multiply call, then the tool's result as the answer (or, ``uses_tool`` False, the
    right answer at once)."""

    name = "expert"

    def __init__(self, tokenizer, uses_tool: bool):
        super().__init__(tokenizer)
        self.uses_tool = uses_tool

    def generate(self, prompts, params, messages=None) -> list[Generation]:
        out = []
        for index, prompt in enumerate(prompts):
            text = self.tokenizer.decode(prompt)
            a, b = map(int, QUESTION.findall(text)[-1])
            result = re.findall(r"<tool_response>\s*(-?\d+)\s*</tool_response>", text)
            if result:
                reply = f"The answer is {result[-1]}."
            elif self.uses_tool:
                reply = f'<tool_call>\n{{"name": "multiply", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'
            else:
                reply = f"The answer is {a * b}."
            ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.eos_token_id]
            out.append(self._cut(ids, [0.0] * len(ids), params.limit(index)))
        return out


FULL = common.ToolBudget("smollm2-135m", 300, 0.3, 1.0, 5e-5, 4, 4, 8, 1e-5, 40)
QUICK = common.ToolBudget("tiny", 60, 0.5, 2.0, 2e-3, 2, 4, 4, 5e-4, 8, eval_samples=2, micro_batch_size=16)


def write_tasks(path: Path, count: int = 1500, seed: int = 0) -> Path:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(10, 999), rng.randint(10, 999)
        rows.append({"question": f"What is {a} times {b}?", "answer": str(a * b)})
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in rows))
    return path


def settings(tasks: Path, model: str) -> list[str]:
    return [
        f"model.name={model}",
        "env.name=dataset",
        f"plugins.dataset.path={tasks}",
        "plugins.dataset.test_fraction=0.2",
        "plugins.dataset.match=numeric",
        f"agent.callable={AGENT}",
        "agent.timeout_s=600",
        "generation.max_new_tokens=48",
        "generation.max_context=1024",
        "generation.batch_size=64",
    ]


def expert_data(path: Path, tasks: Path, budget: common.ToolBudget, uses_tool: bool) -> Path:
    """The expert plays ``expert_episodes`` training tasks through the gateway (the tool's: the first ones)."""
    cfg = load_config(RolloutRunConfig, None, settings(tasks, budget.model))
    with RolloutSession.from_config(cfg, backend=_expert(cfg, uses_tool)) as session:
        ids = session.task_ids("train", 2 * budget.expert_episodes)
        mine = ids[: budget.expert_episodes] if uses_tool else ids[budget.expert_episodes :]
        episodes = session.play(mine, PlaySpec(split="train")).episodes
    assert all(ep.won for ep in episodes), [ep.error for ep in episodes if not ep.won][:3]
    write_episodes(episodes, path)
    return path


def _expert(cfg, uses_tool: bool) -> Expert:
    from omrl.models import load_tokenizer

    return Expert(load_tokenizer(cfg.model.name), uses_tool)


def held_out(model: str, tasks: Path, budget: common.ToolBudget, seed: int) -> dict:
    """Success and tool use on the first ``eval_tasks`` test tasks, ``eval_samples`` episodes each at T=1."""
    overrides = [*settings(tasks, model), "generation.temperature=1.0", f"seed={seed}"]
    with RolloutSession.from_config(load_config(EvalRunConfig, None, overrides)) as session:
        ids = session.task_ids("test", budget.eval_tasks)
        episodes = session.play(ids, PlaySpec(split="test", seed=seed, group_size=budget.eval_samples)).episodes
    per_task = [episodes[i : i + budget.eval_samples] for i in range(0, len(episodes), budget.eval_samples)]
    attempts = [a for ep in episodes for t in ep.turns for a in t.info.get("tool_calls", [])]
    called = [[any(t.info.get("tool_calls") for t in ep.turns) for ep in group] for group in per_task]
    wins = [[ep.won for ep in group] for group in per_task]
    return {
        "success": _mean(wins),
        "success_se": common.standard_error([sum(g) / len(g) for g in wins]),
        "per_task_success": [sum(g) / len(g) for g in wins],
        "tool_call_rate": _mean(called),
        "tool_call_rate_se": common.standard_error([sum(g) / len(g) for g in called]),
        "tool_call_attempts": len(attempts),
        "tool_calls_ok": sum(a["status"] == "ok" for a in attempts) / len(attempts) if attempts else 0.0,
        "rows_per_episode": sum(1 + len(ep.row_starts) for ep in episodes) / len(episodes),
        "env_errors": sum(ep.end_reason == "env_error" for ep in episodes),
        "episodes": len(episodes),
    }


def _mean(groups: list[list[bool]]) -> float:
    flat = [x for g in groups for x in g]
    return sum(flat) / len(flat)


def grpo_stage(model: Path, tasks: Path, out: Path, budget: common.ToolBudget, seed: int) -> None:
    overrides = [
        *settings(tasks, str(model)),
        *common.grpo_settings(out, budget, seed),
        "eval_every=0",
        f"logging.save_steps={budget.grpo_steps}",
        f"resume={str(out.exists() and latest_checkpoint(out) is not None).lower()}",
    ]
    run_rl(load_config(TrainRunConfig, "grpo", overrides))


def main(out: Path, budget: common.ToolBudget, seed: int = 0) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    tasks = out / "calculator.jsonl"
    if not tasks.exists():
        write_tasks(tasks)

    def show(label: str, m: dict) -> dict:
        parsed = f", {m['tool_calls_ok']:.1%} of {m['tool_call_attempts']} attempts parsed ok"
        return common.show_tool_use(label, m, f"{parsed}, {m['rows_per_episode']:.2f} rows an episode")

    tool, direct = out / "expert_tool.parquet", out / "expert_direct.parquet"
    if not tool.exists():
        expert_data(tool, tasks, budget, uses_tool=True)
    if not direct.exists():
        expert_data(direct, tasks, budget, uses_tool=False)
    sft_dir = out / "sft"
    if not any(sft_dir.glob("*.safetensors")):
        common.sft_on_both_experts(tool, direct, sft_dir, budget, seed)
    after_sft = show("after SFT", common.stage(out, "after_sft", lambda: held_out(str(sft_dir), tasks, budget, seed)))
    grpo_dir = out / "grpo"
    if not any(grpo_dir.glob("*.safetensors")):
        grpo_stage(sft_dir, tasks, grpo_dir, budget, seed)
    after = show("after GRPO", common.stage(out, "after_grpo", lambda: held_out(str(grpo_dir), tasks, budget, seed)))
    differences = [b - a for a, b in zip(after_sft["per_task_success"], after["per_task_success"])]
    gain = sum(differences) / len(differences)
    paired_se = common.standard_error(differences)
    summary = {
        "agent": "LangGraph create_react_agent + multiply, through omrl's gateway",
        "budget": asdict(budget),
        "after_sft": after_sft,
        "after_grpo": after,
        "success_gain": gain,
        "success_gain_paired_se": paired_se,
        "success_gain_in_se": gain / paired_se if paired_se else 0.0,
        "se_unpaired": math.hypot(after["success_se"], after_sft["success_se"]),
        "tool_call_rate_gain": after["tool_call_rate"] - after_sft["tool_call_rate"],
        "minutes": (time.perf_counter() - started) / 60,
    }
    return common.write_summary(out, summary, gain, "paired SE")


if __name__ == "__main__":
    main(
        *common.tool_example_arguments(
            __doc__, "runs/learn-calculator", FULL, QUICK, "the share of SFT data that uses the tool"
        )
    )
