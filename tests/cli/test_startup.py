"""Commands that only read configs, plugins or files start without importing torch.

Importing torch (and transformers) takes seconds; `omrl --help` should not wait for it.
Each command runs in a fresh interpreter so that nothing the test process imported counts.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
from omrl.cli import main
try:
    main(json.loads(sys.argv[1]))
except SystemExit as stop:
    code = stop.code
else:
    code = 0
print(json.dumps({"code": code, "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules}))
"""


def imports_of(*argv: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(list(argv))], capture_output=True, text=True, timeout=120
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def conversations_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "sft.jsonl"
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "Act: left"}]
    path.write_text(json.dumps({"messages": messages}) + "\n")
    return path


def more(*argv: str):
    """A command the full tier checks too: each fresh interpreter takes ~2 CPU-s, the fast tier keeps one of each group."""
    return pytest.param(list(argv), marks=pytest.mark.slow, id=" ".join(argv))


@pytest.mark.parametrize(
    "argv",
    [
        more("--version"),
        ["--help"],
        more("train", "--help"),
        more("config", "list"),
        ["config", "show", "dpo"],  # grpo and ppo: their show runs the algorithms on a probe batch, in torch
        more("config", "keys", "train"),
        ["env", "list"],
        more("view", "--help"),
        more("plugins"),  # the algorithms are registered by import path: listed from their docstrings
        ["plugins", "--kind", "policy_loss"],
    ],
    ids=" ".join,
)
def test_a_command_that_needs_no_model_does_not_import_torch(argv):
    assert imports_of(*argv) == {"code": 0, "torch": False, "transformers": False}


def test_data_show_reads_a_dataset_without_torch(conversations_file):
    assert imports_of("data", "show", str(conversations_file)) == {"code": 0, "torch": False, "transformers": False}


@pytest.mark.slow  # a fresh interpreter imports deepspeed and torch
def test_a_run_on_a_machine_without_a_gpu_prints_no_third_party_accelerator_line(tmp_path):
    """DeepSpeed (installed with the dev extra) logs "Setting accelerator to CPU" when imported on such a
    machine; omrl tells it the accelerator first."""
    probe = "from omrl.cli import quiet_third_parties; quiet_third_parties(); import deepspeed"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "real_accelerator" not in done.stderr + done.stdout
