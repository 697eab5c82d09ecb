"""The openai backend refuses, where it receives them, answers that would otherwise crash later or
poison a trajectory: a body that is not JSON (or nested too deeply to read), a lone surrogate, an id
outside the vocabulary (-1 too), a log-prob that is not a finite number. Each is an EndpointError naming the cause, and on the command
line an exit 2 with that one line, never "a bug in omrl"."""

from __future__ import annotations

import json
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import httpx
import pytest

from omrl.backends import SamplingParams
from omrl.backends.base import Backend
from omrl.backends.openai import EndpointError, OpenAIBackend, TokenIdsRefused
from omrl.backends.server_control import ServerControl
from omrl.backends.vllm import VLLMBackend
from omrl.backends.weight_sync import FileSync
from omrl.cli import main
from omrl.errors import OmrlError
from tests.helpers import serving_in_a_thread

CHAT = [{"role": "user", "content": "hi"}]


def _completion(ids, logprobs, text="") -> bytes:
    return json.dumps(
        {
            "choices": [
                {"text": text, "token_ids": ids, "finish_reason": "length", "logprobs": {"token_logprobs": logprobs}}
            ]
        }
    ).encode()


# the raw bytes a broken server answers under HTTP 200, and what the error must say
BAD_ANSWERS = {
    "not json": (b"<html><body>502 from a proxy</body></html>", "with a body that is not JSON"),
    "cut json": (b'{"choices": [{"token_ids": [5, 6', "with a body that is not JSON"),
    "not utf-8": (b'{"choices": [{"text": "\xff\xfe"}]}', "with a body that is not JSON"),
    "id -1": (_completion([5, -1], [-0.1, -0.2]), "token 1 has the id -1, outside the tokenizer's vocabulary"),
    "id past the vocabulary": (
        _completion([5, 4096], [-0.1, -0.2]),
        "token 1 has the id 4096, outside the tokenizer's vocabulary (0 to 4095)",
    ),
    "id not a number": (_completion([5, "6"], [-0.1, -0.2]), "token 1 has the id '6'"),
    "NaN log-prob": (
        b'{"choices": [{"token_ids": [5, 6], "logprobs": {"token_logprobs": [-0.1, NaN]}}]}',
        "log-prob of token 1 is nan, not a finite number",
    ),
    "infinite log-prob": (
        b'{"choices": [{"token_ids": [5, 6], "logprobs": {"token_logprobs": [-Infinity, -1]}}]}',
        "log-prob of token 0 is -inf, not a finite number",
    ),
    "log-prob not a number": (_completion([5, 6], ["x", -0.2]), "log-prob of token 0 is 'x', not a finite number"),
    # a made-up 0.0 would weigh each token's importance ratio by its probability, about 1/4096 here
    "log-probs missing": (
        b'{"choices": [{"token_ids": [5, 6], "logprobs": null}]}',
        "token_logprobs is None, not a list of the 2 sampled tokens' log-probs",
    ),
    "one log-prob short": (_completion([5, 6, 7], [-0.5, -0.1]), "not a list of the 3 sampled tokens' log-probs"),
    "a log-prob null": (_completion([5, 6, 7], [-0.5, None, -0.1]), "log-prob of token 1 is None"),
    "bad token_id token": (
        b'{"choices": [{"logprobs": {"tokens": ["token_id:5", "token_id:x"]}}]}',
        "'token_id:' without an integer id",
    ),
    "lone surrogate": (
        b'{"choices": [{"text": "go \\ud800 north", "finish_reason": "stop"}]}',
        "not valid Unicode (surrogates not allowed at character 3",
    ),
    "text not a string": (b'{"choices": [{"text": ["go"], "finish_reason": "stop"}]}', "text is not a string"),
    "JSON 100,000 deep": (b"[" * 100_000 + b"]" * 100_000, "with JSON nested too deeply to read"),
}


def _backend(tokenizer, body: bytes, chat_only: bool = False) -> OpenAIBackend:
    def answer(request: httpx.Request) -> httpx.Response:
        if chat_only and not request.url.path.endswith("/chat/completions"):
            return httpx.Response(400, text="prompt must be text")
        return httpx.Response(200, content=body, headers={"content-type": "application/json"})

    return OpenAIBackend("http://server.test/v1", "tiny", tokenizer, retries=0, transport=httpx.MockTransport(answer))


