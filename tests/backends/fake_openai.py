"""A small OpenAI-compatible server on 127.0.0.1 that serves the tiny model (for openai-backend tests).

Modes (``server.mode``):
- ``vllm``: like ``vllm serve``: token-id prompts, ``token_ids`` in the choice when asked, and a
  ``usage`` whose ``prompt_tokens_details.cached_tokens`` counts what the prefix cache served;
- ``logprob_tokens``: token ids only as ``token_id:N`` log-prob tokens;
- ``text_only``: refuses token-id prompts (HTTP 400), serves chat completions as text.
``fail_next`` answers that many requests with HTTP 503 first (to exercise retries).

With ``rl_routes`` (as ``VLLM_SERVER_DEV_MODE=1 vllm serve``): vLLM's ``/pause``, ``/resume``,
``/collective_rpc`` (``reload_weights`` from a ``weights_path`` folder of safetensors, loaded into
the served model for real), ``/reset_prefix_cache``, ``/update_weight_version``, ``/weight_info``
and ``/get_world_size``. ``self.calls`` lists the RL routes called, in order.

With ``lora_routes`` (as ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve --enable-lora``):
``/v1/load_lora_adapter`` loads a peft adapter folder onto a copy of the served model for real, served
from then on under its ``lora_name``; ``/v1/unload_lora_adapter`` drops it. Answers as vLLM's: plain
text on success, a JSON error (400 for a name loaded twice, 404 for an unknown one) otherwise; a
completion naming an adapter that is not loaded is a 404. ``lora_enabled=False`` answers a load with
vLLM's 500 of a server started without ``--enable-lora``. ``served_name``, when set, is the only base
model name served (any other unknown name is a 404 too); ``self.lora_calls`` lists (route, name).
"""

import copy
import socket
import threading
from pathlib import Path

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from omrl.backends.base import SamplingParams


