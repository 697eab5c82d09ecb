"""Reward models: an LM backbone with a one-number head, and scoring episodes with one.

Both kinds are a Hugging Face ``AutoModelForTokenClassification`` with one label: the
head gives a value at every token, and the kind says which tokens are read.

- ``orm`` (outcome): the value at an episode's last token scores the whole episode.
- ``prm`` (process): the value at each assistant turn's last token (its end-of-turn
  token) scores that turn.

The directory is an ordinary transformers model (safetensors, tokenizer, config.json);
``config.json`` also holds ``omrl_reward_model``: the kind, the objective and the label
it was trained on. With the ``bce`` objective a value is a logit and a score is its
sigmoid (a probability of success); with ``mse`` and ``bt`` a score is the raw value.
"""

from __future__ import annotations

import hashlib
import json
import math
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors import SafetensorError

from omrl.chat import encode_conversation
from omrl.data.trajectory import Episode
from omrl.errors import OmrlError
from omrl.models.folders import REWARD_MODEL_KEY, REWARD_MODEL_KINDS, reward_entry_problem
from omrl.models.loading import _DTYPES, check_model_files, load_tokenizer, resolve_model_path

CONFIG_KEY, KINDS = REWARD_MODEL_KEY, REWARD_MODEL_KINDS
OBJECTIVES = ("bce", "mse", "bt")  # binary cross-entropy on success, regression on a score, Bradley-Terry pairs


class RewardModelError(OmrlError):
    """A reward model that cannot be loaded or cannot score what it was given."""


@dataclass
class ScoringInput:
    """One sequence to score: its ids and the positions whose values are read (each a turn's, or the last).

    ``position_ids``: an episode that ``chat.history=as_template`` split into rows, packed (positions
    restart at each row), so each reply is read in the row it was generated in.
    """

    input_ids: list[int]
    positions: list[int]
    position_ids: list[int] | None = None


