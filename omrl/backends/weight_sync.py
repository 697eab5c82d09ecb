"""Trained weights into a running generation server (``generation.weight_sync``, openai backend).

A ``vllm serve`` started with ``VLLM_SERVER_DEV_MODE=1`` offers vLLM's own RL routes: ``/pause``
(``mode=keep`` freezes requests in flight, which go on under the new weights after ``/resume``),
``/resume``, the weight-transfer protocol (``/init_weight_transfer_engine``,
``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``), ``/collective_rpc``,
``/reset_prefix_cache`` and ``/update_weight_version``. Two ways to move the weights:

- ``files``: the trainer writes the state dict as one safetensors file under ``weight_dir`` (a
  folder the server can read: the same machine, or shared storage) and the server's workers
  reload it in place (``reload_weights`` with ``weights_path``). Works wherever vLLM runs, the
  CPU included; costs a write and a read of the weights per update. The run's folder and files
  are as readable as the user's umask makes new files (022: by everyone; 027: by the group; 077:
  by the user alone), so a server under another user reads them where the umask allows it. Each
  run's folder names its host and process; a run removes the folders of runs on its host that
  are gone (killed before they could remove theirs).
- ``nccl``: vLLM's weight-transfer engine. The trainer joins the server's workers in an NCCL group
  (rank 0, listening on ``address``) and broadcasts the weights GPU to GPU; the server must be
  started with ``--weight-transfer-config '{"backend": "nccl"}'``. Needs CUDA and vllm on the
  trainer's machine, and a network path between the GPUs.

- ``lora`` (a run with ``model.lora_rank > 0``): only the adapter, loaded under a new name per
  version through vLLM's ``/v1/load_lora_adapter`` (:mod:`omrl.backends.lora_sync`).

``files`` or ``nccl``, an update is: pause (keep), move the weights, drop cached prefixes (their KV states
came from the old weights), name the new version, resume. The server's answers are checked; a
route the server does not offer is an error that says how to start it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Mapping

import httpx
import torch

from omrl.atomic import umask
from omrl.errors import ConfigError, OmrlError

WEIGHT_SYNCS = ("none", "files", "nccl", "lora")
SERVER_HINT = (
    "start the server with VLLM_SERVER_DEV_MODE=1 (vLLM's RL routes), e.g. "
    "VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --enable-prompt-tokens-details"
)


class ServerControl:
    """vLLM's RL routes at the server's root (``base_url`` without its ``/v1``)."""

    def __init__(self, base_url: str, timeout: float = 600.0, transport: httpx.BaseTransport | None = None):
        root = base_url.rstrip("/")
        root = root[: -len("/v1")] if root.endswith("/v1") else root
        self.root = root
        self.client = httpx.Client(base_url=root, timeout=httpx.Timeout(timeout, connect=10.0), transport=transport)

    def call(self, method: str, route: str, **kwargs: Any) -> Any:
        """The JSON answer of ``route`` (None for an empty one); an error naming the route otherwise."""
        url = f"{self.root}/{route}"
        try:
            reply = self.client.request(method, route, **kwargs)
        except httpx.TransportError as exc:
            raise OmrlError(f"cannot reach the generation server at {url}: {exc}") from exc
        if reply.status_code in (404, 405):
            raise OmrlError(f"the generation server has no {method} /{route} (HTTP {reply.status_code}); {SERVER_HINT}")
        if reply.status_code >= 300:
            raise OmrlError(f"{url} answered HTTP {reply.status_code}: {reply.text[:300]}")
        if not reply.content:
            return None
        try:
            return reply.json()
        except ValueError as exc:
            raise OmrlError(f"{url} answered something that is not JSON: {reply.text[:300]!r}") from exc

    def post(self, route: str, body: Any = None, **params: Any) -> Any:
        return self.call("POST", route, json=body, params=params or None)

    def close(self) -> None:
        self.client.close()


class WeightSync(ABC):
    """One way to move weights into the server (:meth:`send`); :meth:`push` is one whole update."""

    def __init__(self, control: ServerControl):
        self.control = control

    def push(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """One update: the server holds ``state_dict`` as version ``version`` (the trainer's updates so
        far) when this returns, and is resumed whatever happens."""
        self.prepare()  # before the pause: a transport that cannot start must not stall the server
        self.control.post("pause", mode="keep")
        try:
            self.send(state_dict)
            # every cached KV state came from the old weights, those of the requests frozen in flight
            # too: they are recomputed under the new weights (vLLM refuses a reset while requests hold
            # blocks unless they are reset with it)
            answer = self.control.post("reset_prefix_cache", reset_running_requests="true")
            if not (isinstance(answer, dict) and answer.get("success") is True):
                raise OmrlError(
                    f"the generation server did not drop its prefix cache after new weights ({answer!r}); "
                    "later requests could reuse KV states of the old weights"
                )
            self.control.post("update_weight_version", {"new_version": str(version)})
        except BaseException as failure:
            try:
                self.control.post("resume")
            except OmrlError as also:  # the update's own failure is the one to report, with this beside it
                if isinstance(failure, OmrlError):
                    raise OmrlError(f"{failure} (and resuming the server failed too: {also})") from failure
            raise
        self.control.post("resume")

    def prepare(self) -> None:
        """Set up the transport, if it needs to (once)."""

    @abstractmethod
    def send(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Move ``state_dict`` into the paused server's model."""

    def close(self) -> None:
        self.control.close()


