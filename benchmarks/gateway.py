"""The gateway against omrl's own loop: the same chats, model and token counts, played both ways.

    python benchmarks/gateway.py [--model tiny] [--episodes 32] [--turns 4] [--tokens 32] [--threads 2]
        [--batching turns|continuous] [--json out.json]

Both arms play the same multi-turn chats: a system prompt, a question, then ``--turns`` replies each
answered "Go on.". The native arm is :func:`omrl.rollout.loop.collect` over an env that answers so;
the gateway arm is an agent program on the real ``openai`` client that sends the same chats through
:class:`omrl.gateway.server.Gateway` (HTTP on loopback, every call recorded token-exactly), all
episodes at once. Decoding is greedy, so both arms sample the same replies (the token counts are
printed side by side).

Printed, in one run:

- **throughput**: generated tokens a second on ``--model`` (``tiny``, or ``smollm2-135m``), gateway /
  native (target >= 0.8);
- **per-call overhead**: with a backend that samples nothing (a fixed reply, no model), one episode of
  32 calls at a time, the extra milliseconds a call costs through the gateway (HTTP, JSON, the client, laying out
  the row, parsing) over the loop's own turn.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Sequence

import openai
import torch
from _results import default_json, machine, save_json

from omrl.backends.base import Backend, Generation, SamplingParams
from omrl.backends.hf import HFBackend
from omrl.envs import Env, Observation, StepResult
from omrl.gateway.play import AgentSpec, play_agents
from omrl.gateway.server import Gateway
from omrl.models import load_model, resolve_model_path
from omrl.rollout.loop import collect
from omrl.rollout.pool import EnvPool
from omrl.rollout.spec import RolloutLimits
from omrl.templates import ParsedAction, Template

SYSTEM = "You are a helpful assistant. Keep talking."
QUESTION = "Tell me about the number {task}."
GO_ON = "Go on."
TURNS = 4
OVERHEAD_EPISODES = 4
OVERHEAD_TURNS = 32


class GoOnEnv(Env):
    """Answers every reply with "Go on." until ``TURNS`` replies."""

    max_turns = 100

    def task_ids(self, split: str) -> Sequence[int]:
        return range(1000)

    def reset(self, task_id: int) -> Observation:
        self.turn = 0
        text = QUESTION.format(task=task_id)
        return Observation(text, text)

    def step(self, action: str) -> StepResult:
        self.turn += 1
        done = self.turn >= TURNS
        return StepResult(GO_ON, 0.0, done, {"won": False, "score": 0.0})


class Verbatim(Template):
    """The reply is the action; the system prompt is the agent's."""

    def system_prompt(self, env: Any) -> str:
        return SYSTEM

    def parse(self, response: str, env: Any) -> ParsedAction:
        return ParsedAction(response, True)

    def format_action(self, action: str, env: Any, thought: str = "") -> str:
        return action


