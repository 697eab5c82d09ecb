"""Train against a running vLLM server and check that it samples from the trained weights.

    VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model ~/.cache/omrl/models/tiny \\
        --served-model-name tiny --port 8011 --dtype float32 --enforce-eager
    python scripts/check_vllm_server.py --base-url http://127.0.0.1:8011/v1 [--weight-sync files|nccl]

Three GRPO steps of the tiny model on gridworld whose every episode the server samples, the weights
sent after each update (``generation.weight_sync``). Then: the server names the last version, and
its log-probs of fresh samples are the saved model's (a transformers forward pass), not the
starting model's. Prints one JSON line of what it measured; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from omrl.backends import SamplingParams
from omrl.backends.openai import OpenAIBackend
from omrl.backends.weight_sync import FileSync, ServerControl
from omrl.config import load_config
from omrl.config.options import TrainRunConfig
from omrl.hookspecs import hookimpl
from omrl.models import load_model
from omrl.plugins import load_plugins
from omrl.training.metrics import read_metrics
from omrl.training.rl import run_rl

STEPS = 3


class SampleIndexReward:
    """The sample's index in its group, on the last turn: rewards that differ, so every step updates
    (the untrained tiny model never reaches gridworld's goal)."""

    @hookimpl
    def register_rewards(self, register):
        def sample_index(episodes):
            """The sample's index in its group."""
            return [[0.0] * (len(ep.turns) - 1) + [float(ep.sample)] for ep in episodes]

        register("sample_index", sample_index)


def largest_gap(model, prompt: list[int], ids: list[int], logprobs: list[float]) -> float:
    """The largest difference between the server's log-probs of ``ids`` and ``model``'s (temperature 1)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    own = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None]).squeeze(1)
    return (own - torch.tensor(logprobs)).abs().max().item()


def main(base_url: str, weight_sync: str) -> dict:
    load_plugins().register(SampleIndexReward(), name="check-sample-index")
    out = Path(tempfile.mkdtemp(prefix="omrl-server-check-"))
    started = time.perf_counter()
    run_rl(
        load_config(
            TrainRunConfig,
            "grpo",
            [
                "model.name=tiny",
                "env.name=gridworld",
                "generation.backend=openai",
                f"generation.base_url={base_url}",
                f"generation.weight_sync={weight_sync}",
                "generation.max_new_tokens=8",
                "generation.max_context=512",
                "env.max_turns=2",
                f"steps={STEPS}",
                "tasks_per_step=4",
                "group_size=4",
                "eval_tasks=0",
                "reward.weights={sample_index: 1.0}",
                "optim.learning_rate=5e-3",
                f"logging.output_dir={out}",
                "logging.tensorboard=false",
            ],
        )
    )
    seconds = time.perf_counter() - started
    updated = [m["step"] for m in read_metrics(out) if "loss" in m]
    version = ServerControl(base_url).call("GET", "weight_info")["weight_version"]

    trained, tokenizer = load_model(str(out))
    start, _ = load_model("tiny")
    backend = OpenAIBackend(base_url, "tiny", tokenizer)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "go to the goal"}], tokenize=True, add_generation_prompt=True, return_dict=False
    )
    gens = backend.generate([prompt] * 4, SamplingParams(max_new_tokens=12, temperature=1.0, seed=1))
    to_trained = max(largest_gap(trained, prompt, g.token_ids, g.logprobs) for g in gens)
    to_start = max(largest_gap(start, prompt, g.token_ids, g.logprobs) for g in gens)
    sync = FileSync(ServerControl(base_url))
    pushed = time.perf_counter()
    sync.push(trained.state_dict(), STEPS)  # once more, timed: the trained weights again
    push_seconds = time.perf_counter() - pushed
    sync.close()
    checks = {
        "every step updated": updated == list(range(1, STEPS + 1)),
        "the server names the last version": version == str(STEPS),
        "the server samples from the trained weights": to_trained < 1e-3,
        "the trained weights differ from the start": to_start > 10 * max(to_trained, 1e-6),
    }
    result = {
        "weight_sync": weight_sync,
        "train_seconds": round(seconds, 1),
        "weight_version": version,
        "files_push_seconds": round(push_seconds, 3),
        "gap_to_trained": to_trained,
        "gap_to_start": to_start,
        "checks": checks,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--weight-sync", default="files", choices=["files", "nccl"])
    args = parser.parse_args()
    result = main(args.base_url, args.weight_sync)
    raise SystemExit(0 if all(result["checks"].values()) else 1)
