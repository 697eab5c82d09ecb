"""LoRA adapters into a running vLLM server (``generation.weight_sync=lora``, openai backend).

A run that trains LoRA adapters (``model.lora_rank > 0``) sends the server only the adapter after each
update: the trainer writes it in peft's format (``adapter_model.safetensors`` and
``adapter_config.json``) into a folder of its own, one per version, and asks the server to load it
under a new name (``POST /v1/load_lora_adapter {"lora_name", "lora_path"}``); requests then name that
adapter as their ``model``. The base weights never move. The server must be started with LoRA enabled
and runtime loading allowed::

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve MODEL --enable-lora --max-lora-rank 16 --max-loras 2

No pause and no prefix-cache reset are needed: requests in flight finish under the adapter they
named, and vLLM keys its cached KV states by adapter, so a new adapter never reuses an old one's.

Each episode plays every turn with the adapter version it started with: the backend pins a
conversation to the version that sampled its last turn, found from the token prefix the next prompt
repeats (the rollout passes no episode identity to ``generate``; a turn's prompt always starts with
the previous turn's prompt and reply). ``generation.lora_keep`` older versions stay loaded beside the
newest; older ones are unloaded (``POST /v1/unload_lora_adapter``) and their folders removed. An
episode whose version was unloaded goes on under the newest, and every turn records the version that
sampled it (``Generation.weights_version``, kept in ``Turn.info["weights_version"]``), so such a
switch is in the trajectory.
"""

from __future__ import annotations

import json
import secrets
import shutil
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

import httpx
import torch

from omrl.backends.server_control import ServerControl
from omrl.backends.weight_files import run_folder, unshared, write_version
from omrl.errors import OmrlError

LORA_HINT = (
    "start the server with LoRA enabled and runtime adapter loading allowed, e.g. "
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve MODEL --enable-lora --max-lora-rank R "
    "(R >= model.lora_rank) --max-loras K (K >= generation.lora_keep + 1)"
)
_HASH_BASE = 1_000_003
_HASH_MOD = (1 << 61) - 1  # a Mersenne prime: prefix hashes of different token lists collide ~2**-61


def lora_config_of(model: Any) -> dict[str, Any] | None:
    """The ``adapter_config.json`` of a peft model's active LoRA adapter; None for a model without one."""
    model = getattr(model, "module", model)  # a DDP wrapper's model
    configs = getattr(model, "peft_config", None)
    if not configs:
        return None
    name = getattr(model, "active_adapter", "default")
    config = configs[name if isinstance(name, str) else name[0]].to_dict()
    # peft keeps some fields as sets and enums; the file holds lists and strings
    return json.loads(json.dumps(config, default=lambda v: sorted(v) if isinstance(v, set) else str(v)))


def _hint(refusal: str) -> str:
    """What to change where the server refused an adapter: its LoRA settings, or the run's."""
    text = refusal.lower()
    if "max_lora_rank" in text:
        return "; the server's --max-lora-rank must be at least model.lora_rank (or lower model.lora_rank)"
    if "target modules" in text or "unsupported lora weight" in text:
        return (
            "; vLLM serves adapters on some modules only (attention and MLP projections, not lm_head or "
            "embed_tokens): set model.lora_target_modules to those it names"
        )
    return f"; {LORA_HINT}" if "lora" in text and "enable" in text else ""


def adapter_state(state_dict: Mapping[str, torch.Tensor], adapter: str = "default") -> dict[str, torch.Tensor]:
    """The LoRA weights of a peft model's state dict under the names peft saves them with (the
    adapter's name dropped: ``...q_proj.lora_A.default.weight`` -> ``...q_proj.lora_A.weight``)."""
    tag = f".{adapter}."
    out = {}
    for name, tensor in state_dict.items():
        if ".lora_" in name and tag in name:
            out[name.replace(tag, ".", 1)] = tensor
    return out


class ConversationPins:
    """The weight version each conversation plays under, found from a prompt's token prefix."""

    def __init__(self) -> None:
        self.versions: dict[tuple[int, int], int] = {}  # (length, prefix hash) of a sampled turn's end
        self.lengths: set[int] = set()
        self.lock = threading.Lock()  # generate's requests run in threads

    def record(self, tokens: Sequence[int], version: int) -> None:
        """``tokens`` (a prompt and its reply) were sampled under ``version``."""
        key = (len(tokens), _prefix_hashes(tokens)[-1])
        with self.lock:
            self.versions[key] = version  # the latest wins: an identical conversation played again
            self.lengths.add(len(tokens))

    def find(self, prompt: Sequence[int]) -> int | None:
        """The version of the longest recorded conversation ``prompt`` continues; None for a new one."""
        hashes = _prefix_hashes(prompt)
        with self.lock:
            for length in sorted((n for n in self.lengths if n <= len(prompt)), reverse=True):
                version = self.versions.get((length, hashes[length]))
                if version is not None:
                    return version
        return None

    def forget(self, versions: set[int]) -> None:
        """Drop the conversations pinned to ``versions`` (unloaded)."""
        with self.lock:
            self.versions = {k: v for k, v in self.versions.items() if v not in versions}
            self.lengths = {length for length, _ in self.versions}


def _prefix_hashes(tokens: Sequence[int]) -> list[int]:
    """Polynomial hashes of every prefix of ``tokens`` (entry n: the first n), in one pass."""
    out = [0]
    h = 0
    for token in tokens:
        h = (h * _HASH_BASE + int(token) + 1) % _HASH_MOD
        out.append(h)
    return out


