"""Train against a running vLLM server and check that it samples from the trained weights.

    VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model ~/.cache/omrl/models/tiny \\
        --served-model-name tiny --port 8011 --dtype float32 --enforce-eager
    python scripts/check_vllm_server.py --base-url http://127.0.0.1:8011/v1 [--weight-sync files|nccl]

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server \\
        --model ~/.cache/omrl/models/tiny --served-model-name tiny --port 8012 --dtype float32 --enforce-eager \\
        --enable-lora --max-lora-rank 8 --max-loras 2
    python scripts/check_vllm_server.py --base-url http://127.0.0.1:8012/v1 --weight-sync lora

With ``--weight-sync lora`` the run trains LoRA adapters (model.lora_rank=4) and sends the server
only the adapter after each update; the sampler check (``mismatch_kl_k3``) stops a run whose server
samples from another adapter than the trainer's. Then an adapter of known weights is pushed, and the
server's log-probs must be that peft model's; the adapter push and (where the server has vLLM's RL
routes too) a full push of the same model are timed.

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
from omrl.backends.lora_sync import LoraSync, lora_config_of
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


def check_lora(base_url: str) -> tuple[dict, dict]:
    """Push an adapter of known weights; the server's log-probs must be that LoRA model's. Times the
    adapter push against a full push of the same model (where the server takes one)."""
    from peft import LoraConfig, get_peft_model

    base, tokenizer = load_model("tiny")
    torch.manual_seed(0)
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_" in name:
                p.copy_(0.3 * torch.randn_like(p))
    sync = LoraSync(ServerControl(base_url), "tiny", keep=1)
    backend = OpenAIBackend(base_url, "tiny", tokenizer, weight_sync=sync)
    pushed = time.perf_counter()
    backend.update_weights(lora.state_dict(), version=1000, lora_config=lora_config_of(lora))
    adapter_seconds = time.perf_counter() - pushed
    adapter_bytes = sync.bytes_sent
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "go to the goal"}], tokenize=True, add_generation_prompt=True, return_dict=False
    )
    gens = backend.generate([prompt] * 4, SamplingParams(max_new_tokens=12, temperature=1.0, seed=1))
    lora.eval()
    to_adapter = max(largest_gap(lora, prompt, g.token_ids, g.logprobs) for g in gens)
    with lora.disable_adapter():
        to_base = max(largest_gap(lora, prompt, g.token_ids, g.logprobs) for g in gens)
    backend.close()
    measured = {
        "adapter_push_seconds": round(adapter_seconds, 3),
        "adapter_bytes": adapter_bytes,
        "gap_to_adapter": to_adapter,
        "gap_to_base": to_base,
    }
    full = FileSync(ServerControl(base_url))
    merged = lora.merge_and_unload().state_dict()
    try:
        pushed = time.perf_counter()
        full.push(merged, 1001)
        measured["full_push_seconds"] = round(time.perf_counter() - pushed, 3)
        measured["full_bytes"] = sum(f.stat().st_size for f in full.root.rglob("*.safetensors"))
    except Exception as exc:  # a server without VLLM_SERVER_DEV_MODE=1: no full push to compare with
        measured["full_push_error"] = str(exc)[:300]
    finally:
        full.close()
    checks = {
        "the server samples from the pushed adapter": to_adapter < 1e-3,
        "the adapter changed the served model": to_base > 10 * max(to_adapter, 1e-6),
    }
    return measured, checks


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
                f"model.lora_rank={4 if weight_sync == 'lora' else 0}",
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
    records = read_metrics(out)
    updated = [m["step"] for m in records if "loss" in m]
    if weight_sync == "lora":
        measured, checks = check_lora(base_url)
        checks["every step updated"] = updated == list(range(1, STEPS + 1))
        kl = [m.get("mismatch_kl_k3") for m in records if "loss" in m]
        checks["the sampler's log-probs are the trainer's"] = all(k is not None and k < 1e-3 for k in kl)
        k1 = [m.get("mismatch_kl_k1") for m in records if "loss" in m]
        result = {"weight_sync": "lora", "train_seconds": round(seconds, 1), "mismatch_kl_k3": kl, "mismatch_kl_k1": k1}
        result.update(measured)
        result["checks"] = checks
        print(json.dumps(result))
        return result
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
    parser.add_argument("--weight-sync", default="files", choices=["files", "nccl", "lora"])
    args = parser.parse_args()
    result = main(args.base_url, args.weight_sync)
    raise SystemExit(0 if all(result["checks"].values()) else 1)
