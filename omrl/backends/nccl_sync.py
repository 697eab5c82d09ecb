"""``generation.weight_sync=nccl``: the trainer joins the server's workers in an NCCL group through
vLLM's weight-transfer engine and broadcasts the weights GPU to GPU (see :mod:`.weight_sync`)."""

from __future__ import annotations

import socket
from typing import Any, Mapping

import httpx
import torch

from omrl.backends.server_control import ServerControl
from omrl.backends.weight_sync import WeightSync
from omrl.errors import ConfigError, OmrlError


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
