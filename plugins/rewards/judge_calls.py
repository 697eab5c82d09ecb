"""The ``judge`` reward's judge: asking it (an OpenAI-compatible endpoint or a local model, with a cache).

A judge takes prompts and gives one :class:`Reply` each: its text, or why there is none (an HTTP
error after the retries, no answer within the timeout, a body that is no completion). Only a judge
that cannot work at all (the endpoint refuses the key, knows no such model or route) raises: every
episode would fail alike, so the run stops naming the fix instead. Reading a reply's verdict is
:mod:`omrl_plugins.rewards.judge_verdicts`.

The API key is read from the environment variable the options name, sent in a header and kept nowhere
else: not in a reply, an error message or the cache key.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Sequence
from urllib.parse import urlsplit

from omrl.chat.replies import REASONING_FIELDS
from omrl.errors import ConfigError, EnvFailure, short_repr

if TYPE_CHECKING:
    import httpx

RETRY_STATUS = {408, 429, 500, 502, 503, 504}
#: statuses that say the judge is misconfigured (key, model, route): every call would fail, so the run stops
FATAL_STATUS = {401: "refused the API key", 403: "refused the API key", 404: "knows no such model or route"}
CACHE_SIZE = 20_000  # replies kept for identical prompts (least recently used dropped first)
LOCAL_BACKENDS = ("hf", "vllm")


@dataclass
class Reply:
    """A judge's answer to one prompt: ``text`` (and any separate ``reasoning`` the server sent), or ``error``."""

    text: str = ""
    reasoning: str = ""
    error: str = ""
    cut: bool = False  # the reply stopped at max_tokens
    cached: bool = False


