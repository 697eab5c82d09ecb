"""Small agent datasets for the training tests."""

from __future__ import annotations


def agent_records(n: int = 8) -> list[dict]:
    """``n`` OpenManus-RL records in the README's ReAct pattern (4 distinct ones, repeated)."""
    records = []
    for i in range(n):
        k = i % 4
        records.append(
            {
                "id": f"os_{i}",
                "conversations": [
                    {"role": "system", "content": "You are an agent in a Linux shell."},
                    {"role": "user", "content": f"Count files in /etc/dir{k}"},
                    {
                        "role": "assistant",
                        "content": "Think: Need reliable counting method\nAct: bash\n```bash\nls -1 | wc -l\n```",
                    },
                    {"role": "user", "content": f"OS Output: {220 + k}"},
                    {"role": "assistant", "content": f"Think: Verified through execution\nAct: answer({220 + k})"},
                ],
            }
        )
    return records


def sft_run_config(model_dir: str, dataset, output_dir, /, **overrides):
    """A fast SFT config on ``model_dir`` (overrides as dotted keys written ``a__b``)."""
    from omrl.config import from_dict, merge
    from omrl.config.options import SftRunConfig

    data = {
        "model": {"name": model_dir},
        "dataset": str(dataset),
        "max_seq_length": 256,
        "num_train_epochs": 2.0,
        "packing": False,
        "optim": {"learning_rate": 2e-3, "micro_batch_size": 2, "gradient_accumulation_steps": 1},
        "logging": {"output_dir": str(output_dir), "tensorboard": False},
    }
    for key, value in overrides.items():
        node: dict = {}
        top = node
        *parents, leaf = key.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
        data = merge(data, top)
    return from_dict(SftRunConfig, data)
