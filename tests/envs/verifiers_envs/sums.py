"""A single-turn environment: sums to answer in ``<answer>`` tags, scored by a rubric of two functions."""

import verifiers as vf
from datasets import Dataset

SYSTEM_PROMPT = "Think inside <think> tags, then give the number alone inside <answer> tags."


def sums(count: int, start: int) -> Dataset:
    rows = [{"question": f"What is {a} + {a + 1}?", "answer": str(2 * a + 1)} for a in range(start, start + count)]
    return Dataset.from_list(rows)


def load_environment(num_train: int = 4, num_eval: int = 2, format_weight: float = 0.2) -> vf.Environment:
    parser = vf.XMLParser(["think", "answer"], answer_field="answer")

    def correct_answer(completion, answer, parser) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    rubric = vf.Rubric(
        funcs=[correct_answer, parser.get_format_reward_func()], weights=[1.0, format_weight], parser=parser
    )
    return vf.SingleTurnEnv(
        dataset=sums(num_train, 1),
        eval_dataset=sums(num_eval, 100),
        system_prompt=SYSTEM_PROMPT,
        parser=parser,
        rubric=rubric,
    )
