"""The openai backend refuses, where it receives them, answers that would otherwise crash later or
poison a trajectory: a body that is not JSON (or nested too deeply to read), a lone surrogate, an id
outside the vocabulary (-1 too), a log-prob that is not a finite number. Each is an EndpointError naming the cause, and on the command
line an exit 2 with that one line, never "a bug in omrl"."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from omrl.backends import SamplingParams
from omrl.backends.openai import EndpointError, OpenAIBackend
from omrl.cli import main
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


def test_a_good_answer_still_passes_with_missing_log_probs_as_zero(tiny_tokenizer):
    body = json.dumps({"choices": [{"token_ids": [5, 6, 7], "logprobs": {"token_logprobs": [-0.5, None]}}]}).encode()
    (gen,) = _backend(tiny_tokenizer, body).generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))
    assert gen.token_ids == [5, 6, 7] and gen.logprobs == [-0.5, 0.0, 0.0] and gen.token_exact


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
