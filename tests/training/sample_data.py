"""Small agent datasets for the training tests."""

from __future__ import annotations


def agent_records(n: int = 8) -> list[dict]:
    """``n`` OpenManus-RL records in the README's ReAct pattern (4 distinct ones, repeated)."""
    records = []
    for i in range(n):
        k = i % 4
        records.append({"id": f"os_{i}", "conversations": [
            {"role": "system", "content": "You are an agent in a Linux shell."},
            {"role": "user", "content": f"Count files in /etc/dir{k}"},
            {"role": "assistant", "content": "Think: Need reliable counting method\nAct: bash\n```bash\nls -1 | wc -l\n```"},
            {"role": "user", "content": f"OS Output: {220 + k}"},
            {"role": "assistant", "content": f"Think: Verified through execution\nAct: answer({220 + k})"},
        ]})
    return records