class FileSync(WeightSync):
    """The weights as a safetensors file the server reloads in place."""

    def __init__(self, control: ServerControl, weight_dir: str = ""):
        super().__init__(control)
        self.root = run_folder(weight_dir)
        self.written: Path | None = None
        self.count = 0

    def send(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        self.count += 1
        folder = write_version(
            self.root, f"update-{self.count}", lambda at: save_file(unshared(state_dict), str(at / "model.safetensors"))
        )
        answer = self.control.post(
            "collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
        )
        _check_rpc(answer, "reload_weights")
        if self.written is not None:
            shutil.rmtree(self.written, ignore_errors=True)
        self.written = folder

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        super().close()


FOLDER_PREFIX = "omrl-server-weights-"
_OWNED = re.compile(re.escape(FOLDER_PREFIX) + r"(?P<host>.+)-(?P<pid>\d+)-(?P<start>\d+)-[^-]+")


def run_folder(weight_dir: str) -> Path:
    """A folder of this run's own under ``weight_dir`` (empty: the temp folder), removed on close: runs (or
    a resumed run) sharing weight_dir never meet. Absolute, since the server resolves the path in its
    own working directory; as readable as the umask allows (mkdtemp's 0700 would shut out a server
    under another user). The folders of killed runs on this host are removed first."""
    parent = Path(weight_dir).resolve() if weight_dir else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale_folders(parent)
    root = Path(tempfile.mkdtemp(prefix=_folder_prefix(os.getpid()), dir=parent))
    root.chmod(0o777 & ~umask())
    return root


def write_version(root: Path, name: str, write: Callable[[Path], None]) -> Path:
    """``root/name``, its files made by ``write(folder)`` in a partial folder that is renamed into place
    whole (the server never sees a half-written file), each as readable as the umask allows
    (safetensors writes 0600 whatever the umask)."""
    folder, partial = root / name, root / f".{name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    write(partial)
    for file in partial.iterdir():
        file.chmod(0o666 & ~umask())
    partial.rename(folder)
    return folder


def _folder_prefix(pid: int) -> str:
    """The start of a run's folder name: its host, its process and when that process started (a pid is
    reused; the pair is not)."""
    return f"{FOLDER_PREFIX}{socket.gethostname()}-{pid}-{_start_time(pid)}-"


def remove_stale_folders(parent: Path) -> None:
    """Remove the weight folders in ``parent`` that runs on this host left behind when killed (their
    process is gone, or is another one under a reused pid); another host's, or an older omrl's, stay."""
    for folder in parent.glob(f"{FOLDER_PREFIX}*"):
        owner = _OWNED.fullmatch(folder.name)
        if owner is None or owner["host"] != socket.gethostname() or not folder.is_dir():
            continue
        pid = int(owner["pid"])
        if not _alive(pid) or _start_time(pid) != int(owner["start"]):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _start_time(pid: int) -> int:
    """When process ``pid`` started, in clock ticks since boot (Linux's /proc); 0 where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


class NcclSync(WeightSync):
    """vLLM's NCCL weight-transfer engine, set up at the first push (the weights' device known then)."""

    def __init__(self, control: ServerControl, address: str = ""):
        super().__init__(control)
        try:
            import vllm.distributed.weight_transfer.factory  # noqa: F401
        except ImportError as exc:
            raise ConfigError(
                "generation.weight_sync=nccl drives vLLM's weight-transfer engine from the trainer, which "
                f"needs vllm here (pip install 'omrl[vllm]'; import failed: {exc}); valid without it: files"
            ) from exc
        if not torch.cuda.is_available():
            raise ConfigError("generation.weight_sync=nccl broadcasts from a CUDA GPU; none here (valid: files)")
        host, _, port = (address or "").rpartition(":")
        self.host = host or _address_towards(self.control.root)
        self.port = int(port) if port else _free_port()
        self.engine: Any = None
        self.source: Any = None

    def prepare(self) -> None:
        if self.engine is None:
            self.engine, self.source = self._start()

    def send(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.source.state = state_dict
        self.engine.send_weights()  # start, update (beside the broadcast), finish

    def _start(self) -> tuple[Any, Any]:
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        workers = self.control.call("GET", "get_world_size")
        if not isinstance(workers, dict) or not isinstance(workers.get("world_size"), int):
            raise OmrlError(f"the generation server's /get_world_size answered {workers!r}")
        info = NCCLTrainerInitInfo(
            master_address=self.host, master_port=self.port, world_size=1 + workers["world_size"], rank=0
        )
        source = _state_source()
        try:
            engine = WeightTransferTrainerFactory.trainer_init(
                info, client=HTTPVLLMWeightSyncClient(self.control.root), source=source
            )
        except Exception as exc:  # vLLM waits for the workers' rendezvous, then names only the timeout
            raise OmrlError(
                f"the NCCL weight transfer with the generation server did not start ({type(exc).__name__}: "
                f'{exc}); was it started with --weight-transfer-config \'{{"backend": "nccl"}}\', and can '
                f"its GPUs reach {self.host}:{self.port} (generation.weight_sync_address)?"
            ) from exc
        return engine, source

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            try:  # the server drops its side of the group; it serves on either way
                self.control.post("shutdown_weight_transfer_engine")
            except OmrlError:
                pass
        super().close()


def make_weight_sync(generation: Any, model_name: str = "") -> Any:
    """The ``generation.weight_sync`` of an openai backend (None for ``none``; a config from before
    the option has none): a :class:`WeightSync`, or for ``lora`` a :class:`omrl.backends.lora_sync.LoraSync`
    whose adapters are named after ``model_name``."""
    kind = sync_kind(generation)
    if kind == "none":
        return None
    control = ServerControl(generation.base_url)
    if kind == "lora":
        from omrl.backends.lora_sync import LoraSync

        return LoraSync(control, model_name, generation.weight_dir, keep=getattr(generation, "lora_keep", 1))
    if kind == "files":
        return FileSync(control, generation.weight_dir)
    return NcclSync(control, generation.weight_sync_address)


def sync_kind(generation: Any) -> str:
    """``generation.weight_sync``, checked (a config from before the option has none)."""
    kind = getattr(generation, "weight_sync", "none")
    if kind not in WEIGHT_SYNCS:
        raise ConfigError(f"unknown generation.weight_sync {kind!r}; valid: {', '.join(WEIGHT_SYNCS)}")
    return kind


def check_weight_sync(generation: Any, trains: bool, lora_rank: int = 0) -> None:
    """Refuse a weight_sync the backend cannot use, and a training run whose server gets no weights."""
    kind = sync_kind(generation)
    if kind != "none" and generation.backend != "openai":
        raise ConfigError(
            f"generation.weight_sync={kind} sends weights to a server (generation.backend=openai); the "
            f"{generation.backend} backend gets them in process: leave generation.weight_sync=none"
        )
    if trains and generation.backend == "openai" and kind == "none":
        wanted = (
            f"generation.weight_sync=lora (model.lora_rank={lora_rank}: only the adapter is sent)"
            if lora_rank
            else "generation.weight_sync=files (any vLLM server that can read generation.weight_dir) or nccl (GPU to GPU)"
        )
        raise ConfigError(
            f"training with generation.backend=openai needs the trained weights on the server: set {wanted}; "
            "without it every step would sample from the first weights"
        )
    if kind in ("files", "nccl") and lora_rank:
        raise ConfigError(
            f"generation.weight_sync={kind} sends the model's full weights; model.lora_rank={lora_rank} trains "
            "adapters: set generation.weight_sync=lora (the adapter alone, to a server started with "
            "--enable-lora), or model.lora_rank=0"
        )
    if kind == "lora" and trains and not lora_rank:
        raise ConfigError(
            "generation.weight_sync=lora sends LoRA adapters and model.lora_rank=0 trains all weights: set "
            "model.lora_rank > 0, or generation.weight_sync=files or nccl"
        )
    keep = getattr(generation, "lora_keep", 1)
    if kind == "lora" and (not isinstance(keep, int) or keep < 0):
        raise ConfigError(f"generation.lora_keep must be an integer >= 0 (older adapter versions kept), got {keep!r}")


def _check_rpc(answer: Any, method: str) -> None:
    """A collective_rpc answers one result per worker; an error string from any is an error."""
    results = answer.get("results") if isinstance(answer, dict) else None
    if answer is not None and not isinstance(results, list):
        raise OmrlError(f"the generation server's {method} answered {json.dumps(answer)[:300]}")
    for result in results or []:
        if result is not None:
            raise OmrlError(f"the generation server's {method} answered {str(result)[:300]}")


def unshared(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU tensors that share no memory (safetensors refuses tied weights as one tensor twice)."""
    seen: set[int] = set()
    out = {}
    for name, tensor in state_dict.items():
        tensor = tensor.detach().to("cpu")
        key = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone(memory_format=torch.contiguous_format) if key in seen else tensor.contiguous()
        seen.add(key)
    return out


def _address_towards(url: str) -> str:
    """This machine's address on the route to ``url``'s host (what the server's workers can reach)."""
    host = httpx.URL(url).host or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, 9))  # no packet is sent: this only picks the route
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _state_source() -> Any:
    """A vLLM ``WeightSource`` over the state dict set on it before each send."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class StateSource(WeightSource):
        state: Mapping[str, torch.Tensor] = {}

        def metadata(self) -> list[Any]:
            return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in self.state.items()]

        def __iter__(self):
            for name, tensor in self.state.items():  # NCCL broadcasts from the GPU
                yield name, tensor.to("cuda", non_blocking=True)

    return StateSource()
