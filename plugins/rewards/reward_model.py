"""The ``rm`` reward: a trained reward model's scores (see :mod:`omrl.rm.model`).

Set with ``reward.weights={rm: 1.0}`` and ``plugins.rm.path=DIR`` (a directory written
by ``omrl rm train``). The search scorer ``rm`` reads the same ``plugins.rm`` block.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omrl.data.trajectory import Episode
from omrl.errors import ConfigError
from omrl.models.folders import reward_model_problem


def load_reward_model(path: Any, text: Any, device: Any, what: str = "reward 'rm'"):
    """The reward model at ``path``, loaded once per process, after checking the options a user wrote."""
    from omrl.rm.model import cached_reward_model  # torch and transformers: only when an rm is used

    check_rm_options(path, text, device, what)
    return cached_reward_model(path, device)


def check_rm_options(path: Any = "", text: Any = False, device: Any = "cpu", what: str = "reward 'rm'") -> None:
    """The options of the ``rm`` reward (its ``check_options`` trait) and scorer, checked without loading
    the model: a path that holds no model is refused before a run plays its first rollout."""
    if not isinstance(path, str) or not path:
        raise ConfigError(
            f"{what} needs the option path (a reward model directory written by `omrl rm train`), "
            f"got {path!r}; set it with plugins.rm.path=DIR"
        )
    if not isinstance(text, bool):
        raise ConfigError(
            f"{what} option text={text!r} is invalid; valid: true (score the chat re-encoded with "
            "the reward model's tokenizer) or false (score the policy's token ids)"
        )
    if not isinstance(device, str) or not device:
        raise ConfigError(f"{what} option device={device!r} is invalid; valid: a torch device such as cpu or cuda")
    if not (Path(path).expanduser() / "config.json").is_file():
        raise ConfigError(
            f"{what} option path={path!r} holds no reward model: expected a directory written by "
            "`omrl rm train` (with config.json)"
        )
    problem = reward_model_problem(Path(path).expanduser())
    if problem:
        raise ConfigError(f"{what} option path={path!r} holds no reward model: {problem}")


def check_rm_tokenizer(tokenizer: Any, path: Any = "", text: Any = False, device: Any = "cpu") -> None:
    """The ``rm`` reward's ``check_tokenizer`` trait: scoring the policy's token ids (``text`` off) needs the
    reward model's tokenizer to be the policy's; its tokenizer files are read here, not its weights."""
    if text:  # the chat is encoded again with the reward model's own tokenizer
        return
    from omrl.models import load_tokenizer

    check_rm_options(path, text, device)
    own = load_tokenizer(str(Path(path).expanduser()))
    if own.get_vocab() != tokenizer.get_vocab():
        raise ConfigError(
            f"reward 'rm' at {path} uses another tokenizer than the policy {tokenizer.name_or_path} (their "
            "vocabularies differ), so it cannot score the policy's token ids: train the reward model on the "
            "policy's base model, or set plugins.rm.text=true to score each chat encoded again with the reward "
            "model's own tokenizer"
        )


def rm_reward(episodes: list[Episode], path: str = "", text: bool = False, device: str = "cpu") -> list[list[float]]:
    """The reward model's scores: an ``orm``'s score of the episode on its last turn, a ``prm``'s score of
    every turn (so with ``reward.allocation=per_turn`` each turn is trained on its own).

    The episodes' token ids are scored as they are, which needs the policy's tokenizer
    to be the reward model's (checked); ``text`` re-encodes each chat with the reward
    model's own tokenizer instead. ``device`` is where the reward model runs.
    """
    model = load_reward_model(path, text, device)
    return model.score_turns(episodes, text=text)