def build_reward_model(
    base: str,
    kind: str,
    objective: str,
    label: str,
    dtype: str = "float32",
    device: str = "cpu",
    trust_remote_code: bool = False,
) -> tuple[Any, Any]:
    """(model, tokenizer): the LM ``base`` (a built-in name, directory or hub id) with a fresh value head."""
    from transformers import AutoConfig, AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    check_kind(kind, objective)
    path = resolve_model_path(base)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the causal LM's head is unused and the value head new: both expected
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        config.num_labels, config.classifier_dropout = 1, 0.0  # a deterministic value: no dropout before the head
        model = AutoModelForTokenClassification.from_pretrained(
            path, config=config, dtype=_DTYPES[dtype], trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as exc:
        raise RewardModelError(f"cannot build a reward model on {base!r}: {exc}") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
    tokenizer = load_tokenizer(base, trust_remote_code)
    model.config.pad_token_id = tokenizer.pad_token_id
    setattr(model.config, CONFIG_KEY, {"kind": kind, "objective": objective, "label": label, "base": base})
    return model.to(device), tokenizer


def check_kind(kind: str, objective: str) -> None:
    """RewardModelError unless ``kind`` and ``objective`` are known and go together."""
    if kind not in KINDS:
        raise RewardModelError(f"unknown reward model kind {kind!r}; valid: {', '.join(KINDS)}")
    if objective not in OBJECTIVES:
        raise RewardModelError(f"unknown reward model objective {objective!r}; valid: {', '.join(OBJECTIVES)}")
    if kind == "prm" and objective == "bt":
        raise RewardModelError("objective 'bt' (pairs of whole episodes) is for kind 'orm'; a prm takes bce or mse")


def head_values(model: Any, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The head's value at every token: ids [bs, L] -> values [bs, L] (float32)."""
    out = model(input_ids=input_ids, position_ids=position_ids, use_cache=False)
    return out.logits[..., 0].float()


def mismatched_episode(tokenizer: Any, episodes: Sequence[Episode]) -> Episode | None:
    """The first episode whose prompt ids do not decode with ``tokenizer`` to its opening messages (made
    by another tokenizer), else None. Episodes opening with the same ids are checked once."""
    checked: set[tuple[int, ...]] = set()
    for ep in episodes:
        opening = next((" ".join(m["content"].split())[:60] for m in ep.messages if m.get("content", "").strip()), "")
        head = tuple(ep.token_ids[:64])
        if not ep.token_ids or not opening or head in checked:
            continue
        checked.add(head)
        decoded = tokenizer.decode(ep.token_ids[: max(ep.prompt_length, 1)], clean_up_tokenization_spaces=False)
        if opening not in " ".join(decoded.split()):
            return ep
    return None


def encode_episode_text(tokenizer: Any, ep: Episode) -> tuple[list[int], list[int]]:
    """An episode's chat re-encoded with ``tokenizer``: (ids, the position of each turn's last reply token).

    The worked example's replies are in the chat but are not turns of this episode,
    so their ends are left out; the env's words after the last reply are dropped.
    """
    messages = [m for m in ep.messages if m.get("role") in ("system", "user", "assistant", "tool")]
    while messages and messages[-1]["role"] != "assistant":
        messages = messages[:-1]
    if not messages:
        return [], []
    ids, mask = encode_conversation(tokenizer, messages)
    ends = [t for t in range(len(mask)) if mask[t] and (t + 1 == len(mask) or not mask[t + 1])]
    demo_replies = sum(m["role"] == "assistant" for m in ep.messages[1 : 1 + ep.demo_messages])
    return ids, ends[demo_replies:]


MEMO_ENTRIES = 100_000  # values remembered per model (a few MB); forgotten all at once when full


def _input_key(x: ScoringInput) -> bytes:
    """A digest of an input's ids and read positions."""
    digest = hashlib.blake2b(array("q", x.input_ids).tobytes(), digest_size=16)
    digest.update(array("q", [-1, *x.positions]).tobytes())
    if x.position_ids:
        digest.update(array("q", [-2, *x.position_ids]).tobytes())
    return digest.digest()


def _reward_meta(meta: Any, path: str) -> dict[str, Any]:
    """A reward model's ``omrl_reward_model`` entry of its config, or RewardModelError where ``path`` holds none."""
    problem = reward_entry_problem(meta)
    if problem:
        raise RewardModelError(f"{path or 'this model'} {problem}")
    return meta


class RewardModel:
    """A trained reward model, ready to score episodes (and search nodes) without gradients."""

    def __init__(self, model: Any, tokenizer: Any, path: str = "", batch_tokens: int = 8192):
        meta = _reward_meta(getattr(model.config, CONFIG_KEY, None), path)
        self.model, self.tokenizer, self.path = model.eval(), tokenizer, path
        self.kind, self.objective = meta["kind"], meta.get("objective", "bce")
        self.label = meta.get("label", "")
        self.batch_tokens = batch_tokens
        self._memo: dict[bytes, tuple[float, ...]] = {}  # input -> its values (weights never change here)

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu", dtype: str = "auto") -> "RewardModel":
        from transformers import AutoModelForTokenClassification

        path = Path(path).expanduser()
        if not (path / "config.json").exists():
            raise RewardModelError(
                f"reward model {str(path)!r} not found: expected a directory written by "
                "`omrl rm train` (with config.json)"
            )
        check_model_files(path)  # damaged since `omrl rm train` wrote it: named, never scored with
        # before loading: transformers would first print its report of the score head a policy lacks
        try:
            config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise RewardModelError(
                f"cannot load reward model {str(path)!r}: its config.json is not JSON ({exc})"
            ) from exc
        _reward_meta(config.get(CONFIG_KEY) if isinstance(config, dict) else None, str(path))
        try:
            model = AutoModelForTokenClassification.from_pretrained(path, dtype=_DTYPES.get(dtype, "auto"))
        except (OSError, ValueError, SafetensorError) as exc:
            raise RewardModelError(f"cannot load reward model {str(path)!r}: {exc}") from exc
        return cls(model.to(device), load_tokenizer(str(path)), str(path))

    # -- what is read ------------------------------------------------------------------------------
    def inputs(self, episodes: Sequence[Episode], text: bool = False) -> list[ScoringInput]:
        """Ids and read positions of each episode: the episode's own token ids (the policy's tokenizer
        must be this model's; checked), or with ``text`` its chat re-encoded with this model's tokenizer.

        Both read at the end of replies, where they were trained: an ``orm`` at the last reply's
        (an open search node's ids go on to the next turn's prompt, which no label ever sat on),
        a ``prm`` at each reply's.
        """
        out = []
        for ep in episodes:
            if text:
                ids, ends = encode_episode_text(self.tokenizer, ep)
                if len(ends) != len(ep.turns):
                    raise RewardModelError(
                        f"episode of task {ep.task_id} ({ep.env}) has {len(ep.turns)} turns but "
                        f"its chat re-encodes to {len(ends)} replies; it cannot be scored as text"
                    )
            else:
                ids, ends = list(ep.token_ids), [turn.span[1] - 1 for turn in ep.turns]
            if not ends:
                out.append(ScoringInput([], []))
                continue
            packed = ep.position_ids()[: ends[-1] + 1] if ep.row_starts and not text else None
            out.append(ScoringInput(ids[: ends[-1] + 1], ends[-1:] if self.kind == "orm" else ends, packed))
        return out

    def check_tokenizer(self, episodes: Sequence[Episode], policy_tokenizer: Any = None) -> None:
        """RewardModelError when the episodes' ids were not made with this model's tokenizer.

        With ``policy_tokenizer`` the vocabularies are compared; else each episode's
        opening ids are decoded with this model's tokenizer and must read back as its
        system message.
        """
        if policy_tokenizer is not None:
            if policy_tokenizer is self.tokenizer or policy_tokenizer.get_vocab() == self.tokenizer.get_vocab():
                return
            raise RewardModelError(self._tokenizer_message("the policy's tokenizer has a different vocabulary"))
        bad = mismatched_episode(self.tokenizer, episodes)
        if bad is not None:
            raise RewardModelError(
                self._tokenizer_message(
                    f"episode of task {bad.task_id} ({bad.env}) does not decode to its own messages with it"
                )
            )

    def _tokenizer_message(self, why: str) -> str:
        return (
            f"reward model {self.path or '(in memory)'} uses another tokenizer than the policy ({why}); "
            "train the reward model on the policy's base model, or set text=true to score the chat "
            "re-encoded with the reward model's own tokenizer"
        )

    # -- scoring -----------------------------------------------------------------------------------
    @torch.no_grad()
    def values(self, inputs: Sequence[ScoringInput]) -> list[list[float]]:
        """The head's values at each input's read positions, in micro-batches of similar length.

        Values of inputs scored before are remembered (a search scores a node again each
        round; ``omrl rm eval`` reads an ORM's episodes for its metrics and its selection).
        """
        out: list[list[float]] = [[] for _ in inputs]
        keys = [_input_key(x) for x in inputs]
        for i, key in enumerate(keys):
            if key in self._memo:
                out[i] = list(self._memo[key])
        order = sorted(
            (i for i, x in enumerate(inputs) if x.positions and keys[i] not in self._memo),
            key=lambda i: len(inputs[i].input_ids),
        )
        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and (end - start + 1) * len(inputs[order[end]].input_ids) <= self.batch_tokens:
                end += 1
            chunk = order[start:end]
            width = max(len(inputs[i].input_ids) for i in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            for row, i in enumerate(chunk):  # right padding: causal attention keeps real tokens blind to it
                ids[row, : len(inputs[i].input_ids)] = torch.tensor(inputs[i].input_ids)
            positions = None
            if any(inputs[i].position_ids for i in chunk):  # packed rows: positions restart, padding continues
                positions = torch.arange(width).repeat(len(chunk), 1)
                for row, i in enumerate(chunk):
                    given = inputs[i].position_ids or list(range(len(inputs[i].input_ids)))
                    positions[row, : len(given)] = torch.tensor(given)
                    positions[row, len(given) :] = torch.arange(given[-1] + 1, given[-1] + 1 + width - len(given))
                positions = positions.to(device)
            values = head_values(self.model, ids.to(device), positions).cpu()
            for row, i in enumerate(chunk):
                out[i] = [float(values[row, p]) for p in inputs[i].positions]
                if len(self._memo) >= MEMO_ENTRIES:
                    self._memo.clear()
                self._memo[keys[i]] = tuple(out[i])
            start = end
        return out

    def to_score(self, value: float) -> float:
        """A head value as a score: a probability for ``bce``, the value itself otherwise."""
        if self.objective == "bce":
            return 1.0 / (1.0 + math.exp(-value)) if value >= 0 else math.exp(value) / (1.0 + math.exp(value))
        return value

    def score_turns(
        self, episodes: Sequence[Episode], text: bool = False, policy_tokenizer: Any = None
    ) -> list[list[float]]:
        """One score per turn of each episode: a ``prm``'s score of every turn, or an ``orm``'s score of
        the whole episode on its last turn (0 elsewhere). Episodes without turns get ``[]``."""
        if not text:
            self.check_tokenizer(episodes, policy_tokenizer)
        values = self.values(self.inputs(episodes, text))
        out = []
        for ep, vals in zip(episodes, values):
            n = len(ep.turns)
            if n == 0 or not vals:
                out.append([0.0] * n)
            elif self.kind == "orm":
                out.append([0.0] * (n - 1) + [self.to_score(vals[0])])
            else:
                scores = [self.to_score(v) for v in vals][:n]
                out.append(scores + [0.0] * (n - len(scores)))
        return out

    def score_episodes(
        self, episodes: Sequence[Episode], text: bool = False, policy_tokenizer: Any = None
    ) -> list[float]:
        """One number per episode: an ``orm``'s score, or a ``prm``'s score of the last turn (the value of
        where the path got to). Episodes without turns score 0."""
        return [turns[-1] if turns else 0.0 for turns in self.score_turns(episodes, text, policy_tokenizer)]


_LOADED: dict[tuple, RewardModel] = {}


def cached_reward_model(path: str, device: str = "cpu") -> RewardModel:
    """The reward model at ``path``, loaded once per process (a reward plugin or scorer calls this every
    step); loaded again when its config.json changed (a model retrained into the same directory)."""
    resolved = Path(path).expanduser().resolve()
    config = resolved / "config.json"
    key = (str(resolved), device, config.stat().st_mtime_ns if config.exists() else 0)
    if key not in _LOADED:
        for stale in [k for k in _LOADED if k[:2] == key[:2]]:
            del _LOADED[stale]
        _LOADED[key] = RewardModel.load(path, device=device)
    return _LOADED[key]
