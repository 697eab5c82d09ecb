"""A tool server that dies under some episodes (issue 37): those episodes end as env_error, are counted,
left out of their group's baseline and never trained on; the rest of each group trains as a smaller group."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from omrl.data.trajectory import read_episodes
from omrl.envs import EnvError
from omrl.hookspecs import hookimpl
from omrl.templates import ParsedAction
from omrl.training.metrics import read_metrics
from omrl.training.rl import run_rl
from omrl_plugins.envs.gridworld import GridWorld
from tests.fakes import ActionTemplate
from tests.training.helpers import EnvPlugin, SampleIndexReward, gridworld_config


class ServerDiesEnv(GridWorld):
    """Gridworld whose tool server dies in one episode of four, at that episode's first step."""

    resets = 0

    def reset(self, task_id):
        ServerDiesEnv.resets += 1
        self.doomed = ServerDiesEnv.resets % 4 == 1
        return super().reset(task_id)

    def step(self, action):
        if self.doomed:
            raise EnvError("the tool server died: connection reset by peer")
        return super().step(action)


class AnyReply(ActionTemplate):
    """Every reply is an action (the tiny model's replies rarely parse otherwise), so every episode steps."""

    def parse(self, response, env):
        return ParsedAction(response.strip() or "up", True)


class AnyReplyPlugin:
    @hookimpl
    def register_templates(self, register):
        register("any_reply", AnyReply)


def test_episodes_whose_tool_server_died_are_counted_and_left_out_of_their_groups(
    tiny_model_dir, tmp_path, register_plugin, monkeypatch
):
    monkeypatch.setattr(ServerDiesEnv, "resets", 0)
    register_plugin(EnvPlugin("server_dies", ServerDiesEnv), name="server-dies")
    register_plugin(SampleIndexReward(), name="sample-index")
    register_plugin(AnyReplyPlugin(), name="any-reply")
    cfg = gridworld_config(
        tiny_model_dir,
        tmp_path / "run",
        "env.name=server_dies",
        "env.template=any_reply",
        "steps=1",
        "group_size=4",
        "reward.weights={sample_index: 1.0}",
        "max_env_error_rate=0.5",
    )
    run_rl(cfg, console=Console(file=io.StringIO()))
    episodes = read_episodes(Path(cfg.logging.output_dir) / "rollouts" / "step-00000001.parquet")
    failed = [ep for ep in episodes if ep.end_reason == "env_error"]
    assert len(failed) == 2 and all("tool server died" in ep.error for ep in failed)
    assert all(ep.turns and any(ep.loss_mask) for ep in failed)  # they died mid-episode, after a model turn
    [record] = read_metrics(cfg.logging.output_dir)
    assert record["env_errors"] == 2 and record["env_error_rate"] == 0.25
    for group in {ep.group for ep in episodes}:
        members = [ep for ep in episodes if ep.group == group]
        trained = [ep for ep in members if ep.end_reason != "env_error"]
        assert len(trained) < len(members)  # each group lost a member
        for ep in members:
            assert bool(ep.advantages) == (ep.end_reason != "env_error")  # trained rows only
        first = [next(a for a, m in zip(ep.advantages, ep.loss_mask) if m) for ep in trained]
        # the baseline is the mean of the members that played: a failed member counted as reward 0
        # would pull it down and leave the others' advantages summing above zero
        assert abs(sum(first)) < 1e-4 and len(set(round(a, 4) for a in first)) == len(first)
