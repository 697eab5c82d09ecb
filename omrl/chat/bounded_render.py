"""Renders a chat template's probe chats in a process of its own, under an address-space limit, for
:func:`omrl.chat.template_check.check_render_bounds` (run as a script: it imports transformers' jinja
renderer and nothing of omrl, so it starts in about a second).

It reads a job from stdin (``template``, ``specials``, ``kwargs``, ``chats``, ``tools``, ``memory``,
``max_chars``) and prints one JSON line: ``{"problem": ""}`` when every chat rendered within the bounds
(or the template refused it: the other checks report that), else ``{"problem": "memory"}`` or
``{"problem": "size", "chars": N}``. The parent bounds its time.
"""

from __future__ import annotations

import json
import resource
import sys


def main() -> int:
    job = json.load(sys.stdin)
    from transformers.utils.chat_template_utils import render_jinja_template

    _limit_memory(job["memory"])  # after the import: what is bounded is the template's own work
    try:
        for chat, with_tools in job["chats"]:
            kwargs = {**job["specials"], **job["kwargs"]}
            try:
                texts, _ = render_jinja_template(
                    conversations=[chat],
                    tools=job["tools"] if with_tools else None,
                    chat_template=job["template"],
                    add_generation_prompt=True,
                    **kwargs,
                )
            except MemoryError:  # text built past the cap
                raise
            except Exception:  # noqa: BLE001 - a template that refuses this chat: the other checks say so
                continue
            if len(texts[0]) > job["max_chars"]:
                return _say("size", chars=len(texts[0]))
    except MemoryError:
        return _say("memory")
    return _say("")


def _limit_memory(extra: int) -> None:
    """Cap the address space at what the process holds now plus ``extra`` bytes (where Linux's /proc
    says what it holds; elsewhere only the time is bounded)."""
    try:
        with open("/proc/self/status") as status:
            size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = size + extra if hard == resource.RLIM_INFINITY else min(size + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def _say(problem: str, **more: int) -> int:
    print(json.dumps({"problem": problem, **more}), flush=True)
    return 0 if not problem else 3


if __name__ == "__main__":
    sys.exit(main())
