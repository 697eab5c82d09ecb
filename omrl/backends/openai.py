"""The ``openai`` backend: any OpenAI-compatible endpoint (``vllm serve``, SGLang, TGI...).

Token-exact path: ``POST {base_url}/completions`` with the prompt as token ids
and ``logprobs``, asking for the sampled ids back (vLLM's ``return_token_ids``,
or ``return_tokens_as_token_ids`` in the log-probs). When the server refuses
token-id prompts (an HTTP 4xx to its first request) the backend switches to
``/chat/completions`` with the chat as text for the rest of its life; such
turns are tokenized locally and marked ``token_exact=False``, so they can be
evaluated but not trained on (a trainer's backend, one with a weight sync, stops there instead): a special token's string in such a reply is text,
never the token (:func:`omrl.chat.encoding.encode_reply`), and only a prefix of
the text as long as the token limit needs is tokenized (a server that ignores
``max_tokens`` can send megabytes). Requests run concurrently (``batch_size`` at a
time) with timeouts and retries on connection errors, 429 and 5xx. With
``generation.weight_sync=lora`` each request names the adapter version its conversation started
under (:mod:`omrl.backends.lora_sync`) and each turn records that version.

What comes back is checked where it is received, since a trajectory keeps it for
training: a body that is not JSON (or nested too deeply to read), text that is not
valid Unicode (a lone surrogate), a token id outside the tokenizer's vocabulary, a missing log-prob and
one that is not a finite number are each an :class:`EndpointError` naming the request. A 408, 429 or
5xx still failing after the retries is one too: the server was busy or down, which says nothing of
whether it takes token ids.
"""

from __future__ import annotations

import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Sequence

import httpx

from omrl.backends.base import Backend, Chats, Generation, Prompts, SamplingParams, checked_logprobs
from omrl.backends.lora_sync import LoraSync
from omrl.backends.weight_sync import WeightSync
from omrl.chat.encoding import encode_reply
from omrl.errors import EndpointError, OmrlError, short_repr

RETRY_STATUS = {408, 429, 500, 502, 503, 504}
CHARS_PER_TOKEN = 16  # a reply's prefix tokenized first, per token wanted (grown until it holds enough)
MARGIN_TOKENS = 8  # tokens past the limit that a prefix must hold: the last few may change with the cut


class TokenIdsRefused(EndpointError):
    """The endpoint answered a token-id prompt with an HTTP 4xx other than 408 or 429."""


