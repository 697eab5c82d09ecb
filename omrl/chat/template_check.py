"""Whether a chat template writes every message's content out unchanged: read from its jinja
syntax tree, the first of the two checks :mod:`omrl.chat.pieces` makes before caching a template's
pieces (the second renders probe chats). And whether it renders at all within bounds
(:func:`check_render_bounds`): a template from a model repo is code, and one that loops over
``range(10**10)`` or builds gigabytes of text must be refused, not run. And which options it reads
(:func:`check_template_options`): a misspelt one is refused by name.

It reads jinja only and imports nothing of :mod:`omrl.chat`: it sits at the bottom of the package's layers."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import subprocess
import sys
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import nodes

from omrl.errors import OmrlError
from omrl.home import omrl_home

_KEEPS_TEXT = (nodes.Add, nodes.Concat, nodes.And, nodes.Or)  # the content flows on inside a longer value
_TYPE_TESTS = frozenset({"defined", "undefined", "none", "string", "mapping", "sequence", "iterable"})
_STILL_MESSAGES = frozenset({"first", "last", "reverse", "list", "selectattr", "rejectattr"})  # filters
_COUNTS = frozenset({"length", "count"})
_OUTPUT_HOLDERS = (nodes.Template, nodes.For, nodes.If, nodes.With, nodes.Scope)  # output in them stays output
_UNSTABLE_CALLS = frozenset({"strftime_now", "lipsum"})  # text that changes between renders
# what a template reads that is not an option: its arguments, and the fields of the messages it is given
NOT_OPTIONS = frozenset(
    {"messages", "add_generation_prompt", "tools", "documents"}
    | {"content", "role", "reasoning_content", "thinking", "reasoning"}
)
MAX_COUNT = 8  # a larger number could count messages past what the probe chats cover


class _Unsafe(Exception):
    """A construct through which a message's content could change other text, or leave it changed."""


@lru_cache(maxsize=32)
def cacheable_template(source: str) -> bool:
    """Whether the template's syntax tree shows it writes every message's content out unchanged
    (testing it at most for emptiness or type), with nowhere else content could flow, renders
    the same at every call (no dates) and counts no higher than ``MAX_COUNT`` (so the probe
    chats see every position where its output could change)."""
    try:
        tree = _environment(source).parse(source)
    except Exception:  # noqa: BLE001 - a template we cannot parse is rendered in full
        return False
    parents: dict[int, nodes.Node] = {id(child): tree for child in tree.iter_child_nodes()}
    for node in tree.find_all(nodes.Node):
        for child in node.iter_child_nodes():
            parents[id(child)] = node
    try:
        for call in tree.find_all(nodes.Call):
            if isinstance(call.node, nodes.Name) and call.node.name in _UNSTABLE_CALLS:
                raise _Unsafe
        for const in tree.find_all(nodes.Const):
            if type(const.value) in (int, float) and abs(const.value) > MAX_COUNT:
                raise _Unsafe
        tainted, seen = {"messages"}, set()  # names bound to messages
        for node in tree.find_all((nodes.Getattr, nodes.Getitem)):
            kind, what, value = _access(node, parents)
            if (kind, what) == ("key", "content"):
                _check_content(value, parents)
            if (
                isinstance(node, nodes.Getattr)
                and isinstance(node.node, nodes.Name)
                and node.node.name == "loop"
                and node.attr in ("previtem", "nextitem")
            ):
                _follow_messages(node, parents, tainted)
        while tainted - seen:
            names = tainted - seen
            seen |= names
            for name in tree.find_all(nodes.Name):
                if name.ctx == "load" and name.name in names:
                    _follow_messages(name, parents, tainted)
    except _Unsafe:
        return False
    return True


def _environment(source: str):
    """The jinja environment transformers renders chat templates in (its extensions parse ``{% generation %}``)."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(source).environment


def _access(node: nodes.Getattr | nodes.Getitem, parents: dict) -> tuple[str, Any, nodes.Node]:
    """What ``node`` reads: ('key', name, value node), ('item', None, node) for an index or slice, or
    ('call', method, call node)."""
    if isinstance(node, nodes.Getattr):
        parent = parents.get(id(node))
        if isinstance(parent, nodes.Call) and parent.node is node:
            first = parent.args[0] if parent.args else None
            if node.attr == "get" and isinstance(first, nodes.Const) and isinstance(first.value, str):
                return "key", first.value, parent
            return "call", node.attr, parent
        return "key", node.attr, node
    if isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
        return "key", node.arg.value, node
    return "item", None, node


def _check_content(value: nodes.Node, parents: dict) -> None:
    """``value`` holds a message's content: it must reach output unchanged, or only be tested."""
    parent = parents.get(id(value))
    if isinstance(parent, nodes.Output):
        holder = parents.get(id(parent))
        while holder is not None:
            if not (isinstance(holder, _OUTPUT_HOLDERS) or _is_generation_block(holder)):
                raise _Unsafe
            holder = parents.get(id(holder))
    elif isinstance(parent, _KEEPS_TEXT):
        _check_content(parent, parents)
    elif isinstance(parent, nodes.CondExpr):
        if parent.test is not value:
            _check_content(parent, parents)
    elif isinstance(parent, nodes.If) and parent.test is value or isinstance(parent, nodes.Not):
        return
    elif not (isinstance(parent, nodes.Test) and parent.node is value and parent.name in _TYPE_TESTS):
        raise _Unsafe