@pytest.mark.parametrize("case", BAD_ANSWERS)
def test_a_bad_answer_is_an_endpoint_error_naming_the_cause(tiny_tokenizer, case):
    body, message = BAD_ANSWERS[case]
    with pytest.raises(EndpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _backend(tiny_tokenizer, body).generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))


def test_a_lone_surrogate_in_a_chat_answer_is_refused(tiny_tokenizer):
    body = b'{"choices": [{"message": {"content": "\\udc80"}, "finish_reason": "stop"}]}'
    backend = _backend(tiny_tokenizer, body, chat_only=True)
    with pytest.raises(EndpointError, match="lone UTF-16 surrogate"):
        backend.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4), messages=[CHAT])
    assert backend.chat_only


def test_a_good_answer_keeps_its_ids_and_log_probs(tiny_tokenizer):
    body = _completion([5, 6, 7], [-0.5, -1, -0.25])
    (gen,) = _backend(tiny_tokenizer, body).generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))
    assert gen.token_ids == [5, 6, 7] and gen.logprobs == [-0.5, -1.0, -0.25] and gen.token_exact


def _scripted(tokenizer, statuses, weight_sync=None) -> tuple[OpenAIBackend, list[str]]:
    """A backend whose server answers its completion requests with ``statuses`` in turn (then 200)
    and every chat with text; the paths it was asked, in order."""
    asked, left = [], list(statuses)

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if request.url.path.endswith("/chat/completions"):
            return httpx.Response(200, json={"choices": [{"message": {"content": "go"}, "finish_reason": "stop"}]})
        status = left.pop(0) if left else 200
        if status != 200:
            return httpx.Response(status, text=f"busy or refused ({status})")
        return httpx.Response(200, content=_completion([5, 6], [-0.1, -0.2]))

    backend = OpenAIBackend(
        "http://server.test/v1",
        "tiny",
        tokenizer,
        retries=2,
        backoff=0.0,
        transport=httpx.MockTransport(answer),
        weight_sync=weight_sync,
    )
    return backend, asked


def _play(backend):
    return backend.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4), messages=[CHAT])[0]


@pytest.mark.parametrize("status", [429, 408, 503])
def test_a_busy_server_is_an_error_not_a_refusal_of_token_ids(tiny_tokenizer, status):
    """A 429 (or 408, 5xx) still answered after the retries says the server is busy, not that it
    refuses token ids: switching to chat would leave every later turn untrainable."""
    backend, asked = _scripted(tiny_tokenizer, [status] * 3)
    with pytest.raises(EndpointError, match=rf"answered HTTP {status}: .*\(still, after 2 retries\)"):
        _play(backend)
    assert not backend.chat_only and asked == ["/v1/completions"] * 3
    gen = _play(backend)  # the burst is over: token ids again
    assert gen.token_exact and gen.token_ids == [5, 6] and asked[-1] == "/v1/completions"


def test_a_4xx_after_token_ids_worked_is_an_error_not_a_switch_to_chat(tiny_tokenizer):
    """Once the server took a token-id prompt, a 400 (a prompt past max_model_len) or a 404 (an
    adapter unloaded) is that request's failure, not a refusal of token ids."""
    backend, asked = _scripted(tiny_tokenizer, [200, 400, 404])
    assert _play(backend).token_exact
    for status in (400, 404):
        with pytest.raises(EndpointError, match=f"answered HTTP {status}"):
            _play(backend)
    assert not backend.chat_only and "/v1/chat/completions" not in asked
    assert _play(backend).token_exact


def test_a_refusal_of_the_first_token_id_prompt_switches_to_chat(tiny_tokenizer):
    backend, asked = _scripted(tiny_tokenizer, [400])
    gen = _play(backend)
    assert backend.chat_only and not gen.token_exact
    assert asked == ["/v1/completions", "/v1/chat/completions"]


def test_a_trainers_backend_refused_token_ids_stops_instead_of_training_nothing(tiny_tokenizer):
    """With a weight sync the backend serves a trainer, which needs the sampled ids: chat text would
    make every episode untrainable and every update a skip."""
    sync = FileSync(ServerControl("http://server.test/v1"))
    backend, asked = _scripted(tiny_tokenizer, [400], weight_sync=sync)
    with pytest.raises(TokenIdsRefused, match="answered HTTP 400: .*; training needs the sampled token ids"):
        _play(backend)
    assert not backend.chat_only and asked == ["/v1/completions"]