def agent(task: dict, base_url: str, api_key: str) -> None:
    """The same chat as the native arm's, through the endpoint."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["prompt"]}]
    for _ in range(TURNS):
        reply = client.chat.completions.create(model="policy", messages=chat)
        chat += [{"role": "assistant", "content": reply.choices[0].message.content}, {"role": "user", "content": GO_ON}]


class FixedReply(Backend):
    """Samples nothing: every reply is the same ids (what is left is the loop's or the gateway's own cost)."""

    name = "fixed"

    def __init__(self, tokenizer: Any, tokens: int):
        super().__init__(tokenizer)
        self.reply = tokenizer.encode(" word" * (tokens - 1), add_special_tokens=False)[: tokens - 1] + [
            self.eos_token_id
        ]

    def generate(self, prompts, params: SamplingParams, messages=None) -> list[Generation]:
        return [Generation(list(self.reply), [0.0] * len(self.reply), "stop") for _ in prompts]


BATCHES: dict[str, list[int]] = {}  # the gateway arm's last batch sizes


def native(backend: Backend, tokenizer: Any, limits: RolloutLimits, tasks: list[int]) -> tuple[float, list[Any]]:
    with EnvPool(GoOnEnv, name="go_on") as pool:
        began = time.perf_counter()
        episodes = collect(pool, Verbatim(), tokenizer, tasks, backend=backend, limits=limits, demonstration=False)
        return time.perf_counter() - began, episodes


def gateway(backend: Backend, tokenizer: Any, limits: RolloutLimits, tasks: list[int]) -> tuple[float, list[Any]]:
    served = Gateway(tokenizer, backend, limits, window_s=0.02, batch_on_caller=True)  # as a session builds it
    try:
        with EnvPool(GoOnEnv, name="go_on") as pool:
            began = time.perf_counter()
            spec = AgentSpec(run=agent, command=None, reward=None, timeout_s=600)
            episodes = play_agents(spec, served, pool, tasks)
            BATCHES["gateway"] = list(served.batcher.batch_sizes)
            return time.perf_counter() - began, episodes
    finally:
        served.close()


def generated(episodes: list[Any]) -> int:
    return sum(sum(ep.loss_mask) for ep in episodes)


def main() -> None:
    global TURNS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny", help="a built-in model: tiny or smollm2-135m")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32, help="max_new_tokens a reply")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of both arms (the best of each kept)")
    parser.add_argument("--batching", default="turns", choices=["turns", "continuous"], help="generation.batching")
    parser.add_argument("--json", default="", help="default: benchmarks/results/gateway_<model>[_continuous].json")
    args = parser.parse_args()
    TURNS = args.turns
    torch.set_num_threads(args.threads)
    suffix = "" if args.batching == "turns" else f"_{args.batching}"
    args.json = args.json or str(default_json(f"gateway_{args.model}{suffix}"))
    model, tokenizer = load_model(resolve_model_path(args.model))
    limits = RolloutLimits(max_new_tokens=args.tokens, max_context=8192, temperature=0.0)
    tasks = list(range(args.episodes))
    record: dict[str, Any] = {
        "machine": machine(args.threads),
        "model": args.model,
        "episodes": args.episodes,
        "turns": args.turns,
        "tokens": args.tokens,
        "batching": args.batching,
    }

    best: dict[str, tuple[float, int]] = {}
    generating: dict[str, float] = {}
    batches: list[int] = []
    for _ in range(args.rounds):  # alternating, so both arms see the same load
        for name, arm in (("native", native), ("gateway", gateway)):
            backend = HFBackend(model, tokenizer, batching=args.batching)
            seconds, episodes = arm(backend, tokenizer, limits, tasks)
            assert all(ep.end_reason != "env_error" for ep in episodes), [ep.error for ep in episodes][:3]
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, generated(episodes))
                generating[name] = backend.take_stats()["generate_seconds"]
                batches = list(BATCHES.get("gateway", [])) if name == "gateway" else batches
    rate = {name: tokens / seconds for name, (seconds, tokens) in best.items()}
    record["model_arms"] = {
        name: {"seconds": round(seconds, 3), "generated_tokens": tokens, "tokens_per_s": round(rate[name], 1)}
        for name, (seconds, tokens) in best.items()
    }
    record["throughput_ratio"] = round(rate["gateway"] / rate["native"], 3)
    record["generate_seconds"] = {name: round(value, 3) for name, value in generating.items()}
    record["gateway_batch_sizes"] = batches

    TURNS = OVERHEAD_TURNS  # one long episode at a time: each call's own latency, the episode's start amortised
    calls = OVERHEAD_EPISODES * TURNS
    fixed: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, arm in (("native", native), ("gateway", gateway)):
            seconds = sum(
                arm(FixedReply(tokenizer, args.tokens), tokenizer, limits, [task])[0]
                for task in range(OVERHEAD_EPISODES)
            )
            fixed[name] = min(fixed.get(name, seconds), seconds)
    record["no_model"] = {
        name: {"seconds": round(s, 3), "ms_per_call": round(1000 * s / calls, 2)} for name, s in fixed.items()
    }
    record["overhead_ms_per_call"] = round(1000 * (fixed["gateway"] - fixed["native"]) / calls, 2)

    print(
        f"{args.model}, generation.batching={args.batching}, {args.episodes} episodes x {args.turns} turns, {args.tokens} tokens a reply, greedy, {args.threads} threads"
    )
    for name in ("native", "gateway"):
        seconds, tokens = best[name]
        print(f"  {name:8} {seconds:7.2f} s  {tokens:6d} tokens  {rate[name]:8.1f} tok/s")
    print(f"  gateway / native throughput: {record['throughput_ratio']:.2f}x (target >= 0.8)")
    print(
        f"  in generate calls: native {generating['native']:.2f} s, gateway {generating['gateway']:.2f} s; gateway batches {batches}"
    )
    print(
        f"no model, {OVERHEAD_TURNS} calls an episode: native {record['no_model']['native']['ms_per_call']} ms a call, gateway {record['no_model']['gateway']['ms_per_call']} ms"
    )
    print(f"  gateway overhead: {record['overhead_ms_per_call']} ms a call")
    save_json(args.json, record)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
