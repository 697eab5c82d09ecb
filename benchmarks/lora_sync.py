"""LoRA adapter push vs full-weight push into a running `vllm serve` (generation.weight_sync).

    python benchmarks/lora_sync.py [--models tiny smollm2-135m] [--pushes 5] [--rank 8] [--json out.json]

Needs vllm in this venv (on a CPU machine: the venv scripts/check_vllm_cpu.sh makes). For each model
it starts `vllm serve` with LoRA enabled, runtime adapter loading allowed and vLLM's RL routes,
then times ``--pushes`` updates each way, one after the other on the same server:

- ``lora``: the adapter of a peft LoRA model (rank ``--rank`` on q/k/v/o) written in peft's format
  and loaded under a new name (:class:`omrl.backends.lora_sync.LoraSync`);
- ``files``: the same model's full weights (the LoRA merged in) written as one safetensors file the
  server reloads in place (:class:`omrl.backends.weight_sync.FileSync`).

A push is counted from the trainer's state dict to the server answering that it serves the new
weights. After the last adapter push the server's log-probs of fresh samples are compared with the
peft model's (``gap_to_adapter``, should be ~1e-5). Writes ``benchmarks/results/lora_sync.json``
unless ``--json``, with the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import httpx
import torch
from _results import default_json, machine, save_json

from omrl.backends import SamplingParams
from omrl.backends.lora_sync import LoraSync, lora_config_of
from omrl.backends.openai import OpenAIBackend
from omrl.backends.weight_sync import FileSync, ServerControl
from omrl.models import load_model, resolve_model_path

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


@contextlib.contextmanager
def vllm_server(model_dir: str, name: str, rank: int, log: Path) -> Iterator[str]:
    """`vllm serve` of ``model_dir`` as ``name``, with LoRA and the RL routes; yields its base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_SERVER_DEV_MODE": "1"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
        "--served-model-name", name, "--port", str(port), "--dtype", "float32", "--max-model-len", "512",
        "--enforce-eager", "--enable-lora", "--max-lora-rank", str(rank), "--max-loras", "2",
    ]  # fmt: skip
    with open(log, "w") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            if server.poll() is not None:
                raise RuntimeError(f"vllm serve exited ({server.returncode}); see {log}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            time.sleep(1)
        else:
            raise RuntimeError(f"vllm serve did not start in 600 s; see {log}")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.terminate()
        server.wait(timeout=60)


def lora_model(name: str, rank: int):
    """A peft LoRA model of ``name`` whose adapter is not zero (peft starts lora_B at zero)."""
    from peft import LoraConfig, get_peft_model

    base, tokenizer = load_model(name)
    torch.manual_seed(0)
    model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS))
    with torch.no_grad():
        for param_name, p in model.named_parameters():
            if "lora_B" in param_name:
                p.normal_(0.0, 0.02)
    return model.eval(), tokenizer


def jitter(model) -> None:
    """A stand-in for an update between pushes."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn_like(p), alpha=1e-3)


def measure(name: str, pushes: int, rank: int, logs: Path) -> dict:
    model, tokenizer = lora_model(name, rank)
    config = lora_config_of(model)
    started = time.perf_counter()
    with vllm_server(resolve_model_path(name), name, rank, logs / f"vllm-{name}.log") as base_url:
        server_start = time.perf_counter() - started
        sync = LoraSync(ServerControl(base_url), name, keep=1)
        backend = OpenAIBackend(base_url, name, tokenizer, weight_sync=sync)
        adapter_seconds = []
        for version in range(pushes):
            jitter(model)
            pushed = time.perf_counter()
            backend.update_weights(model.state_dict(), version=version, lora_config=config)
            adapter_seconds.append(time.perf_counter() - pushed)
        adapter_bytes = sync.bytes_sent
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is the capital of France?"}],
            tokenize=True,
            add_generation_prompt=True,
            return_dict=False,
        )
        gens = backend.generate([prompt] * 2, SamplingParams(max_new_tokens=8, temperature=1.0, seed=0))
        gap = max(largest_gap(model, prompt, g.token_ids, g.logprobs) for g in gens)
        backend.close()

        full = FileSync(ServerControl(base_url))
        merged = model.merge_and_unload()
        full_seconds = []
        for version in range(pushes):
            pushed = time.perf_counter()
            full.push(merged.state_dict(), pushes + version)
            full_seconds.append(time.perf_counter() - pushed)
        full_bytes = sum(f.stat().st_size for f in full.root.rglob("*.safetensors"))
        full.close()
    adapter, whole = statistics.median(adapter_seconds), statistics.median(full_seconds)
    record = {
        "model": name,
        "parameters": sum(p.numel() for p in merged.parameters()),
        "lora_rank": rank,
        "lora_targets": TARGETS,
        "pushes": pushes,
        "server_start_seconds": round(server_start, 1),
        "adapter_push_seconds_median": round(adapter, 4),
        "adapter_push_seconds": [round(s, 4) for s in adapter_seconds],
        "adapter_bytes": adapter_bytes,
        "full_push_seconds_median": round(whole, 4),
        "full_push_seconds": [round(s, 4) for s in full_seconds],
        "full_bytes": full_bytes,
        "bytes_ratio": round(full_bytes / adapter_bytes, 1),
        "seconds_ratio": round(whole / adapter, 2),
        "gap_to_adapter": gap,
    }
    print(record, flush=True)
    return record


def largest_gap(model, prompt: list[int], ids: list[int], logprobs: list[float]) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    own = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None]).squeeze(1)
    return (own - torch.tensor(logprobs)).abs().max().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"])
    parser.add_argument("--pushes", type=int, default=5)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--json", default=str(default_json("lora_sync")))
    args = parser.parse_args()
    import vllm

    logs = Path(tempfile.mkdtemp(prefix="omrl-lora-bench-"))
    record = {
        "benchmark": "lora_sync",
        "vllm": vllm.__version__,
        "machine": machine(torch.get_num_threads()),
        "results": [measure(name, args.pushes, args.rank, logs) for name in args.models],
    }
    save_json(args.json, record)
    print(f"wrote {args.json}")


if __name__ == "__main__":  # vllm serve runs in a subprocess; keep the guard all the same
    main()
