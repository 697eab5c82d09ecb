"""Environments with something omrl cannot honour, one per ``kind``, each refused with an error naming it; and
environments whose episodes fail in the environment (``raising_reward``, ``none_reward``, ``broken_turn``...)."""

import asyncio

import verifiers as vf
from datasets import Dataset
from openai import AsyncOpenAI

ROWS = [{"question": "Say yes.", "answer": "yes"}]
BAD_VALUES = {"none_reward": None, "nan_reward": float("nan"), "inf_reward": float("inf"), "text_reward": "1.0"}


def said_yes(completion, answer) -> float:
    return 1.0 if answer in (vf.Parser().parse_answer(completion) or "") else 0.0


def single(rubric: vf.Rubric, rows=ROWS) -> vf.Environment:
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=rubric)


class Echo(vf.MultiTurnEnv):
    """Answers every reply with "again" (or, for ``kind``, misbehaves on the second turn)."""

    def __init__(self, kind: str, **kwargs):
        super().__init__(**kwargs)
        self.kind = kind

    async def env_response(self, messages, state, **kwargs):
        if self.kind == "broken_turn":
            raise RuntimeError("the game engine crashed")
        if self.kind == "slow_turn":
            await asyncio.sleep(30)
        return [vf.UserMessage(content="again")]

    async def get_prompt_messages(self, state):
        messages = await super().get_prompt_messages(state)
        return messages[-1:] if self.kind == "rewrite" and state["trajectory"] else messages


def load_environment(kind: str) -> vf.Environment:
    if kind == "judge":
        client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="none")
        return single(vf.JudgeRubric(judge_client=client, judge_model="judge-1"))
    if kind == "group":

        def diversity(completions) -> list[float]:
            return [1.0] * len(completions)

        return single(vf.Rubric(funcs=[said_yes, diversity]))
    if kind == "sandbox":
        from prime_sandboxes import StartCommand  # what prime-sandboxes 0.5 takes (verifiers 0.3.1 passes text)

        start = StartCommand(executable="tail", args=["-f", "/dev/null"])
        return vf.SandboxEnv(dataset=Dataset.from_list(ROWS), rubric=vf.Rubric(funcs=[said_yes]), start_command=start)
    if kind == "user_model":
        env = single(vf.Rubric(funcs=[said_yes]))
        env.user_client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="none")
        return env
    if kind == "image":
        part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
        rows = [
            {"prompt": [{"role": "user", "content": [{"type": "text", "text": "What is it?"}, part]}], "answer": "x"}
        ]
        return single(vf.Rubric(funcs=[said_yes]), rows)
    if kind == "raising_reward":

        def needs_a_server(completion) -> float:
            raise ConnectionError("no route to the scoring service")

        return single(vf.Rubric(funcs=[said_yes, needs_a_server]))
    if kind in BAD_VALUES:

        def counts_nothing(completion):
            return BAD_VALUES[kind]

        return single(vf.Rubric(funcs=[said_yes, counts_nothing]))
    if kind in ("broken_turn", "slow_turn", "rewrite"):
        return Echo(kind, dataset=Dataset.from_list(ROWS), rubric=vf.Rubric(funcs=[said_yes]), max_turns=3)
    if kind == "eval_only":
        return vf.SingleTurnEnv(eval_dataset=Dataset.from_list(ROWS), rubric=vf.Rubric(funcs=[said_yes]))
    raise ValueError(f"no kind {kind!r}")