class EndpointJudge:
    """An OpenAI-compatible ``/chat/completions`` endpoint, asked ``concurrency`` prompts at a time."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str,
        temperature: float,
        max_tokens: int,
        timeout_s: float,
        retries: int,
        concurrency: int,
    ):
        import httpx  # only a judge at an endpoint needs it

        self.base_url, self.model = base_url.rstrip("/"), model
        self.label = f"{model!r} at {self.base_url}"
        self.api_key_env = api_key_env
        key = os.environ.get(api_key_env, "") if api_key_env else ""
        self._key = key  # only to scrub it from what the server says, should it echo it back
        self.client = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {key}"} if key else {},
            timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
        )
        self.sampling = {"model": model, "temperature": temperature, "max_tokens": max_tokens}
        self.timeout_s, self.retries, self.concurrency = timeout_s, retries, concurrency
        self.key = json.dumps(["openai", self.base_url, self.sampling])  # what the cache tells judges apart by

    def ask(self, prompts: Sequence[str]) -> list[Reply]:
        pool = ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(prompts))), thread_name_prefix="judge")
        try:
            return list(pool.map(self._one, prompts))
        finally:  # a stalled reward stage must not wait here for the calls still in flight
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self.client.close()

    def _one(self, prompt: str) -> Reply:
        import httpx

        body = {**self.sampling, "messages": [{"role": "user", "content": prompt}]}
        why = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(0.5 * 2 ** (attempt - 1), 8.0))
            try:
                answer = self.client.post("/chat/completions", json=body)
            except httpx.TimeoutException:
                return Reply(error=f"no answer within timeout_s={self.timeout_s:g}")
            except httpx.RequestError as exc:  # unreachable, or a reply that cannot be read (a broken proxy's)
                why = f"cannot reach it ({type(exc).__name__}: {exc})"
                continue
            if answer.status_code in FATAL_STATUS:
                raise ConfigError(self._fatal(answer))
            if answer.status_code in RETRY_STATUS:
                why = f"HTTP {answer.status_code}: {self._said(answer)}"
                continue
            if answer.status_code >= 400:  # a prompt it will not take (too long for its context): this episode's
                return Reply(error=f"HTTP {answer.status_code}: {self._said(answer)}")
            reply = _completion(answer)
            if self._key:
                reply.text, reply.reasoning, reply.error = (
                    part.replace(self._key, "***") for part in (reply.text, reply.reasoning, reply.error)
                )
            return reply
        tries = f" (tried {self.retries + 1} times)" if self.retries else ""
        return Reply(error=why + tries)

    def _fatal(self, answer: httpx.Response) -> str:
        fix = (
            f"check the key in ${self.api_key_env} (plugins.judge.api_key_env names the variable)"
            if answer.status_code in (401, 403)
            else "check plugins.judge.base_url (it ends in /v1) and plugins.judge.model"
        )
        return (
            f"reward 'judge': the judge {self.label} {FATAL_STATUS[answer.status_code]} "
            f"(HTTP {answer.status_code}: {self._said(answer)}); {fix}"
        )

    def _said(self, answer: httpx.Response) -> str:
        """What the server answered, cut to a line, the key scrubbed from it."""
        return short_repr(answer.text.replace(self._key, "***") if self._key else answer.text)


def check_judge(backend: str, base_url: str, model: str) -> None:
    """ConfigError unless ``backend`` names a judge and the options it needs are set (nothing is asked)."""
    if backend == "openai":
        if not base_url or not model:
            raise ConfigError(
                "reward 'judge' with backend=openai needs base_url and model, e.g. "
                "plugins.judge.base_url=http://127.0.0.1:8000/v1 plugins.judge.model=Qwen/Qwen3-8B"
            )
        _check_base_url(base_url)
    elif backend in LOCAL_BACKENDS:
        if not model:
            raise ConfigError(
                f"reward 'judge' with backend={backend} needs model: a built-in name, a directory or a hub id "
                "(plugins.judge.model=smollm2-135m)"
            )
    else:
        raise ConfigError(
            f"reward 'judge' option backend={backend!r} is invalid; valid: openai (an endpoint at base_url), "
            f"{', '.join(LOCAL_BACKENDS)} (a model omrl loads)"
        )


def reach(base_url: str, timeout_s: float) -> None:
    """EnvFailure unless ``base_url``'s host takes a connection within ``timeout_s`` (nothing is asked)."""
    parts = urlsplit(base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except OSError as exc:
        raise EnvFailure(
            f"reward 'judge': cannot reach {base_url} ({type(exc).__name__}: {exc}), so no episode could be "
            "scored: start the judge's server, or fix plugins.judge.base_url"
        ) from exc


def _check_base_url(base_url: Any) -> None:
    """ConfigError unless ``base_url`` is an http(s) URL with a host (``127.0.0.1:8000/v1`` has no scheme: every
    call would fail as unreachable, and every episode end as env_error)."""
    parts = urlsplit(base_url) if isinstance(base_url, str) else None
    try:
        valid = parts is not None and parts.scheme in ("http", "https") and bool(parts.hostname)
        valid = valid and (parts.port is None or parts.port > 0)
    except ValueError:  # a port that is no number, or out of range
        valid = False
    if not valid:
        raise ConfigError(
            f"reward 'judge' option base_url={short_repr(base_url)} is not an http:// or https:// URL with a host; "
            "valid: e.g. plugins.judge.base_url=http://127.0.0.1:8000/v1"
        )


def _completion(answer: httpx.Response) -> Reply:
    """The reply text of a chat completion, or what is wrong with it."""
    try:
        choice = answer.json()["choices"][0]
        message, finish = choice["message"], choice.get("finish_reason")
        text = message.get("content") or ""
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return Reply(error=f"answered no chat completion: {short_repr(answer.text)}")
    if not isinstance(text, str):
        return Reply(error=f"answered content that is no text: {short_repr(text)}")
    reasoning = next((message[f] for f in REASONING_FIELDS if isinstance(message.get(f), str) and message[f]), "")
    return Reply(text=text, reasoning=reasoning, cut=finish == "length")


class LocalJudge:
    """A model omrl loads itself (``tiny``, a directory, a hub id), through one of its backends."""

    def __init__(self, backend: str, model: str, dtype: str, temperature: float, max_tokens: int, concurrency: int):
        self.label = f"{model!r} ({backend} backend)"
        self.model, self.tokenizer = _local_model(backend, model, dtype, concurrency)
        self.temperature, self.max_tokens = temperature, max_tokens
        self.key = json.dumps([backend, model, dtype, temperature, max_tokens])

    def ask(self, prompts: Sequence[str]) -> list[Reply]:
        from omrl.backends.base import SamplingParams

        tokenizer = self.tokenizer
        ids = []
        for prompt in prompts:
            chat = [{"role": "user", "content": prompt}]
            text = (
                tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
                if getattr(tokenizer, "chat_template", None)
                else prompt
            )
            ids.append(tokenizer.encode(text, add_special_tokens=False))
        params = SamplingParams(max_new_tokens=self.max_tokens, temperature=self.temperature, seed=0)
        try:
            generations = self.model.generate(ids, params)
        except Exception as exc:  # noqa: BLE001 - whatever the engine raised fails these episodes, named
            return [Reply(error=f"generation failed ({type(exc).__name__}: {exc})") for _ in prompts]
        finally:
            self.model.release()
        return [
            Reply(text=tokenizer.decode(g.token_ids, skip_special_tokens=True), cut=g.finish_reason == "length")
            for g in generations
        ]

    def close(self) -> None:
        """The model stays loaded for the next batch."""


_LOCAL: dict[tuple[str, str, str, int], tuple[Any, Any]] = {}


def _local_model(backend: str, model: str, dtype: str, concurrency: int) -> tuple[Any, Any]:
    """The backend and tokenizer of a local judge, loaded once per process."""
    key = (backend, model, dtype, concurrency)
    if key not in _LOCAL:
        from omrl.backends import make_backend
        from omrl.config.options import GenerationConfig
        from omrl.models import load_tokenizer

        tokenizer = load_tokenizer(model)
        generation = GenerationConfig(backend=backend, batch_size=concurrency, kv_reuse=False)
        _LOCAL[key] = (make_backend(backend, tokenizer, generation, model_name=model, dtype=dtype), tokenizer)
    return _LOCAL[key]


def make_judge(
    backend: str,
    base_url: str,
    model: str,
    api_key_env: str,
    dtype: str,
    temperature: float,
    max_tokens: int,
    timeout_s: float,
    retries: int,
    concurrency: int,
) -> EndpointJudge | LocalJudge:
    check_judge(backend, base_url, model)
    if backend == "openai":
        return EndpointJudge(base_url, model, api_key_env, temperature, max_tokens, timeout_s, retries, concurrency)
    return LocalJudge(backend, model, dtype, temperature, max_tokens, concurrency)


# -- the cache: identical prompts to the same judge are asked once a run (a process) -----------------------
_CACHE: OrderedDict[str, Reply] = OrderedDict()


def ask_cached(judge: EndpointJudge | LocalJudge, prompts: Sequence[str], cache: bool) -> list[Reply]:
    """One reply per prompt, at most ``concurrency`` asked at a time. With ``cache`` each distinct prompt
    is asked once, and none that this process already had an answer to (failed replies are not kept);
    without, every prompt is asked."""
    if not cache:
        return judge.ask(prompts)
    keys = [_key(judge, p) for p in prompts]
    known = {k: _CACHE[k] for k in keys if k in _CACHE}
    todo = list(dict.fromkeys(k for k in keys if k not in known))
    fresh: dict[str, Reply] = {}
    if todo:
        text = dict(zip(keys, prompts))
        fresh = dict(zip(todo, judge.ask([text[k] for k in todo])))
        for k, reply in fresh.items():
            if not reply.error:
                _CACHE[k] = reply
                while len(_CACHE) > CACHE_SIZE:
                    _CACHE.popitem(last=False)
    out, asked = [], set()
    for k in keys:
        if k in known or k in asked:  # answered before, or earlier in this batch
            out.append(replace(known.get(k) or fresh[k], cached=True))
        else:
            out.append(fresh[k])
            asked.add(k)
    return out


def forget(judge: EndpointJudge | LocalJudge, prompt: str) -> None:
    """Drop the cached reply to ``prompt`` (one that could not be read: the next batch asks again)."""
    _CACHE.pop(_key(judge, prompt), None)


def _key(judge: EndpointJudge | LocalJudge, prompt: str) -> str:
    return hashlib.sha256(json.dumps([judge.key, prompt]).encode()).hexdigest()


def clear_cache() -> None:
    """Forget every reply (a new run in the same process; tests)."""
    _CACHE.clear()
