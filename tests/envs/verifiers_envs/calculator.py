"""A tool environment: Python functions as tools (``vf.ToolEnv``); the answer is the last reply without a call."""

import verifiers as vf
from datasets import Dataset

CAPITALS = {"France": "Paris", "Peru": "Lima"}


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def capital(country: str) -> str:
    """The capital city of a country.

    Args:
        country: The country's name.
    """
    return CAPITALS[country]


def load_environment() -> vf.Environment:
    rows = [
        {"question": "What is 17 + 25? Use the add tool, then answer with the number alone.", "answer": "42"},
        {"question": "What is the capital of Peru? Use the capital tool.", "answer": "Lima"},
    ]
    parser = vf.Parser()

    def correct_answer(completion, answer) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    return vf.ToolEnv(
        dataset=Dataset.from_list(rows),
        eval_dataset=Dataset.from_list(rows[:1]),
        tools=[add, capital],
        rubric=vf.Rubric(funcs=[correct_answer], parser=parser),
        parser=parser,
        max_turns=4,
    )
