"""What omrl cannot play in a verifiers environment, one line each: environments that need a service (verifiers'
sandboxes, browsers, OpenEnv servers), rubrics or environments that call a model over the network
(``JudgeRubric``, an OpenAI or Anthropic client), group reward functions and rubric advantages (omrl scores each
episode on its own and estimates advantages itself)."""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

from omrl_plugins.envs.verifiers.rubric import rubrics_of

# verifiers' environment classes that need a service omrl does not run, by class name (matched in the MRO)
NEEDS_SERVICE = {
    "SandboxEnv": "Prime Intellect's sandbox service (prime-sandboxes and an API key)",
    "SandboxMixin": "Prime Intellect's sandbox service (prime-sandboxes and an API key)",
    "BrowserEnv": "a remote browser (Browserbase)",
    "OpenEnvEnv": "an OpenEnv server (omrl plays those itself: the openenv env)",
}


def refusals(env: Any) -> list[str]:
    """What omrl cannot honour in ``env`` (and the environments of an EnvGroup), one line each."""
    problems = []
    for klass in type(env).__mro__:
        if klass.__name__ in NEEDS_SERVICE and klass.__module__.startswith("verifiers."):
            problems.append(f"{type(env).__name__} needs {NEEDS_SERVICE[klass.__name__]}")
            break
    clients = _client_types()
    for name, value in vars(env).items():
        if isinstance(value, clients):
            problems.append(f"the environment holds {type(value).__name__} {name!r}: it calls a model over the network")
    for rubric in rubrics_of(env.rubric):
        if any(klass.__name__ == "JudgeRubric" for klass in type(rubric).__mro__):
            model = getattr(rubric, "judge_model", "?")
            problems.append(f"its rubric {type(rubric).__name__} asks a judge model ({model}) over the network")
        else:
            held = [name for name, value in rubric.class_objects.items() if isinstance(value, clients)]
            if held:
                problems.append(f"its rubric {type(rubric).__name__} holds a model client ({', '.join(held)})")
        group = [getattr(f, "__name__", repr(f)) for f in rubric.funcs if rubric._is_group_func(f)]
        if group:
            problems.append(
                f"its reward functions {', '.join(group)} score a group of rollouts together; omrl scores "
                "each episode on its own"
            )
    if env.provides_advantages:
        problems.append("its rubric computes advantages; omrl's algorithm estimates them")
    for child in getattr(env, "envs", None) or []:  # an EnvGroup
        problems += [f"{type(child).__name__}: {line}" for line in refusals(child)]
    return problems


def _client_types() -> tuple[type, ...]:
    types: list[type] = []
    for module, names in (("openai", ("OpenAI", "AsyncOpenAI")), ("anthropic", ("Anthropic", "AsyncAnthropic"))):
        with contextlib.suppress(ImportError):
            loaded = importlib.import_module(module)
            types += [getattr(loaded, name) for name in names if hasattr(loaded, name)]
    return tuple(types)
