"""A training run across two machines with its rollouts from a generation server, as docs/parallel.md
lays it out: two ``accelerate launch`` commands (``--num_machines 2``, machine ranks 0 and 1, one
process each), here both on loopback, and a server speaking vLLM's RL routes that samples every
episode and gets the trained weights from machine 0 after each update."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omrl.models import load_model
from omrl.training.metrics import read_metrics
from tests.backends.fake_openai import FakeOpenAIServer
from tests.backends.test_weight_sync import UPDATE

ROOT = Path(__file__).resolve().parents[2]
STEPS = 2

# Launched on each machine: registers a reward whose samples differ (so every step updates), then trains.
TRAIN = """
import sys
from omrl.config import load_config
from omrl.config.options import TrainRunConfig
from omrl.plugins import load_plugins
from omrl.training.rl import run_rl
from tests.training.helpers import SampleIndexReward

load_plugins().register(SampleIndexReward(), name="sample-index")
run_rl(load_config(TrainRunConfig, "grpo", sys.argv[1:]))
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_two_machines_train_with_rollouts_from_a_server(tiny_model_dir, tmp_path):
    model, tokenizer = load_model(tiny_model_dir)
    from omrl.backends.hf import HFBackend

    server = FakeOpenAIServer(HFBackend(model, tokenizer), tokenizer).start()
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    out, port = tmp_path / "run", free_port()
    overrides = [
        f"model.name={tiny_model_dir}",
        "env.name=gridworld",
        "env.max_turns=2",
        "generation.backend=openai",
        f"generation.base_url={server.base_url}",
        "generation.weight_sync=files",
        f"generation.weight_dir={tmp_path / 'shared-weights'}",  # shared storage between machine 0 and the server
        "generation.max_new_tokens=8",
        "generation.max_context=512",
        f"steps={STEPS}",
        "tasks_per_step=2",
        "group_size=2",
        "eval_tasks=0",
        "reward.weights={sample_index: 1.0}",
        "optim.learning_rate=1e-3",
        "logging.tensorboard=false",
        f"logging.output_dir={out}",
    ]
    machines = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "accelerate.commands.launch",
                "--config_file",
                str(ROOT / "configs" / "accelerate" / "ddp.yaml"),
                "--num_machines=2",
                f"--machine_rank={rank}",
                "--main_process_ip=127.0.0.1",
                f"--main_process_port={port}",
                "--num_processes=2",  # in all: one a machine
                str(script),
                *overrides,
            ],
            cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        logs = [machine.communicate(timeout=600)[0] for machine in machines]
    finally:
        for machine in machines:
            machine.kill()
        server.stop()
    assert [m.returncode for m in machines] == [0, 0], "\n\n".join(log[-3000:] for log in logs)

    records = read_metrics(out)
    assert [r["step"] for r in records if "loss" in r] == list(range(1, STEPS + 1))
    # every turn of both machines' episodes (2 tasks x 2 samples a step, one task a machine) was
    # sampled by the server
    turns = sum(round(r["turns"] * 4) for r in records)
    assert sum(path == "/completions" for path, _ in server.requests) == turns
    # machine 0 alone sent the weights: the starting ones, then each update's, and the server ends
    # serving exactly what the run saved
    assert server.calls == UPDATE * (STEPS + 1) and server.weight_version == str(STEPS)
    saved, _ = load_model(str(out))
    served = server.backend.model.state_dict()
    assert all(torch.equal(served[name], tensor) for name, tensor in saved.state_dict().items())
