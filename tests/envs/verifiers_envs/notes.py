"""A stateful tool environment (``vf.StatefulToolEnv``): the tools read and write notes that live in the rollout's
state, passed in by ``update_tool_args`` and hidden from the model's view of the tools."""

import verifiers as vf
from datasets import Dataset


class NotesEnv(vf.StatefulToolEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_tool(self.remember, args_to_skip=["notes"])
        self.add_tool(self.recall, args_to_skip=["notes"])

    async def setup_state(self, state: vf.State) -> vf.State:
        state["notes"] = []
        return state

    def update_tool_args(self, tool_name, tool_args, messages, state, **kwargs) -> dict:
        return {**tool_args, "notes": state["notes"]}

    def remember(self, text: str, notes: list) -> str:
        """Write a note.

        Args:
            text: The note.
        """
        notes.append(text)
        return f"noted ({len(notes)} notes)"

    def recall(self, notes: list) -> str:
        """Read every note written so far."""
        return "; ".join(notes) or "(no notes)"


def load_environment() -> vf.Environment:
    rows = [{"question": "Remember the word 'pelican', recall it, then answer with it.", "answer": "pelican"}]
    parser = vf.Parser()

    def recalled(completion, answer) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    return NotesEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[recalled], parser=parser), max_turns=4)
