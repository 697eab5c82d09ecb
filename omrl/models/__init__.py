"""Models: the built-in names (:mod:`.builtin`), finding and loading a model and its tokenizer
(:mod:`.loading`), and the low-rank deltas that ship tuned built-ins (:mod:`.delta`)."""

from omrl.models.builtin import BUILTIN_MODELS
from omrl.models.loading import (
    DEFAULT_MODEL, MODEL_MANIFEST, TINY_TOKENIZER_DIR, WEBSHOP_DELTA, check_model_files, load_model,
    load_tokenizer, omrl_home, resolve_model_path, tiny_config, trained_demonstration,
)

__all__ = [
    "BUILTIN_MODELS", "DEFAULT_MODEL", "MODEL_MANIFEST", "TINY_TOKENIZER_DIR", "WEBSHOP_DELTA",
    "check_model_files", "load_model", "load_tokenizer", "omrl_home", "resolve_model_path", "tiny_config",
    "trained_demonstration",
]