class LoraSync:
    """Adapters pushed as new named versions; :meth:`model_for` names the adapter a prompt plays under."""

    def __init__(self, control: ServerControl, base_model: str, weight_dir: str = "", keep: int = 1):
        if keep < 0:
            raise OmrlError(f"generation.lora_keep must be >= 0 (older adapter versions kept loaded), got {keep}")
        self.control = control
        self.keep = keep
        # a name of this run's own: two runs on one server never load over each other's adapters
        self.prefix = f"{Path(base_model).name or 'model'}-omrl-{secrets.token_hex(3)}"
        self.root = run_folder(weight_dir)  # the server may run as another user
        self.loaded: dict[int, tuple[str, Path]] = {}  # version -> (adapter name, folder), oldest first
        self.pushes = 0
        self.pins = ConversationPins()
        self.bytes_sent = 0  # of the last push's files

    def push(self, state_dict: Mapping[str, torch.Tensor], version: int, lora_config: Mapping[str, Any]) -> None:
        """Write the adapter of ``state_dict`` (a peft model's, or already peft's saved names) as version
        ``version``, load it on the server under a new name, and unload the versions past ``keep``."""
        if not lora_config:
            raise OmrlError(
                "generation.weight_sync=lora sends a LoRA adapter, and the trained model has none "
                "(model.lora_rank=0); set model.lora_rank > 0, or generation.weight_sync=files for full weights"
            )
        weights = adapter_state(state_dict) or {k: v for k, v in state_dict.items() if ".lora_" in k}
        if not weights:
            raise OmrlError(f"the state dict to push holds no LoRA weights (names like {next(iter(state_dict), '')!r})")
        folder = self._write(weights, lora_config)
        name = f"{self.prefix}-v{version}"
        if version in self.loaded:  # the same version again (a resumed run): a fresh load, never a stale one
            self._unload(version)
        self._load(name, folder)
        self.loaded[version] = (name, folder)
        self._unload_older(version)

    def model_for(self, prompt: Sequence[int]) -> tuple[str, int] | None:
        """The adapter name and version ``prompt`` plays under: its conversation's, while loaded, else the
        newest; None before the first push (the base model's name then)."""
        if not self.loaded:
            return None
        pinned = self.pins.find(prompt)
        version = pinned if pinned in self.loaded else max(self.loaded)
        return self.loaded[version][0], version

    def record(self, prompt: Sequence[int], reply: Sequence[int], version: int) -> None:
        self.pins.record(list(prompt) + list(reply), version)

    def _write(self, weights: Mapping[str, torch.Tensor], lora_config: Mapping[str, Any]) -> Path:
        from safetensors.torch import save_file

        self.pushes += 1

        def write(at: Path) -> None:
            save_file(unshared(weights), str(at / "adapter_model.safetensors"))
            (at / "adapter_config.json").write_text(json.dumps(dict(lora_config), indent=2))

        folder = write_version(self.root, f"adapter-{self.pushes}", write)
        self.bytes_sent = sum(file.stat().st_size for file in folder.iterdir())
        return folder

    def _load(self, name: str, folder: Path) -> None:
        answer = self._post("v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})
        if "success" not in answer.lower():  # vLLM answers "Success: LoRA adapter 'NAME' added successfully."
            raise OmrlError(f"the generation server did not load adapter {name!r} from {folder}: {answer[:300]!r}")

    def _unload(self, version: int) -> None:
        name, folder = self.loaded.pop(version)
        answer = self._post("v1/unload_lora_adapter", {"lora_name": name})
        if "success" not in answer.lower():
            raise OmrlError(f"the generation server did not unload adapter {name!r}: {answer[:300]!r}")
        shutil.rmtree(folder, ignore_errors=True)
        self.pins.forget({version})

    def _unload_older(self, newest: int) -> None:
        """Unload every version more than ``keep`` versions before ``newest``."""
        for version in [v for v in self.loaded if v < newest - self.keep]:
            self._unload(version)

    def _post(self, route: str, body: dict[str, Any]) -> str:
        """The text of ``route``'s answer (vLLM answers these routes in plain text); an error naming the
        route, and how to start the server when it lacks it."""
        url = f"{self.control.root}/{route}"
        try:
            reply = self.control.client.post(route, json=body)
        except httpx.TransportError as exc:
            raise OmrlError(f"cannot reach the generation server at {url}: {exc}") from exc
        if reply.status_code in (404, 405) and _route_missing(reply):
            raise OmrlError(f"the generation server has no POST /{route} (HTTP {reply.status_code}); {LORA_HINT}")
        if reply.status_code >= 300:
            raise OmrlError(f"{url} answered HTTP {reply.status_code}: {reply.text[:300]}{_hint(reply.text)}")
        return reply.text

    def close(self) -> None:
        """Unload what this run loaded (best effort: the server may be gone) and remove its folders."""
        for version in list(self.loaded):
            try:
                self._unload(version)
            except OmrlError:
                break
        shutil.rmtree(self.root, ignore_errors=True)
        self.control.close()


def _route_missing(reply: httpx.Response) -> bool:
    """A 404 of the route itself (FastAPI's ``{"detail": "Not Found"}``), not vLLM's for an unknown adapter."""
    try:
        body = reply.json()
    except ValueError:
        return True
    return not (isinstance(body, dict) and isinstance(body.get("error"), dict))
