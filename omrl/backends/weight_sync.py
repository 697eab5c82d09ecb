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
  trainer's machine, and a network path between the GPUs (:mod:`omrl.backends.nccl_sync`).

- ``lora`` (a run with ``model.lora_rank > 0``): only the adapter, loaded under a new name per
  version through vLLM's ``/v1/load_lora_adapter`` (:mod:`omrl.backends.lora_sync`).

``files`` or ``nccl``, an update is: pause (keep), move the weights, drop cached prefixes (their KV states
came from the old weights), name the new version, resume. The server's answers are checked; a
route the server does not offer is an error that says how to start it (:mod:`omrl.backends.server_control`).
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Mapping

import torch

from omrl.backends.server_control import ServerControl, check_rpc
from omrl.backends.sync_settings import sync_kind
from omrl.backends.weight_files import run_folder, unshared, write_version
from omrl.errors import OmrlError

__all__ = ["FileSync", "ServerControl", "WeightSync", "make_weight_sync"]


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
        check_rpc(answer, "reload_weights")
        if self.written is not None:
            shutil.rmtree(self.written, ignore_errors=True)
        self.written = folder

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
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
    from omrl.backends.nccl_sync import NcclSync  # vllm's engine, imported only where it is used

    return NcclSync(control, generation.weight_sync_address)
