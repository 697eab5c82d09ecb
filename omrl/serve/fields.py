"""How the env server reads a request: the env's id (``id`` or ``env_idx``, in a body or a query), the task
a body names (any of :data:`TASK_FIELDS`) and the other fields a route needs.

A field that is missing, twice or of the wrong type raises :class:`~omrl.serve.store.Rejected` (422) with a
message that names the field and never echoes the body.
"""

from __future__ import annotations

from typing import Any, Sequence

from omrl.serve.store import Rejected

ID_FIELDS = ("id", "env_idx")
#: the reset fields that name the task, as AgentGym's clients send them (and omrl's ``task_id``)
TASK_FIELDS = ("data_idx", "game", "seed", "item_id", "session_id", "task_id")


#: what a JSON value of each Python type is called in an answer
JSON_KINDS = {int: "an integer", str: "a string", float: "a number", bool: "true or false", list: "a list",
              dict: "an object", type(None): "null"}  # fmt: skip


def body_field(body: dict[str, Any], key: str, kind: type = int) -> Any:
    """The value of ``key`` in a request's body, of type ``kind`` (a bool is no int)."""
    value = body.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        got = "nothing" if key not in body else JSON_KINDS.get(type(value), type(value).__name__)  # not the body
        raise Rejected(422, f"the body needs {key!r} ({JSON_KINDS.get(kind, kind.__name__)}), got {got}")
    return value


def env_id_of(body: dict[str, Any]) -> int:
    """The env id a body names, as ``id`` or ``env_idx``."""
    named = [k for k in ID_FIELDS if k in body]
    if len(named) != 1:
        got = "both" if named else "neither"
        raise Rejected(422, f"the body needs the env's id as 'id' or 'env_idx' (an integer), got {got}")
    return body_field(body, named[0])


def task_id_of(body: dict[str, Any]) -> int | None:
    """The task a body names with one of TASK_FIELDS, or None when it names none."""
    named = [k for k in TASK_FIELDS if k in body]
    if len(named) > 1:
        raise Rejected(422, f"the body names the task twice ({', '.join(named)}); send one of {', '.join(TASK_FIELDS)}")
    return body_field(body, named[0]) if named else None


def query_id(id: int | None, env_idx: int | None) -> int:
    """The env id a query names, as ``?id=`` or ``?env_idx=`` (one of them)."""
    if (id is None) == (env_idx is None):
        got = "both" if id is not None else "neither"
        raise Rejected(422, f"malformed request: query.id: give the env's id as ?id=N or ?env_idx=N (got {got})")
    return id if id is not None else env_idx


def validation_message(errors: Sequence[Any]) -> str:
    """What failed validation, without the input: a large bad body must not come back in the answer."""
    parts = []
    for error in errors[:3]:
        where = ".".join(str(p) for p in error.get("loc", ()))[:80]
        parts.append(f"{where}: {str(error.get('msg', 'invalid'))[:120]}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "malformed request: " + "; ".join(parts) + more
