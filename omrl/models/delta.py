"""A fine-tuned model as a small file: the low-rank part of how its weights moved from a base model.

Full fine-tuning of SmolLM2-135M moves every weight a little (about 0.2% of its norm); shipping the
tuned model would mean 540 MB. :func:`export_low_rank_delta` keeps, for each matrix, the top
``rank`` singular directions of ``tuned - base`` (as two int8 factors) and each vector (norms)
whole; :func:`apply_low_rank_delta` adds them back onto the base. Same idea as LoRA, found after the
fact by SVD instead of trained (the "extract LoRA from a fine-tune" recipe of PEFT users).

The export is deterministic: one thread for the SVD and a fixed key order, so the same two models
give the same bytes (``examples/learn_webshop.py --stage sft`` rebuilds the shipped file this way).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

import torch

from omrl.atomic import atomic_write_bytes
from omrl.errors import OmrlError

FORMAT = "omrl-low-rank-delta/1"
_ABOUT = "omrl_delta"  # the one metadata key: JSON with format, base model name and rank
_UP, _DOWN, _FULL, _SCALE = ".delta_up", ".delta_down", ".delta", ".scale"


def export_low_rank_delta(
    base: dict[str, torch.Tensor], tuned: dict[str, torch.Tensor], path: Path, rank: int, base_name: str
) -> dict[str, float]:
    """Write ``tuned - base`` at ``rank`` to ``path`` (safetensors); returns how much of it was kept.

    base, tuned: state dicts with the same keys and shapes. Each 2-D delta ``D`` (out, in) becomes
    ``up`` (out, rank) and ``down`` (rank, in) with ``up @ down`` its best rank-``rank``
    approximation, each factor in int8 with a float32 scale per rank component (half the bytes of
    float16: measured on WebShop, rank 32 in int8 beats rank 16 in float16); 1-D deltas are stored
    whole in float16. Returns ``kept``, the share of the delta's squared Frobenius norm the rank
    cut keeps, and ``parameters``, how many numbers the file stores.
    """
    from safetensors.torch import save

    if rank < 1:
        raise OmrlError(f"delta rank must be at least 1, got {rank}")
    if set(base) != set(tuned):
        raise OmrlError(f"the two models have different weights: {sorted(set(base) ^ set(tuned))[:5]}")
    tensors, total, kept = {}, 0.0, 0.0
    with _one_thread():
        for name in sorted(base):
            if base[name].shape != tuned[name].shape or base[name].dtype != tuned[name].dtype:
                # a bfloat16 copy of a float32 base differs from it by more than fine-tuning moved it
                raise OmrlError(
                    f"{name}: {tuple(base[name].shape)} {base[name].dtype} in the base, "
                    f"{tuple(tuned[name].shape)} {tuned[name].dtype} in the tuned model; "
                    "both must be saved with the same shapes and dtype"
                )
            delta = tuned[name].double() - base[name].double()
            total += float(delta.square().sum())
            if delta.ndim != 2:
                tensors[name + _FULL] = delta.half().contiguous()
                kept += float(delta.square().sum())
                continue
            u, s, vh = torch.linalg.svd(delta, full_matrices=False)
            root = s[:rank].sqrt()
            tensors[name + _UP], tensors[name + _UP + _SCALE] = _int8_columns(u[:, :rank] * root)
            down, scale = _int8_columns((root[:, None] * vh[:rank]).T)
            tensors[name + _DOWN], tensors[name + _DOWN + _SCALE] = down.T.contiguous(), scale
            kept += float(s[:rank].square().sum())
    # one metadata key: safetensors writes a map's keys in hash order, which changes from run to run
    about = json.dumps({"format": FORMAT, "base": base_name, "rank": rank}, sort_keys=True)
    atomic_write_bytes(path, save(tensors, metadata={_ABOUT: about}))
    return {"kept": kept / total if total else 1.0, "parameters": float(sum(t.numel() for t in tensors.values()))}


def apply_low_rank_delta(base: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """``base`` plus the delta in ``path``: a new state dict, in each weight's own dtype."""
    with _open(path) as f:
        meta = _about(f.metadata(), path)
        delta = {key: f.get_tensor(key) for key in f.keys()}
    changes: dict[str, torch.Tensor] = {}
    for key in sorted(delta):
        if key.endswith(_FULL):
            changes[key.removesuffix(_FULL)] = delta[key].float()
        elif key.endswith(_UP):
            name = key.removesuffix(_UP)
            parts = [name + _UP + _SCALE, name + _DOWN, name + _DOWN + _SCALE]
            if missing := [part for part in parts if part not in delta]:
                raise OmrlError(f"{path}: incomplete; {key} is there but not {', '.join(missing)}")
            up = delta[key].float() * delta[parts[0]]
            changes[name] = up @ (delta[parts[1]].float() * delta[parts[2]][:, None])
        elif not key.endswith((_DOWN, _SCALE)):
            raise OmrlError(
                f"{path}: unknown entry {key!r}; every entry ends in one of "
                f"{', '.join((_FULL, _UP, _DOWN, _UP + _SCALE, _DOWN + _SCALE))}"
            )
    out = dict(base)
    for name, change in changes.items():
        if name not in base:
            raise OmrlError(f"{path} changes {name!r}, which the base model ({meta.get('base')}) does not have")
        if change.shape != base[name].shape:
            raise OmrlError(f"{path}: {name} has shape {tuple(change.shape)}, the base {tuple(base[name].shape)}")
        out[name] = (base[name].float() + change).to(base[name].dtype)
    return out


def _int8_columns(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``matrix`` (rows, r) as int8 with one float32 scale per column: ``q * scale`` is within half a
    step (max |column| / 127) of each entry, far below what the rank cut already drops."""
    scale = matrix.abs().amax(dim=0).clamp_min(1e-30) / 127
    return (matrix / scale).round().to(torch.int8).contiguous(), scale.float().contiguous()


def file_digest(path: Path) -> str:
    """sha256 of a file, to check a rebuilt delta against the shipped one."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def describe(path: Path) -> dict:
    """What a delta file says of itself: format, base model name, rank."""
    with _open(path) as f:
        return _about(f.metadata(), path)


def _open(path: Path):
    from safetensors import safe_open

    if not Path(path).is_file():
        raise OmrlError(f"delta file {path} does not exist")
    try:
        return safe_open(str(path), framework="pt")
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for unreadable files
        raise OmrlError(f"{path}: not a readable delta file ({str(exc)[:200]})") from exc


def _about(metadata: dict[str, str] | None, path: Path) -> dict:
    try:
        about = json.loads((metadata or {})[_ABOUT])
    except (KeyError, ValueError):
        about = {}
    if about.get("format") != FORMAT:
        raise OmrlError(
            f"{path}: a safetensors file, but not an omrl delta (format {about.get('format')!r}, expected {FORMAT!r})"
        )
    return about


@contextlib.contextmanager
def _one_thread():
    """SVD results can differ in the last bit with the thread count; one thread makes bytes repeatable."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
