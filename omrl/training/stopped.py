"""What a run that stops early kept, and how to go on: an env that failed every episode of a step
(:class:`~omrl.errors.FailedStep`), a stage past its deadline (:class:`~omrl.supervisor.StageStalled`) or a
generation server that failed (:class:`~omrl.errors.EndpointError`).

The steps done are checkpointed first where the run stands where they left it (the stopped step's tasks
handed back: ``keepable``), so a stop costs the step it stopped in, not every step since the last
checkpoint; the message names the newest checkpoint and the ``--resume`` that continues from it. A stop in a
step's evaluation (:func:`keep_evaluated_step`) keeps that step too: its update was done.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omrl.errors import EndpointError, FailedStep
from omrl.supervisor import StageStalled
from omrl.training.checkpoint import latest_checkpoint, resume_command
from omrl.training.checkpoint_marker import checkpoint_step


def explained(recipe: Any, stop: Exception, command: str) -> Exception:
    """``stop`` with what was kept and how to go on (:func:`kept_steps`, :func:`stopped_by_stall`,
    :func:`server_failed`)."""
    if isinstance(stop, StageStalled):
        return stopped_by_stall(recipe, stop, command)
    if isinstance(stop, EndpointError):
        return server_failed(recipe, stop, command)
    return kept_steps(recipe, stop, command)  # type: ignore[arg-type]


def server_failed(recipe: Any, failure: EndpointError, command: str) -> EndpointError:
    """``failure`` with the newest checkpoint and how to go on once the generation server is back (its
    address may change on resume). The step it stopped in is not kept: its rollout was not finished."""
    kept = latest_checkpoint(recipe.cfg.logging.output_dir)
    if kept is None:
        return EndpointError(f"{failure}; no checkpoint was written before it: run again once the server is back")
    return EndpointError(
        f"{failure}; the newest checkpoint is {kept}: bring the generation server back (generation.base_url may "
        f"change), then {_resume(recipe, command)}"
    )


def _fix(health: Any) -> str | None:
    """What to fix where a step failed in its action template, an env plugin outside the protocol, a reward or
    the agent; None: the env (the world), which may come back."""
    template, reward, env = health.failed_template(), health.failed_reward(), health.failed_protocol()
    if template is not None:
        return f"fix the action template {template}"
    if env is not None:
        return f"fix the plugin of the env {env!r} (it answered outside omrl's env protocol)"
    if reward is not None:
        return f"fix the reward {reward!r} or bring back the service it calls (or give it longer: deadlines.reward_s)"
    return "fix the agent program or its reward function" if health.failed_agent() else None


def kept_steps(recipe: Any, failure: FailedStep, command: str) -> FailedStep:
    """``failure`` with what was kept and how to go on. When the reason is a reward (it stalled) or the
    action template (a bug), the message names it, not the env: bringing the env back would not help."""
    kept = _keep(recipe, failure.keepable)
    health = getattr(getattr(recipe, "run", None), "health", None)
    fix = _fix(health) if health is not None else None
    if fix is not None:  # not the env's failure: bringing it back would not help
        if kept is None:
            return FailedStep(f"{failure}; no step was done before it: nothing to resume, {fix} and run again")
        return FailedStep(f"{failure}; the newest checkpoint is {kept}: {fix}, then {_resume(recipe, command)}")
    # an exception from a third-party env's own code (the reason names its plugin and line) may be its bug
    bug = " (or fix the env's plugin: it raised in its own code, at the line named above)" if _in_plugin(health) else ""
    if kept is None:
        return FailedStep(
            f"{failure}; no step was done before it: nothing to resume, run again once the env is back{bug}"
        )
    return FailedStep(
        f"{failure}; the newest checkpoint is {kept}: bring the env back (is its server down or full?){bug}, then "
        f"{_resume(recipe, command)}"
    )


def _in_plugin(health: Any) -> bool:
    """Whether the last failed step's reason names a third-party plugin's line (:func:`omrl.plugins.plugin_site`)."""
    return health is not None and " (in plugin " in str(getattr(health, "failed_step", "") or "")


def stopped_by_stall(recipe: Any, stall: StageStalled, command: str) -> StageStalled:
    """``stall`` with what was kept and how to go on (``deadlines.*`` may be raised on resume). The steps
    done are checkpointed when the stall's step was handed back (``stall.keepable``, set by the rollout)."""
    kept = _keep(recipe, getattr(stall, "keepable", False) and stall.stage != "checkpoint")
    longer = f"deadlines.{stall.stage}_s" if stall.stage else "its deadline"
    if kept is None:
        return StageStalled(
            f"{stall}; no step was done before it: nothing to resume, run again (with a longer {longer} if "
            "it was too tight) in another output_dir, or delete this one first",
            stall.stage,
        )
    return StageStalled(
        f"{stall}; the newest checkpoint is {kept}: {_resume(recipe, command)} (a longer {longer}=... may be "
        "given there)",
        stall.stage,
    )


def _keep(recipe: Any, keepable: bool) -> Path | None:
    """The newest checkpoint, written now for the steps done when ``keepable`` and none holds them yet."""
    kept = latest_checkpoint(recipe.cfg.logging.output_dir)
    if keepable and recipe.step > (checkpoint_step(kept) if kept else 0):
        kept = recipe.save_checkpoint()
    return kept


def _resume(recipe: Any, command: str) -> str:
    return f"continue with {resume_command(command, recipe.cfg.logging.output_dir)}"


def keep_evaluated_step(recipe: Any, metrics: dict[str, Any]) -> None:
    """A step whose evaluation stopped (a stall, its env's failure, a Ctrl-C): its update is done, so its
    ``metrics`` are logged and it is checkpointed, and the stop costs the evaluation alone, not every step
    since the last checkpoint (with ``logging.save_steps=0``, the last step's evaluation held the whole run)."""
    recipe.logger.log(recipe.step, metrics)
    _keep(recipe, True)
