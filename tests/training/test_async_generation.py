"""`rollout.async_generation`: a generation process plays ahead of the trainer by an exact number of weight
versions; with none it plays what the synchronous run plays, a stopped run resumes exactly, and a
failure of that process stops the run with a clear error."""

from __future__ import annotations

import copy
import io
import json
import os
import queue
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from rich.console import Console

from omrl.backends import SamplingParams
from omrl.backends.hf import HFBackend
from omrl.data.trajectory import read_episodes
from omrl.errors import ConfigError, OmrlError
from omrl.hookspecs import hookimpl
from omrl.models import load_model
from omrl.training import async_generation
from omrl.training.metrics import read_metrics
from omrl.training.rl import run_rl
from omrl_plugins.envs.gridworld import GridWorld
from tests.fakes import Registers
from tests.training.helpers import stop_then_resume
from tests.training.test_tool_failures import AnyReply

QUIET = Console(file=io.StringIO())
ASYNC_ONLY = ("weights_lag", "weights_lag_max", "generation_wait_s")


@pytest.fixture
def config(sample_index_configs):
    # its reward is a run-time plugin: the generation process must register it too
    return sample_index_configs("steps=3", "rollout.generation_threads=1")


def numbers(out) -> list[dict]:
    """The run's logged numbers, less times, speeds, memory and the async-only keys."""
    return [
        {
            k: v
            for k, v in r.items()
            if not (k.endswith("_per_s") or "time" in k or k.startswith("peak_") or k in ASYNC_ONLY)
        }
        for r in read_metrics(out)
    ]


def same_weights(a: str, b: str) -> bool:
    first, _ = load_model(a)
    second, _ = load_model(b)
    return all(torch.equal(p, q) for p, q in zip(first.state_dict().values(), second.state_dict().values()))


@pytest.mark.slow  # a generation process beside the trainer
def test_no_staleness_plays_exactly_what_the_synchronous_run_plays(config):
    sync = config(out="sync")
    ahead = config("rollout.async_generation=true", "rollout.max_staleness=0", out="async0")
    run_rl(sync, console=QUIET)
    run_rl(ahead, console=QUIET)
    assert numbers(sync.logging.output_dir) == numbers(ahead.logging.output_dir)
    assert [r["weights_lag"] for r in read_metrics(ahead.logging.output_dir)] == [0.0, 0.0, 0.0]
    assert same_weights(sync.logging.output_dir, ahead.logging.output_dir)


@pytest.mark.slow  # a generation process beside the trainer
def test_each_step_plays_with_the_weights_max_staleness_behind_and_says_so(config):
    cfg = config("rollout.async_generation=true", "rollout.max_staleness=1")
    run_rl(cfg, console=QUIET)
    records = read_metrics(cfg.logging.output_dir)
    assert [r["weights_lag"] for r in records] == [r["weights_lag_max"] for r in records] == [0.0, 1.0, 1.0]
    assert all(not r.get("skipped_updates") for r in records) and all("rollout_weight_mean" in r for r in records)
    for step in (1, 2, 3):  # step k (1-based) plays with the weights after max(0, k - 2) updates
        episodes = read_episodes(Path(cfg.logging.output_dir) / "rollouts" / f"step-{step:08d}.parquet")
        versions = {turn.info["weights_version"] for ep in episodes for turn in ep.turns}
        assert versions == {max(0, step - 2)}, step
    # the sampler's log-probs are a version behind the trainer's from step 2 on: a real gap, measured
    assert records[0]["mismatch_kl_k3"] < 1e-8 < records[1]["mismatch_kl_k3"]


@pytest.mark.slow  # a generation process beside the trainer
def test_a_stopped_run_resumes_to_the_same_numbers_and_weights(config):
    settings = ("rollout.async_generation=true", "rollout.max_staleness=1", "steps=4", "logging.save_steps=1")
    full = config(*settings, out="full")
    run_rl(full, console=QUIET)
    stopped = config(*settings, out="stopped")
    stop_then_resume(stopped, console=QUIET)
    assert numbers(stopped.logging.output_dir) == numbers(full.logging.output_dir)
    assert same_weights(full.logging.output_dir, stopped.logging.output_dir)


def test_a_generation_process_that_dies_stops_the_run_naming_it(config, monkeypatch):
    take = async_generation.GenerationProcess.take

    def killed_first(self, step):
        self.process.kill()
        self.process.join()
        return take(self, step)

    monkeypatch.setattr(async_generation.GenerationProcess, "take", killed_first)
    with pytest.raises(OmrlError, match="generation process stopped .*exit code -9.*--resume"):
        run_rl(config("rollout.async_generation=true"), console=QUIET)


class BrokenReward:
    """A reward plugin that raises: it runs in the generation process, where the episodes are scored."""

    @hookimpl
    def register_rewards(self, register):
        def broken(episodes):
            """Raises."""
            raise RuntimeError("the scoring service answered 503")

        register("broken", broken)