class OpenAIBackend(Backend):
    """An OpenAI-compatible HTTP endpoint; token ids in and out where the server allows."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: Any,
        batch_size: int = 32,
        api_key: str = "",
        timeout: float = 120.0,
        retries: int = 3,
        backoff: float = 0.5,
        transport: httpx.BaseTransport | None = None,
        weight_sync: WeightSync | LoraSync | None = None,
    ):
        super().__init__(tokenizer, batch_size)
        self.weight_sync = weight_sync  # how trained weights reach the server; None: it never gets any
        if not base_url:
            raise OmrlError("the openai backend needs generation.base_url, e.g. http://127.0.0.1:8000/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=headers,
            transport=transport,
            timeout=httpx.Timeout(timeout, connect=min(10.0, timeout)),
        )
        self.model = model
        self.timeout = timeout
        self.retries = retries
        self._stall_warned_at = -float("inf")
        self.backoff = backoff
        self.chat_only = False  # set once the server refuses token-id prompts
        self.took_token_ids = False  # set by the first token-id completion: a later 4xx is an error

    @classmethod
    def from_env(
        cls, base_url: str, model: str, tokenizer: Any, api_key_env: str = "OPENAI_API_KEY", **kwargs: Any
    ) -> "OpenAIBackend":
        """A backend whose API key is read from the environment variable ``api_key_env``."""
        return cls(base_url, model, tokenizer, api_key=os.environ.get(api_key_env, ""), **kwargs)

    def generate(self, prompts: Prompts, params: SamplingParams, messages: Chats | None = None) -> list[Generation]:
        limits = params.limits(len(prompts))
        if messages is not None and len(messages) != len(prompts):
            raise OmrlError(f"generate got {len(messages)} chats for {len(prompts)} prompts")

        def one(i: int) -> tuple[Generation, dict[str, Any]]:
            seed = None if params.seed is None else params.seed + i
            chat = messages[i] if messages is not None else None
            return self._one(list(prompts[i]), chat, limits[i], params, seed)

        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=min(self.batch_size, max(1, len(prompts)))) as pool:
            answers = list(pool.map(one, range(len(prompts))))
        out = [gen for gen, _ in answers]
        self._count_call(out, time.perf_counter() - started, *_prompt_tokens([usage for _, usage in answers]))
        return out

    @property
    def shared(self) -> bool:
        """One server for every training process: the main one sends it the weights."""
        return self.weight_sync is not None

    def update_weights(
        self, state_dict: Mapping[str, Any], version: int = 0, lora_config: Mapping[str, Any] | None = None
    ) -> None:
        """Send the trained weights to the server (``generation.weight_sync``), named ``version`` there
        (the trainer's steps so far, a skipped update's included: its weights are the step before's).
        ``lora_config``: a LoRA model's ``adapter_config.json`` (:func:`omrl.backends.lora_sync.lora_config_of`),
        for ``weight_sync=lora``, which sends only the adapter."""
        if self.weight_sync is None:
            raise OmrlError(
                "the openai backend sends trained weights to its server only with generation.weight_sync=files, "
                "nccl or lora (omrl.backends.weight_sync)"
            )
        if isinstance(self.weight_sync, LoraSync):
            self.weight_sync.push(state_dict, version, lora_config or {})
        elif lora_config:
            raise OmrlError(
                "the trained model has LoRA adapters and generation.weight_sync sends full weights: set "
                "generation.weight_sync=lora"
            )
        else:
            self.weight_sync.push(state_dict, version)

    def _one(
        self,
        prompt: list[int],
        chat: Sequence[Mapping[str, str]] | None,
        limit: int,
        params: SamplingParams,
        seed: int | None,
    ) -> tuple[Generation, dict[str, Any]]:
        """One completion and the server's ``usage`` of it ({} when it sends none)."""
        # weight_sync=lora: the adapter version this conversation started under (omrl.backends.lora_sync)
        adapter = self.weight_sync.model_for(prompt) if isinstance(self.weight_sync, LoraSync) else None
        sampling: dict[str, Any] = {
            "model": adapter[0] if adapter else self.model,
            "max_tokens": limit,
            "temperature": max(params.temperature, 0.0),
            "top_p": params.top_p,
        }
        if seed is not None:
            sampling["seed"] = seed
        gen, usage = self._sample(prompt, chat, limit, sampling)
        if adapter is not None:
            gen.weights_version = adapter[1]
            self.weight_sync.record(prompt, gen.token_ids, adapter[1])
        return gen, usage

    def _sample(
        self, prompt: list[int], chat: Sequence[Mapping[str, str]] | None, limit: int, sampling: dict[str, Any]
    ) -> tuple[Generation, dict[str, Any]]:
        """One completion of ``prompt`` with the request's ``sampling`` fields: from token ids, or from
        ``chat`` once the server refuses them."""
        if not self.chat_only:
            body = {
                **sampling,
                "prompt": prompt,
                "logprobs": 1,
                "return_token_ids": True,
                "return_tokens_as_token_ids": True,
                "stop_token_ids": list(self.stop_token_ids),
                "skip_special_tokens": False,
            }
            try:
                response = self._post("completions", body, refusal_ok=chat is not None and not self.took_token_ids)
            except TokenIdsRefused as exc:
                if self.weight_sync is not None:
                    raise TokenIdsRefused(
                        f"{exc}; training needs the sampled token ids, which come only from /completions with "
                        "token-id prompts (vllm serve takes them)"
                    ) from exc
                self.chat_only = True
            else:
                self.took_token_ids = True
                return self._from_completion(response, limit), _usage(response)
        if chat is None:
            raise EndpointError(
                "the endpoint refuses token-id prompts and no chat messages were given "
                "to fall back to /chat/completions"
            )
        response = self._post("chat/completions", {**sampling, "messages": [dict(m) for m in chat]})
        return self._from_chat(response, limit), _usage(response)

    def _post(self, path: str, body: dict[str, Any], refusal_ok: bool = False) -> dict[str, Any]:
        """POST to ``path`` (relative to base_url) with retries; :class:`TokenIdsRefused` for a 4xx
        that is not 408 or 429 when ``refusal_ok``."""
        url = self.client.base_url.join(path)
        attempt = 0
        while True:  # each pass returns, raises on its last attempt, or sleeps and tries again
            try:
                reply = self.client.post(path, json=body)
            except httpx.ReadTimeout as exc:
                waited = f"{url} did not answer within generation.request_timeout_s={self.timeout:g} s"
                if attempt == self.retries:
                    raise EndpointError(
                        f"{waited} (still, after {self.retries} retries): is the server alive and not "
                        "overloaded? A slow one needs a larger generation.request_timeout_s"
                    ) from exc
                self._warn_stall(f"{waited}; sending it again ({attempt + 1} of {self.retries} retries)")
            except httpx.TransportError as exc:
                if attempt == self.retries:
                    raise EndpointError(f"cannot reach {url}: {exc}") from exc
            else:
                if reply.status_code < 300:
                    return _json(reply, url)
                answer = f"{url} answered HTTP {reply.status_code}: {reply.text[:300]}"
                if reply.status_code == 404 and "model" in reply.text.lower():  # vLLM: "The model `x` does not exist."
                    raise EndpointError(
                        f"{answer}; the server does not serve a model named {self.model!r}, the name omrl asks for "
                        f"(--model's): start it with --served-model-name {self.model}, or see what it serves at "
                        f"{self.client.base_url.join('models')}"
                    )
                if reply.status_code in RETRY_STATUS:
                    if attempt == self.retries:
                        raise EndpointError(f"{answer} (still, after {self.retries} retries)")
                elif 400 <= reply.status_code < 500 and refusal_ok:
                    raise TokenIdsRefused(answer)
                else:
                    raise EndpointError(answer)
            time.sleep(self.backoff * 2**attempt)
            attempt += 1

    def _warn_stall(self, message: str) -> None:
        """Warn of a request the server let time out, at most once a timeout across the batch's threads
        (they stall together): a stopped or overloaded server is said so, never a silent wait."""
        now = time.monotonic()
        if now - self._stall_warned_at < self.timeout:
            return
        self._stall_warned_at = now
        warnings.warn(f"{message} [{time.strftime('%H:%M:%S')}]", stacklevel=3)

    def _from_completion(self, response: dict[str, Any], limit: int) -> Generation:
        try:
            choice = response["choices"][0]
        except (KeyError, IndexError, TypeError) as exc:
            raise EndpointError(f"the completion has no choices: {str(response)[:300]}") from exc
        if not isinstance(choice, dict) or not isinstance(choice.get("logprobs") or {}, dict):
            raise EndpointError(
                f"the completion's choice is not an object with a logprobs object: {short_repr(choice)}"
            )
        logprobs = choice.get("logprobs") or {}
        ids = choice.get("token_ids")
        if ids is None:
            ids = _ids_from_logprob_tokens(logprobs.get("tokens") or [])
        if ids is None:  # neither extension: only text came back
            return self._from_text(choice.get("text") or "", choice.get("finish_reason"), limit)
        ids = self._checked_ids(ids)
        values = checked_logprobs(
            logprobs.get("token_logprobs"), len(ids), "the completion's logprobs.token_logprobs", EndpointError
        )
        return self._cut(ids, values, limit)

    def _checked_ids(self, ids: Any) -> list[int]:
        """``ids`` if it is a list of ids of the tokenizer's vocabulary; a -1 or an id past the vocabulary
        (another model served, a server bug) would be written into trajectories and fail training later."""
        vocab = len(self.tokenizer)
        if not isinstance(ids, list):
            raise EndpointError(f"the completion's token ids are not a list: {short_repr(ids)}")
        for i, token in enumerate(ids):
            if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < vocab:
                raise EndpointError(
                    f"the completion's token {i} has the id {short_repr(token)}, outside the "
                    f"tokenizer's vocabulary (0 to {vocab - 1}); is the server serving another "
                    f"model than {self.model!r} (model.name), with another tokenizer?"
                )
        return ids

    def _from_chat(self, response: dict[str, Any], limit: int) -> Generation:
        try:
            choice = response["choices"][0]
            text = choice["message"].get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise EndpointError(f"the chat completion has no message: {str(response)[:300]}") from exc
        return self._from_text(text, choice.get("finish_reason"), limit)

    def _from_text(self, text: str, finish_reason: str | None, limit: int) -> Generation:
        """Text tokenized locally: not the sampled ids, so marked not token-exact."""
        if not isinstance(text, str):
            raise EndpointError(f"the completion's text is not a string: {short_repr(text)}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate (\ud800): JSON allows it, no tokenizer does
            raise EndpointError(
                f"the completion's text is not valid Unicode ({exc.reason} at character "
                f"{exc.start}: {short_repr(text[max(exc.start - 20, 0) : exc.end + 20])}); the "
                "server sent a lone UTF-16 surrogate"
            ) from exc
        ids = self._first_ids(text, limit)
        if finish_reason == "stop" and len(ids) < limit:
            ids.append(self.eos_token_id)
        gen = Generation(ids, [0.0] * len(ids), "stop" if ids and ids[-1] in self.stop_token_ids else "length")
        gen.token_exact = False
        return gen

    def _first_ids(self, text: str, limit: int) -> list[int]:
        """The first ``limit`` ids of ``text``, tokenizing a prefix that holds them rather than the whole."""
        size = CHARS_PER_TOKEN * (limit + MARGIN_TOKENS)
        while True:
            ids = encode_reply(self.tokenizer, text[:size])
            if size >= len(text) or len(ids) >= limit + MARGIN_TOKENS:
                return ids[:limit]
            size *= 4

    def close(self) -> None:
        self.client.close()
        if self.weight_sync is not None:
            self.weight_sync.close()


def _json(reply: httpx.Response, url: Any) -> Any:
    """The JSON body of a successful ``reply``; EndpointError naming ``url`` when it is not JSON
    (a proxy's HTML page, a cut body, bytes that are not UTF-8)."""
    try:
        return reply.json()
    except RecursionError as exc:  # the world's failure too: 100,000 nested arrays are valid JSON
        raise EndpointError(
            f"{url} answered HTTP {reply.status_code} with JSON nested too deeply to read "
            f"({len(reply.content)} bytes starting {short_repr(reply.content[:60])}); no completion nests so"
        ) from exc
    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError both are
        raise EndpointError(
            f"{url} answered HTTP {reply.status_code} with a body that is not JSON ({exc}): "
            f"{short_repr(reply.content[:300])}; is generation.base_url an OpenAI-compatible "
            "server (e.g. http://127.0.0.1:8000/v1)?"
        ) from exc


def _usage(response: Any) -> dict[str, Any]:
    usage = response.get("usage") if isinstance(response, dict) else None
    return usage if isinstance(usage, dict) else {}


def _prompt_tokens(usages: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """Prompt tokens the server computed and took from its prefix cache, summed over ``usages``
    (``prompt_tokens`` and ``prompt_tokens_details.cached_tokens``); (0, 0), unknown, unless every
    answer said both (``vllm serve`` sends the details only with ``--enable-prompt-tokens-details``:
    without them a cache's hits cannot be told from computed tokens)."""
    computed = reused = 0
    for usage in usages:
        prompt = usage.get("prompt_tokens")
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if not isinstance(prompt, int) or not isinstance(cached, int):
            return 0, 0
        cached = min(max(cached, 0), prompt)
        computed, reused = computed + prompt - cached, reused + cached
    return computed, reused


def _ids_from_logprob_tokens(tokens: Sequence[str]) -> list[int] | None:
    """Ids from vLLM's ``token_id:123`` log-prob tokens, or None if they are plain text."""
    if not tokens or not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        return None
    try:
        return [int(t.split(":", 1)[1]) for t in tokens]
    except ValueError as exc:
        raise EndpointError(f"a completion's log-prob token is 'token_id:' without an integer id: {exc}") from exc
