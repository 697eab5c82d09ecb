"""One ``accelerate launch`` of two CPU processes that runs many recipes in turn: the multi-process tests'
way to pay a launch's start-up (some 12 s) once."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from omrl.config import to_yaml

from .helpers import launch_two_processes

# Launched on every process: runs each job of a JSON list in turn (a recipe, then this process's final
# weights saved in the job's folder), so one launch's start-up (some 12 s) serves many runs. The reward
# "main_sample_index" is each sample's index on process 0 and 0 elsewhere, so only process 0 has
# preference pairs and non-zero advantages. A job with "uneven" has process 1 train on one episode
# fewer, so it has fewer micro-batches (when sharded: idle passes); one with "nan_call": N makes
# process 0's N-th micro-batch loss NaN.
RUN_JOBS = """
import json, os, sys, torch
from omrl.config import load_config
from omrl.hookspecs import hookimpl
from omrl.config.options import RmTrainRunConfig, SftRunConfig, TrainRunConfig
from omrl.plugins import load_plugins
import omrl.training.dpo as dpo
import omrl.training.rl as rl
import omrl.training.tree_batch as tree_batch
from omrl.training.dpo import DPORecipe
from omrl.training.rl import RLRecipe
from omrl.rm.train import RmRecipe
from omrl.training.sft import SftRecipe

RANK = os.environ["RANK"]

class MainSampleIndex:
    @hookimpl
    def register_rewards(self, register):
        register("main_sample_index", lambda episodes: [
            [0.0] * (len(ep.turns) - 1) + [float(ep.sample) if RANK == "0" else 0.0] for ep in episodes])

load_plugins().register(MainSampleIndex(), name="main-sample-index")
# the jobs share one process group: a group destroyed and made again on the launcher's store hangs
leave_group, torch.distributed.destroy_process_group = torch.distributed.destroy_process_group, lambda *a, **k: None
real_trainable, real_loss = tree_batch.trainable, rl.policy_gradient_loss

def one_fewer(episodes):
    return real_trainable(episodes)[1:]

def nan_at(call):
    calls = [0]
    def policy_gradient_loss(*args, **kwargs):
        calls[0] += 1
        loss, parts = real_loss(*args, **kwargs)
        return (loss * float("nan"), parts) if calls[0] == call else (loss, parts)
    return policy_gradient_loss

for job in json.loads(open(sys.argv[1]).read()):
    tree_batch.trainable = dpo.trainable = one_fewer if job["uneven"] and RANK == "1" else real_trainable
    rl.policy_gradient_loss = nan_at(job["nan_call"]) if job["nan_call"] and RANK == "0" else real_loss
    if job["kind"] == "train":
        cfg = load_config(TrainRunConfig, job["config"])
        recipe = (DPORecipe if cfg.algorithm.name == "dpo" else RLRecipe)(cfg)
    else:
        config_class, recipe_class = {"sft": (SftRunConfig, SftRecipe), "rm": (RmTrainRunConfig, RmRecipe)}[job["kind"]]
        recipe = recipe_class(load_config(config_class, job["config"]))
    try:
        recipe.setup()
        recipe.train()
        torch.save(recipe.strategy.state_dict(recipe.model), f"{job['out']}/rank{recipe.strategy.rank}.pt")
    finally:
        recipe.cleanup()
leave_group()
"""


@dataclasses.dataclass
class Job:
    """One run of a launch: ``kind`` "sft", "train" or "rm" (reward-model training), its config, and the folder its processes save
    their final weights in (``rank0.pt``, ``rank1.pt``)."""

    kind: str
    cfg: Any
    out: Path
    uneven: bool = False
    nan_call: int = 0


def run_jobs(cwd: Path, mode: str, jobs: list[Job]) -> list[dict[int, dict[str, torch.Tensor]]]:
    """Run ``jobs`` one after another in one two-process launch; each job's final weights, by process."""
    specs = []
    for job in jobs:
        job.out.mkdir(parents=True, exist_ok=True)
        config = job.out / f"{job.kind}.yaml"
        config.write_text(to_yaml(job.cfg))
        specs.append(
            {
                "kind": job.kind,
                "config": str(config),
                "out": str(job.out),
                "uneven": job.uneven,
                "nan_call": job.nan_call,
            }
        )
    listing = cwd / f"jobs-{mode}-{len(list(cwd.glob('jobs-*.json')))}.json"
    listing.write_text(json.dumps(specs))
    (cwd / "run_jobs.py").write_text(RUN_JOBS)
    done = launch_two_processes(cwd, str(cwd / "run_jobs.py"), str(listing), mode=mode)
    assert done.returncode == 0, launch_failure(done.stderr)
    return [{rank: torch.load(job.out / f"rank{rank}.pt") for rank in (0, 1)} for job in jobs]


def launch_failure(stderr: str) -> str:
    """What a failed launch said: every line of the whole stderr that names an error, a fatal signal or a
    traceback (one process's own message may sit far above the other's lost-peer tail), then the tail."""
    marks = ("Error", "error:", "Traceback", "Fatal", "Abort", "SIG", "terminate called", "what():")
    flagged = [line for line in stderr.splitlines() if any(mark in line for mark in marks)]
    return "\n".join(["flagged lines:", *flagged[:200], "tail:", stderr[-4000:]])