class CountedGridWorld(GridWorld):
    """gridworld that writes "open" and "close" lines, with its process id, to $CLOSED_LOG."""

    def __init__(self, **options):
        super().__init__(**options)
        self._note("open")

    def close(self):
        self._note("close")
        super().close()

    def _note(self, event):
        with open(os.environ["CLOSED_LOG"], "a") as log:
            log.write(f"{event} {os.getpid()}\n")


@pytest.mark.slow  # a generation process beside the trainer
def test_a_failure_inside_the_generation_process_is_reported_with_its_reason(
    config, register_plugin, monkeypatch, tmp_path
):
    """...and the envs it opened are closed (a served env or a sandbox holds a slot until then); its
    heartbeat has its own file, so neither process's heartbeat can hide that the other is stuck."""
    register_plugin(BrokenReward(), name="broken-reward")
    register_plugin(Registers({"counted-gridworld": CountedGridWorld}), name="counted-gridworld")
    monkeypatch.setenv("CLOSED_LOG", str(tmp_path / "envs.log"))
    cfg = config(
        "rollout.async_generation=true",
        "reward.weights={broken: 1.0}",
        "env.name=counted-gridworld",
        "deadlines.heartbeat_s=0.05",  # beats while the first step plays
    )
    with pytest.raises(OmrlError, match="generation process failed: .*the scoring service answered 503"):
        run_rl(cfg, console=QUIET)
    events = Counter(line.split()[0] for line in (tmp_path / "envs.log").read_text().splitlines())
    assert events["open"] > 0 and events["close"] == events["open"], events
    run = Path(cfg.logging.output_dir)
    assert "generate" in json.loads((run / async_generation.GENERATION_HEARTBEAT_FILE).read_text())["stages"]
    assert "generate" not in json.loads((run / "heartbeat.json").read_text())["stages"]


@pytest.mark.parametrize(
    "setting, named",
    [
        ("generation.backend=openai", "generation.backend=openai .valid: hf, vllm"),
        ("model.lora_rank=4", "model.lora_rank=4"),
    ],
)
def test_what_the_generation_process_cannot_do_is_refused_before_it_starts(config, setting, named):
    with pytest.raises(ConfigError, match=f"async_generation=true.*{named}"):
        run_rl(config("rollout.async_generation=true", setting), console=QUIET)


def test_partial_rollouts_load_the_newest_weights_between_turns(tiny_model_dir):
    """The generation process's side: a version that arrives between two generate calls is loaded
    before the second, which it samples (its log-probs are the new model's) and is stamped with; a
    step request read on the way is kept for later."""
    model, tokenizer = load_model(tiny_model_dir)
    backend = HFBackend(model, tokenizer)
    requests: queue.Queue = queue.Queue()
    versions = async_generation.Versions(backend, 0, requests)
    versions.newest_at_every_turn()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "go"}], tokenize=True, add_generation_prompt=True, return_dict=False
    )
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=0)
    (first,) = backend.generate([prompt], params)
    assert first.weights_version == 0
    other = copy.deepcopy(model)  # perturbed as parameters, so tied weights stay tied
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    newer = other.state_dict()
    requests.put(("weights", 1, newer))
    requests.put(("play", 2, [0], 7, 1))
    (second,) = backend.generate([prompt], params)
    assert second.weights_version == 1 and versions.version == 1 and not versions.held
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in newer.items())
    with torch.no_grad():
        logits = model(torch.tensor([prompt + second.token_ids])).logits[0, len(prompt) - 1 : -1]
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(second.token_ids)[:, None]).squeeze(1)
    assert second.logprobs == pytest.approx(expected.tolist(), abs=1e-4)
    assert versions.next_request() == ("play", 2, [0], 7, 1)  # not lost while reading weights


class SlowGridWorld(GridWorld):
    """gridworld whose every step takes STEP_SECONDS: a turn of a step's 6 episodes takes 6 s."""

    def step(self, action):
        time.sleep(STEP_SECONDS)
        return super().step(action)


STEP_SECONDS = 1.0
SEND_DELAY = 1.5  # the trainer sends each version this late: after a step's first turn, before its second