class FakeOpenAIServer:
    """Serves ``backend`` (an HFBackend) over HTTP from a background thread."""

    def __init__(self, backend, tokenizer):
        self.backend, self.tokenizer = backend, tokenizer
        self.mode = "vllm"
        self.cache_details = True  # usage.prompt_tokens_details (vllm serve --enable-prompt-tokens-details)
        self.fail_next = 0
        self.requests: list[tuple[str, dict]] = []
        app = FastAPI()

        def maybe_fail(path: str, body: dict) -> None:
            self.requests.append((path, body))
            if self.fail_next > 0:
                self.fail_next -= 1
                raise HTTPException(503, "busy")

        @app.post("/v1/completions")
        async def completions(request: Request):
            body = await request.json()
            maybe_fail("/completions", body)
            prompt = body["prompt"]
            if not isinstance(prompt, list) or self.mode == "text_only":
                raise HTTPException(400, "prompt must be text")
            gen = self._generate(prompt, body)
            choice = {
                "index": 0,
                "text": tokenizer.decode(gen.token_ids, skip_special_tokens=True),
                "finish_reason": gen.finish_reason,
                "logprobs": {"tokens": [f"token_id:{i}" for i in gen.token_ids], "token_logprobs": gen.logprobs},
            }
            answer = {"id": "cmpl-1", "object": "text_completion", "choices": [choice]}
            if self.mode == "vllm" and body.get("return_token_ids"):
                choice["token_ids"] = gen.token_ids
                stats = self.backend.take_stats()  # this request's: the prompt tokens its KV cache served
                answer["usage"] = {"prompt_tokens": len(prompt), "completion_tokens": len(gen.token_ids)}
                if self.cache_details:
                    answer["usage"]["prompt_tokens_details"] = {"cached_tokens": int(stats["prefill_reused"])}
            return answer

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            maybe_fail("/chat/completions", body)
            prompt = tokenizer.apply_chat_template(body["messages"], tokenize=False, add_generation_prompt=True)
            gen = self._generate(tokenizer.encode(prompt, add_special_tokens=False), body)
            text = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
            return {
                "id": "chat-1",
                "object": "chat.completion",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": gen.finish_reason}
                ],
            }

        self.rl_routes = True
        self.calls: list[str] = []
        self.weight_version: str | None = None
        self.paused = False
        self.requests_hold_blocks = False  # as vLLM with requests in flight: a plain prefix reset is refused
        self.refuse_prefix_reset = False  # as a server that keeps its cache whatever it is asked
        self.resume_fails = False

        def rl(route: str) -> None:
            if not self.rl_routes:
                raise HTTPException(404, "Not Found")
            self.calls.append(route)

        @app.post("/pause")
        async def pause(mode: str = "abort"):
            rl(f"pause?mode={mode}")
            self.paused = True
            return {"status": "paused"}

        @app.post("/resume")
        async def resume():
            rl("resume")
            if self.resume_fails:
                raise HTTPException(500, "resume broke")
            self.paused = False
            return {"status": "resumed"}

        @app.post("/collective_rpc")
        async def collective_rpc(request: Request):
            body = await request.json()
            rl(f"collective_rpc:{body['method']}")
            if body["method"] != "reload_weights":
                raise HTTPException(400, f"no method {body['method']}")
            self._reload(Path(body["kwargs"]["weights_path"]))
            return {"results": [None]}

        @app.post("/reset_prefix_cache")
        async def reset_prefix_cache(reset_running_requests: bool = False):
            rl(f"reset_prefix_cache?reset_running_requests={str(reset_running_requests).lower()}")
            held = self.requests_hold_blocks and not reset_running_requests
            return {"success": not (held or self.refuse_prefix_reset)}

        @app.post("/update_weight_version")
        async def update_weight_version(request: Request):
            self.weight_version = (await request.json())["new_version"]
            rl("update_weight_version")
            return {"success": True, "new_version": self.weight_version}

        @app.get("/weight_info")
        async def weight_info():
            rl("weight_info")
            return {"weight_version": self.weight_version}

        @app.get("/get_world_size")
        async def get_world_size():
            rl("get_world_size")
            return {"world_size": 1}

        self.lora_routes = True
        self.lora_enabled = True
        self.served_name: str | None = None
        self.adapters: dict = {}  # lora_name -> an HFBackend of the served model with the adapter merged
        self.lora_calls: list[tuple[str, str]] = []
        self.unloaded: dict = {}  # adapters loaded once, then unloaded (unknown names again), kept for tests

        def lora_error(status: int, kind: str, message: str) -> JSONResponse:
            error = {"message": message, "type": kind, "param": None, "code": status}
            return JSONResponse({"error": error}, status_code=status)

        @app.post("/v1/load_lora_adapter")
        async def load_lora_adapter(request: Request):
            if not self.lora_routes:
                raise HTTPException(404, "Not Found")
            body = await request.json()
            name, path = body.get("lora_name"), body.get("lora_path")
            self.lora_calls.append(("load", name))
            if not name or not path:
                return lora_error(400, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided.")
            if name in self.adapters:
                return lora_error(400, "InvalidUserInput", f"The lora adapter '{name}' has already been loaded.")
            if not self.lora_enabled:
                return lora_error(500, "InternalServerError", "LoRA is not enabled. Use --enable-lora to enable LoRA.")
            try:
                self.adapters[name] = self._with_adapter(Path(path))
            except Exception as exc:  # what peft refuses, vLLM refuses too
                return lora_error(400, "BadRequestError", f"Loading lora {name} failed: {exc}")
            return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

        @app.post("/v1/unload_lora_adapter")
        async def unload_lora_adapter(request: Request):
            if not self.lora_routes:
                raise HTTPException(404, "Not Found")
            name = (await request.json()).get("lora_name")
            self.lora_calls.append(("unload", name))
            if name not in self.adapters:
                return lora_error(404, "NotFoundError", f"The lora adapter '{name}' cannot be found.")
            self.unloaded[name] = self.adapters.pop(name)
            return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _served(self, name):
        """The backend serving model ``name``: an adapter's, or the base model's."""
        if name in self.adapters:
            return self.adapters[name]
        if name in self.unloaded or self.served_name is not None and name != self.served_name:
            raise HTTPException(404, f"The model `{name}` does not exist.")
        return self.backend

    def _with_adapter(self, folder: Path):
        """A copy of the served model with the peft adapter in ``folder`` on it (merged: served as one model)."""
        from peft import PeftModel

        from omrl.backends.hf import HFBackend

        model = PeftModel.from_pretrained(copy.deepcopy(self.backend.model), str(folder)).merge_and_unload()
        return HFBackend(model.eval(), self.tokenizer)

    def _generate(self, prompt: list[int], body: dict):
        backend = self._served(body.get("model"))
        self.backend.take_stats()
        params = SamplingParams(
            max_new_tokens=body.get("max_tokens", 16),
            temperature=body.get("temperature", 1.0),
            top_p=body.get("top_p", 1.0),
            seed=body.get("seed"),
        )
        gen = backend.generate([prompt], params)[0]
        if backend is not self.backend:  # the usage's cache figures are read from the base backend's stats
            self.backend.stats = backend.take_stats()
        return gen

    def _reload(self, folder: Path) -> None:
        """vLLM's reload_weights from a folder: every safetensors file in it, into the served model."""
        from safetensors.torch import load_file

        state = {}
        for file in sorted(folder.glob("*.safetensors")):
            state.update(load_file(str(file)))
        model = self.backend.model
        missing = set(model.state_dict()) - set(state) - {"lm_head.weight"}  # a tied head may be left out
        if missing:
            raise HTTPException(500, f"reload_weights: {sorted(missing)[:3]} missing")
        self.backend.update_weights(state)

    def start(self):
        self.thread.start()
        ready = threading.Event()
        # uvicorn sets `started` once it listens; wait on it without a fixed sleep
        while not self.server.started and self.thread.is_alive():
            ready.wait(0.01)
        if not self.server.started:
            raise RuntimeError("the fake OpenAI server did not start")
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
