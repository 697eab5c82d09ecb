"""Models: the built-in names (:mod:`.builtin`), finding and loading a model and its tokenizer
(:mod:`.loading`; a folder that holds none named for what it is: :mod:`.folders`), the low-rank deltas that ship tuned built-ins (:mod:`.delta`), and the sha256
manifests that find a damaged model or checkpoint file (:mod:`.manifest`)."""

from omrl.models.builtin import BUILTIN_MODELS

# .loading imports torch: its names load on first use, so that `omrl view` (which reads the
# built-in names) never imports torch.
_FROM_LOADING = (
    "DEFAULT_MODEL",
    "MODEL_MANIFEST",
    "TINY_TOKENIZER_DIR",
    "WEBSHOP_DELTA",
    "check_context_window",
    "check_model_files",
    "load_model",
    "load_tokenizer",
    "resolve_model_path",
    "tiny_config",
    "trained_demonstration",
)

__all__ = ["BUILTIN_MODELS", *_FROM_LOADING]


def __getattr__(name: str):
    if name in _FROM_LOADING:
        from omrl.models import loading

        return getattr(loading, name)
    raise AttributeError(f"module 'omrl.models' has no attribute {name!r}")
