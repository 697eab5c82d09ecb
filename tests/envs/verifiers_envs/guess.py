"""A multi-turn game: guess a secret number from 1 to 20; the environment answers higher or lower and keeps the
guesses in its state, and ends the game (its final answer) when a guess is right."""

import re

import verifiers as vf
from datasets import Dataset

RULES = "I picked a number from 1 to 20. Guess it: reply with one number."


class GuessEnv(vf.MultiTurnEnv):
    cleaned_up = 0  # rollouts whose cleanup handler ran (one each, finished or cancelled)
    torn_down = False

    @vf.cleanup
    async def count_cleanup(self, state: vf.State) -> None:
        self.cleaned_up += 1

    @vf.teardown
    async def tear_down(self) -> None:
        self.torn_down = True

    async def setup_state(self, state: vf.State) -> vf.State:
        state["secret"] = int(state["answer"])
        state["guesses"] = []
        return state

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs) -> vf.Messages:
        numbers = re.findall(r"-?\d+", self.parser.parse_answer(messages) or "")
        if not numbers:
            return [{"role": "user", "content": "Reply with one number."}]
        guess = int(numbers[-1])
        state["guesses"].append(guess)
        earlier = ", ".join(map(str, state["guesses"]))
        if guess == state["secret"]:
            state["final_env_response"] = [
                {"role": "user", "content": f"Correct! {guess} in {len(state['guesses'])} guesses."}
            ]
            return []
        hint = "higher" if guess < state["secret"] else "lower"
        return [{"role": "user", "content": f"Guess {len(state['guesses'])} ({earlier}): go {hint}."}]


def solved(state) -> float:
    return 1.0 if state["guesses"] and state["guesses"][-1] == state["secret"] else 0.0


def guesses_used(state) -> float:
    return float(len(state["guesses"]))


def load_environment(secrets: tuple = (7, 15, 3), max_turns: int = 5) -> vf.Environment:
    rows = [{"question": RULES, "answer": str(secret)} for secret in secrets]
    rubric = vf.Rubric(funcs=[solved, guesses_used], weights=[1.0, 0.0])
    return GuessEnv(dataset=Dataset.from_list(rows), rubric=rubric, max_turns=max_turns)
