"""A loopback OpenAI-compatible judge whose chat completions are scripted, for the judge reward's tests."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

KEY = "sk-judge-secret-123"  # what the key's environment variable holds: it must show up nowhere but the header


class ScriptedJudge:
    """A loopback OpenAI-compatible server: each chat completion answers ``script(prompt)``: text, an HTTP
    status (an int, or ``("status", code, message)``), ``("slow", seconds, answer)`` (the answer after a
    wait; past the client's timeout: a hang), ``("cut", text)`` (text that stopped at max_tokens: finish_reason
    length) or ``("not gzip", body)`` (a body marked gzip that is not)."""

    def __init__(self):
        self.script = lambda prompt: "SCORE: 5"
        self.requests: list[dict] = []
        self.test, self.in_flight, self.most_in_flight = 0, {}, 0
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            self.requests.append({"authorization": request.headers.get("authorization"), **body})
            test = self.test  # a test's count leaves out requests an earlier test left hanging
            self.in_flight[test] = self.in_flight.get(test, 0) + 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight[test])
            try:
                answer = self.script(body["messages"][-1]["content"])
                if isinstance(answer, tuple) and answer[0] == "slow":
                    _, seconds, answer = answer
                    await asyncio.sleep(seconds)
            finally:
                self.in_flight[test] -= 1
            if isinstance(answer, tuple) and answer[0] == "not gzip":  # a reply no client can decode
                return Response(answer[1], media_type="application/json", headers={"Content-Encoding": "gzip"})
            finish = "stop"
            if isinstance(answer, tuple) and answer[0] == "cut":  # a reply that stopped at max_tokens
                finish, answer = "length", answer[1]
            if isinstance(answer, int):
                answer = ("status", answer, f"status {answer}")
            if isinstance(answer, tuple):
                _, status, said = answer
                return JSONResponse({"error": {"message": said}}, status_code=status)
            message = {"role": "assistant", "content": answer}
            return {"object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": finish}]}

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started and self.thread.is_alive():
            time.sleep(0.01)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def prompts(self) -> list[str]:
        return [r["messages"][-1]["content"] for r in self.requests]

    def stop(self) -> None:
        self.server.should_exit = True
        self.server.force_exit = True  # no waiting on the requests a test left hanging (3.5 s of a module's time)
        self.thread.join(timeout=10)