def _follow_messages(value: nodes.Node, parents: dict, tainted: set[str]) -> None:
    """``value`` is a message or a list of them: only fields other than content may be read off it
    (content is checked on its own), it may be counted, filtered, looped over or tested; names it is
    bound to join ``tainted``."""
    parent = parents.get(id(value))
    if isinstance(parent, (nodes.Getattr, nodes.Getitem)) and parent.node is value:
        kind, _, _ = _access(parent, parents)
        if kind == "item":
            _follow_messages(parent, parents, tainted)
        elif kind == "call":
            raise _Unsafe  # items(), values(), ...: content read under no name
    elif isinstance(parent, nodes.Filter) and parent.node is value:
        if parent.name not in _STILL_MESSAGES | _COUNTS or any(
            isinstance(arg, nodes.Const) and arg.value == "content" for arg in parent.find_all(nodes.Const)
        ):
            raise _Unsafe  # e.g. selectattr('content', ...): messages picked by their content
        if parent.name in _STILL_MESSAGES:
            _follow_messages(parent, parents, tainted)
    elif isinstance(parent, nodes.For) and parent.iter is value:
        target = parent.target
        tainted.update(n.name for n in (target, *target.find_all(nodes.Name)) if isinstance(n, nodes.Name))
    elif isinstance(parent, nodes.Assign) and parent.node is value and isinstance(parent.target, nodes.Name):
        tainted.add(parent.target.name)
    elif not (
        isinstance(parent, (nodes.If, nodes.CondExpr))
        and parent.test is value
        or isinstance(parent, nodes.Test)
        and parent.node is value
        or isinstance(parent, nodes.Not)
    ):
        raise _Unsafe


def _is_generation_block(node: nodes.Node) -> bool:
    """transformers' ``{% generation %}`` block, which outputs its body unchanged."""
    return (
        isinstance(node, nodes.CallBlock)
        and isinstance(node.call, nodes.Call)
        and isinstance(node.call.node, nodes.ExtensionAttribute)
        and node.call.node.name == "_generation_support"
    )


RENDER_SECONDS = 60.0  # the probe chats' renders, all together, in a fresh process (about 1 s to start)
RENDER_MEMORY = 1 << 30  # bytes of memory the renders may take
MAX_RENDER_CHARS = 1_000_000  # characters a probe chat may render to (a real one renders a few thousand)
_RENDERER = Path(__file__).with_name("bounded_render.py")


def where_tool(name: str, description: str) -> dict[str, Any]:
    """An OpenAI function tool that takes one required string, ``where``: the tool a probe chat offers."""
    parameters = {"type": "object", "properties": {"where": {"type": "string"}}, "required": ["where"]}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


_PROBE_TOOL = where_tool("look", "Look around.")
_CALL = {"type": "function", "function": {"name": "look", "arguments": {"where": "north"}}}
_PROBE_CHATS = [  # (messages, with the tool offered)
    (
        [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "Find the key."},
            {"role": "assistant", "content": "go north", "reasoning_content": "North is open."},
            {"role": "user", "content": "A wall."},
        ],
        False,
    ),
    (
        [
            {"role": "user", "content": "Find the key."},
            {"role": "assistant", "content": "", "tool_calls": [_CALL]},
            {"role": "tool", "name": "look", "content": "A wall."},
        ],
        True,
    ),
]


def check_render_bounds(
    tokenizer: Any,
    kwargs: dict | None = None,
    seconds: float | None = None,
    memory: int | None = None,
    max_chars: int | None = None,
) -> None:
    """Refuse, naming the bound, a chat template whose probe chats (with and without tools) do not render
    within ``seconds``, ``memory`` bytes and ``max_chars`` characters each (by default :data:`RENDER_SECONDS`,
    :data:`RENDER_MEMORY`, :data:`MAX_RENDER_CHARS`). They render in a process of its own
    (:mod:`omrl.chat.bounded_render`): a jinja loop cannot be interrupted, and a constant such as
    ``'x' * 10**10`` is built when the template compiles."""
    seconds = RENDER_SECONDS if seconds is None else seconds
    memory = RENDER_MEMORY if memory is None else memory
    max_chars = MAX_RENDER_CHARS if max_chars is None else max_chars
    source = getattr(tokenizer, "chat_template", None)
    if not isinstance(source, str) or not source:
        return
    job = {
        "template": source,
        "specials": _specials(tokenizer),
        "kwargs": dict(kwargs or {}),
        "chats": _PROBE_CHATS,
        "tools": [_PROBE_TOOL],
        "memory": memory,
        "max_chars": max_chars,
    }
    try:
        done = subprocess.run(
            [sys.executable, str(_RENDERER)], input=json.dumps(job), capture_output=True, text=True, timeout=seconds
        )
    except subprocess.TimeoutExpired:
        raise OmrlError(
            f"the chat template did not render two short probe chats within {seconds:g} s: it loops far too long "
            "(nested loops over range(100000)), so omrl cannot use it; fix the template or set tokenizer.chat_template"
        ) from None
    _check_verdict(done, memory, max_chars)


