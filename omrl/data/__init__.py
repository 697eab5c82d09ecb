"""omrl's data model: the trajectory records (``Episode``, :mod:`.trajectory`; what each version of
their file layout holds: :mod:`.layouts`), the ``Batch``
container of tensors (:mod:`.batch`), agent conversations for SFT (:mod:`.conversations`; the files
they are read from and written to: :mod:`.record_files`; TRL's prompt-completion records as chats:
:mod:`.prompt_completion`) and several datasets mixed by weight (:mod:`.mixture`)."""

from omrl.data.trajectory import Episode, Turn, read_episodes, write_episodes

__all__ = ["Batch", "Episode", "Turn", "read_episodes", "write_episodes"]


def __getattr__(name: str):
    # Batch holds tensors: importing it (and torch) waits until someone asks for it,
    # so reading or listing episodes (`omrl view`, `omrl plugins`) never loads torch
    if name == "Batch":
        from omrl.data.batch import Batch

        return Batch
    raise AttributeError(f"module 'omrl.data' has no attribute {name!r}")