@pytest.mark.slow
def test_partial_rollouts_continue_episodes_under_each_new_version(config, register_plugin, monkeypatch):
    register_plugin(Registers({"slow-gridworld": SlowGridWorld}, {"any_reply": AnyReply}), name="slow-gridworld")
    send = async_generation.GenerationProcess.publish

    def late(generation, version, weights):
        time.sleep(SEND_DELAY)
        send(generation, version, weights)

    monkeypatch.setattr(async_generation.GenerationProcess, "publish", late)
    cfg = config(
        "env.name=slow-gridworld",
        "env.template=any_reply",  # every reply steps the env: the tiny model's rarely parse otherwise
        "env.max_turns=3",
        "rollout.async_generation=true",
        "rollout.max_staleness=1",
        "rollout.partial_rollouts=true",
    )
    run_rl(cfg, console=QUIET)
    records = read_metrics(cfg.logging.output_dir)
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]
    played = {}
    for step in (1, 2, 3):
        episodes = read_episodes(Path(cfg.logging.output_dir) / "rollouts" / f"step-{step:08d}.parquet")
        played[step] = [[turn.info["weights_version"] for turn in ep.turns] for ep in episodes]
    # step 1 plays with the first weights; steps 2 and 3 start under one version, and the next one
    # (the trainer's update of the step before) arrives during their first turn's env steps: every
    # episode goes on under it, its first turn kept (here from its second turn; a loaded machine may
    # land it a turn later)
    assert played[1] == [[0, 0, 0]] * 6
    for step in (2, 3):
        for versions in played[step]:
            assert versions == sorted(versions) and versions[0] == step - 2 and versions[-1] == step - 1, versions
    assert [r["weights_lag_max"] for r in records] == [0.0, 1.0, 1.0]
    assert all(0 < r["weights_lag"] < 1 for r in records[1:])


def test_partial_rollouts_need_the_generation_process(config):
    with pytest.raises(ConfigError, match="partial_rollouts=true .*rollout.async_generation=true"):
        run_rl(config("rollout.partial_rollouts=true"), console=QUIET)


TRAINER = """
import pickle, sys, time
from pathlib import Path
from omrl.models import load_model
from omrl.training.async_generation import GENERATION_HEARTBEAT_FILE, GenerationProcess

if __name__ == "__main__":  # spawn runs this file again in the generation process
    cfg = pickle.load(open(sys.argv[1], "rb"))
    Path(cfg.logging.output_dir).mkdir(parents=True)  # as a run's setup makes it
    model, _ = load_model(cfg.model.name)
    generation = GenerationProcess(cfg, model.state_dict(), 0)
    beat = Path(cfg.logging.output_dir) / GENERATION_HEARTBEAT_FILE
    deadline = time.monotonic() + 300
    while not beat.exists() and time.monotonic() < deadline:  # up, waiting for its first request
        time.sleep(0.2)
    if int(sys.argv[2]):  # a step played ahead: its episodes wait in the pipe, more than it holds
        generation.request(0, list(range(int(sys.argv[2]))), 0)
        while generation.results.empty() and time.monotonic() < deadline:
            time.sleep(0.2)
    if int(sys.argv[3]):  # a step being played when the trainer dies: it takes minutes
        generation.request(0, list(range(int(sys.argv[3]))), 0)
        time.sleep(2)
    print(generation.process.pid, flush=True)
    time.sleep(600)
"""


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as stat:  # a zombie no one reaps is gone too
            if stat.read().split(")")[-1].split()[0] == "Z":
                return True
        time.sleep(0.5)
    return False


@pytest.mark.slow  # a trainer process and its generation process
@pytest.mark.parametrize("ahead, playing", [(0, 0), (48, 0), (0, 2000)])
def test_a_generation_process_ends_when_its_trainer_is_killed(config, tmp_path, ahead, playing):
    """SIGKILL (the out-of-memory killer) gives the trainer no chance to stop it: it notices and ends, idle,
    with a step played ahead whose episodes no one will read (its queue's writer must not wait for that), or
    in the middle of a step (which would have played on for minutes, an orphan holding the model)."""
    import pickle
    import signal
    import subprocess
    import sys

    # its first beat says it is up; the goal reward: the trainer script registers no run-time plugin
    cfg = config("rollout.async_generation=true", "deadlines.heartbeat_s=1", "reward.weights={goal: 1.0}")
    (tmp_path / "cfg.pkl").write_bytes(pickle.dumps(cfg))
    (tmp_path / "trainer.py").write_text(TRAINER)
    trainer = subprocess.Popen(
        [sys.executable, str(tmp_path / "trainer.py"), str(tmp_path / "cfg.pkl"), str(ahead), str(playing)],
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "trainer.err").open("w"),
        text=True,
    )
    child = int(trainer.stdout.readline())
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    try:
        assert _gone(child, within=120), "the generation process outlived its trainer"
        if playing:  # it closed its envs and ended, reporting nothing: no "error" for a trainer that is gone
            assert "Traceback" not in (tmp_path / "trainer.err").read_text()
    finally:
        if not _gone(child, within=0.1):
            os.kill(child, signal.SIGKILL)


@pytest.mark.slow  # a generation process beside the test
def test_closing_a_stopped_generation_process_kills_it(config):
    """A process that is stopped (or stuck) ignores SIGTERM: close kills it, or the run would wait for it at exit."""
    import signal

    cfg = config("rollout.async_generation=true")
    model, _ = load_model(cfg.model.name)
    generation = async_generation.GenerationProcess(cfg, model.state_dict(), 0)
    os.kill(generation.process.pid, signal.SIGSTOP)
    generation.close()
    assert not generation.process.is_alive() and generation.process.exitcode == -signal.SIGKILL