_WITHIN_BOUNDS: set[str] = set()  # the (template, special tokens, options) whose probe chats rendered within
_BOUNDS_LOCK = threading.Lock()  # rollouts on several threads share a tokenizer: one renders, the others wait


def check_render_bounds_once(tokenizer: Any, kwargs: dict | None = None) -> None:
    """:func:`check_render_bounds` with the default bounds, once for each template, special tokens and options:
    what a run passes before anything of it renders a chat through the template. A pass is remembered in
    this process and in ``$OMRL_HOME/checked-templates`` (the next run starts without the child process's
    second); a refusal is checked, and raised, again at each call."""
    source = getattr(tokenizer, "chat_template", None)
    if not isinstance(source, str) or not source:
        return
    bounds = [RENDER_SECONDS, RENDER_MEMORY, MAX_RENDER_CHARS, _renderer_version()]
    what = json.dumps([source, _specials(tokenizer), kwargs or {}, bounds], sort_keys=True, default=repr)
    key = hashlib.sha256(what.encode()).hexdigest()
    passed = omrl_home() / "checked-templates" / key
    with _BOUNDS_LOCK:
        if key in _WITHIN_BOUNDS or passed.exists():
            _WITHIN_BOUNDS.add(key)
            return
        check_render_bounds(tokenizer, kwargs)
        _WITHIN_BOUNDS.add(key)
        try:
            passed.parent.mkdir(parents=True, exist_ok=True)
            passed.touch()  # an empty file: whole or absent
        except OSError:  # a read-only home: checked again by the next run
            pass


@lru_cache(maxsize=1)
def _renderer_version() -> str:
    """transformers' version: another version's jinja renderer may render a template otherwise."""
    return importlib.metadata.version("transformers")


def _specials(tokenizer: Any) -> dict[str, Any]:
    """The special tokens a template reads by name (``bos_token``...), as transformers passes them."""
    return {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, (str, list))}


def _check_verdict(done: subprocess.CompletedProcess, memory: int, max_chars: int) -> None:
    """The child's verdict as an OmrlError naming the bound, or nothing when every render stayed within."""
    lines = done.stdout.strip().splitlines()
    try:
        verdict = json.loads(lines[-1]) if lines else {"problem": "died"}
    except json.JSONDecodeError:
        verdict = {"problem": "died"}
    problem = verdict.get("problem")
    if not problem:
        return
    if problem == "size":
        raise OmrlError(
            f"the chat template renders a short probe chat to {verdict.get('chars', 0):,} characters, more than "
            f"{max_chars:,}: it builds huge text, so omrl cannot use it; fix the template or set tokenizer.chat_template"
        )
    if problem == "memory" or done.returncode == -9:  # a MemoryError under the cap, or the kernel's OOM kill
        raise OmrlError(
            f"rendering a short probe chat through the chat template takes more than the {memory / 2**30:g} GiB "
            "of memory it is given: it builds huge text (e.g. 'x' * 10**10), so omrl cannot use it; fix the "
            "template or set tokenizer.chat_template"
        )
    raise OmrlError(
        f"the process that renders the chat template's probe chats failed (exit {done.returncode})"
        f"{_stderr_end(done.stderr)}"
    )


def _stderr_end(stderr: str) -> str:
    text = stderr.strip()
    return f": ...{text[-300:]}" if text else ""


def check_template_options(tokenizer: Any, options: dict) -> None:
    """An error naming each of ``options`` (``chat.template_kwargs``) the chat template never reads, with the
    variables it does read: a misspelt ``enable_thinkng`` would otherwise change nothing, silently."""
    if not options:
        return
    check_render_bounds_once(tokenizer, options)  # reading its variables compiles it (and folds its constants)
    read = template_variables(tokenizer)
    unread = sorted(set(options) - read)
    if unread:
        offered = ", ".join(sorted(read - NOT_OPTIONS)) or "none"
        raise OmrlError(
            f"chat.template_kwargs names {', '.join(unread)}, which the chat template does not read; "
            f"the options it reads: {offered}"
        )


def template_variables(tokenizer: Any) -> set[str]:
    """The variables the chat template reads that it does not set itself (its options, the messages...)."""
    from jinja2 import meta

    source = str(getattr(tokenizer, "chat_template", "") or "")
    try:
        return set(meta.find_undeclared_variables(_environment(source).parse(source)))
    except Exception:  # noqa: BLE001 - a template jinja cannot parse reads what it reads: nothing is refused
        return set()
