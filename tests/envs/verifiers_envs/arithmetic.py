"""verifiers' own packaged environment class ``vf.ReasoningGymEnv`` (reasoning_gym's procedural tasks, one turn,
an ``<answer>`` tag, the dataset's own scorer as the reward), on reasoning_gym's basic_arithmetic."""

import verifiers as vf


def load_environment(num_train_examples: int = 3, num_eval_examples: int = 2) -> vf.Environment:
    return vf.ReasoningGymEnv(
        gym="basic_arithmetic", num_train_examples=num_train_examples, num_eval_examples=num_eval_examples, seed=1
    )