def test_a_server_serving_another_model_name_is_named_as_such(tiny_tokenizer):
    """vLLM's 404 "The model `tiny` does not exist." was read as a refusal of token ids (and, for a trainer,
    as "training needs the sampled token ids"): the server serves the model under another name."""

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"message": "The model `tiny` does not exist.", "type": "NotFoundError"})

    sync = FileSync(ServerControl("http://server.test/v1"))
    transport = httpx.MockTransport(answer)
    for weight_sync in (None, sync):
        backend = OpenAIBackend(
            "http://server.test/v1", "tiny", tiny_tokenizer, transport=transport, weight_sync=weight_sync
        )
        with pytest.raises(
            EndpointError, match=r"does not serve a model named 'tiny'.*--served-model-name tiny"
        ) as info:
            _play(backend)
        assert "http://server.test/v1/models" in str(info.value) and "token ids" not in str(info.value)


class _Canned(BaseHTTPRequestHandler):
    body = b""

    def do_POST(self):  # noqa: N802 - the http.server API
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def canned_server():
    """An HTTP server on 127.0.0.1 answering every POST with ``_Canned.body`` under HTTP 200."""
    with serving_in_a_thread(ThreadingHTTPServer(("127.0.0.1", 0), _Canned)) as server:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"


@pytest.mark.parametrize("case", ["not json", "id -1", "NaN log-prob", "lone surrogate", "JSON 100,000 deep"])
def test_eval_against_a_broken_server_exits_2_naming_the_cause(
    canned_server, tiny_model_dir, capsys, case, monkeypatch
):
    body, message = BAD_ANSWERS[case]
    monkeypatch.setattr(_Canned, "body", body)
    with pytest.raises(SystemExit) as info:
        main(
            [
                "eval",
                "--env",
                "gridworld",
                "--model",
                tiny_model_dir,
                "--num-tasks",
                "1",
                "generation.backend=openai",
                f"generation.base_url={canned_server}",
                "generation.max_new_tokens=4",
            ]
        )
    err = " ".join(capsys.readouterr().err.split())
    assert info.value.code == 2 and "bug in omrl" not in err, err
    assert message in err, err


@pytest.mark.parametrize(
    "logprobs, message",
    [
        (None, "vLLM's output logprobs is None, not a list of the 2 sampled tokens' log-probs"),
        ([{5: -0.1}, {999: -0.5}], "the log-prob of token 1 is None"),  # the sampled token not in its step
        ([{5: -0.1}, {6: float("nan")}], "the log-prob of token 1 is nan"),
    ],
)
def test_the_vllm_backend_refuses_missing_log_probs_too(tiny_tokenizer, logprobs, message):
    """vLLM's CompletionOutput as the engine gives it (no engine here: it needs vllm installed)."""
    backend = VLLMBackend.__new__(VLLMBackend)  # only the tokenizer's side: __init__ starts an engine
    Backend.__init__(backend, tiny_tokenizer, 1)
    steps = None if logprobs is None else [{t: SimpleNamespace(logprob=v) for t, v in s.items()} for s in logprobs]
    with pytest.raises(OmrlError, match=re.escape(message)):
        backend._from_output(SimpleNamespace(token_ids=[5, 6], logprobs=steps), 4)


def test_a_server_that_stops_answering_is_warned_of_then_named(tiny_tokenizer):
    """A stopped server (SIGSTOP, a hung worker) still accepts connections: each wait past
    generation.request_timeout_s is a warning, and the last one an error naming that key."""
    import socket

    from omrl.backends import make_backend
    from omrl.config.sections import GenerationConfig

    with socket.socket() as silent:  # the kernel accepts the connection; nothing ever answers it
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        generation = GenerationConfig(
            backend="openai",
            base_url=f"http://127.0.0.1:{silent.getsockname()[1]}/v1",
            request_timeout_s=0.25,
            request_retries=1,
        )
        backend = make_backend("openai", tiny_tokenizer, generation, model_name="tiny")
        backend.backoff = 0.0
        with pytest.warns(
            UserWarning, match=r"did not answer within generation.request_timeout_s=0.25 s; sending it again \(1 of 1"
        ):
            with pytest.raises(
                EndpointError, match=r"request_timeout_s=0.25 s \(still, after 1 retries\): is the server alive"
            ):
                backend.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))
