"""What each version of the trajectory file's layout holds (its ``omrl.schema`` tag, ``episode/N``).

A version only adds to the one before: what version N added is read from an older file with its
default (:func:`omrl.data.trajectory.read_episodes`). What a file's own version wrote must all be
there. A file cut down after it was written (pyarrow's ``select`` and ``drop_columns`` keep the tag)
is refused by :func:`missing_columns`'s caller, since a default put in place of what was cut
(``won`` False, ``score`` 0, no turns) would be read as the data.
"""

from __future__ import annotations

import pyarrow as pa

_TURN_FIELDS = ("observation", "response", "action", "format_ok", "reward", "done", "info", "span", "parse_error")

# what each version added: a column, or "column.field" for a field of each turn or message
ADDED: dict[int, tuple[str, ...]] = {
    1: (
        *("env", "task_id", "split", "instruction", "turns", "token_ids", "loss_mask", "logprobs"),
        *("prompt_length", "won", "score", "end_reason", "group", "sample", "rewards", "messages", "error"),
        *(f"turns.{name}" for name in _TURN_FIELDS),
        *("messages.role", "messages.content"),
    ),
    2: ("demo_messages",),  # older files read with demo_messages = 0
    3: ("turns.node_id", "turns.parent_id"),  # older files read with -1 for both
    # row_starts: older files read as one row per episode. Messages' tool_calls and name came with
    # episode/4 too, but some episode/4 files were written before them: read where there, never required
    4: ("row_starts",),
    5: ("advantages", "returns", "values"),  # what the update computed; older files read with none
    6: ("chat_kwargs",),  # and messages' reasoning (read where there); older files read with neither
    7: ("info",),  # the episode's info (a seat's game: omrl.rollout.seats); older files read with {}
}
READABLE_SCHEMAS = tuple(f"episode/{version}".encode() for version in ADDED)


def columns_of(version: int) -> list[str]:
    """Every column and turn or message field a file of ``episode/<version>`` holds."""
    return [name for added in range(1, version + 1) for name in ADDED[added]]


def missing_columns(schema: pa.Schema) -> list[str]:
    """What the layout ``schema``'s tag names holds and ``schema`` lacks ("turns.reward" for a turn's
    field); empty for a whole file. ``schema`` carries one of :data:`READABLE_SCHEMAS`."""
    version = int(schema.metadata[b"omrl.schema"].split(b"/")[1])
    present = set(schema.names)
    for column in ("turns", "messages"):
        kind = schema.field(column).type if column in present else None
        if kind is not None and pa.types.is_list(kind) and pa.types.is_struct(kind.value_type):
            present.update(f"{column}.{field.name}" for field in kind.value_type)
    missing = [name for name in columns_of(version) if name not in present]
    # the fields of a column the file lacks are not named again
    return [name for name in missing if "." not in name or name.split(".")[0] not in missing]
