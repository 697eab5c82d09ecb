"""Errors that the CLI reports as one line, without a traceback (unless --debug)."""

import errno
import reprlib


class OmrlError(Exception):
    """A user-facing error: the message names the bad thing and what would be valid."""


class UnknownNameError(OmrlError, KeyError):
    """A name that no registry, preset or option knows."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class PluginError(OmrlError):
    """A plugin failed to load or to register its components."""


class ConfigError(OmrlError):
    """A config file or override that does not fit the config's schema."""


class NonFiniteLossError(OmrlError):
    """Too many optimizer steps in a row had a NaN or infinite loss or gradient."""


class NothingLearned(OmrlError):
    """Every update of a run was skipped: the model it saved is the one it started from."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, carrying what a user needs to go on (which checkpoint was kept, how to resume)."""


class EnvFailure(OmrlError):
    """Every episode of a run failed in its env (a server down, a simulator crashed): nothing the
    model did was measured, so the run is no result."""


class FailedStep(EnvFailure):
    """A training step whose every episode failed in the env, its replays too: the run stops there.
    ``keepable``: the run stands where its last step done left it (the failed step's tasks handed back),
    so those steps can be checkpointed for a resume."""

    def __init__(self, message: str, keepable: bool = False):
        super().__init__(message)
        self.keepable = keepable


class EndpointError(OmrlError):
    """A generation server (the openai backend's endpoint, or the server it syncs weights to) failed or
    answered something that is not a completion: the world's failure, and a run it stops can resume."""


class WriteFailed(OmrlError):
    """A file could not be written because of the machine (a full disk, a used-up quota, an I/O
    error): not a bug, and the message says what to free or fix."""


class DamagedModelError(OmrlError):
    """A model directory whose files are not the ones written (its manifest disagrees) or cannot
    be read (a cut or garbled weights file)."""


# how torch, safetensors and the OS word a write the machine could not do: torch and safetensors
# raise RuntimeError or their own error types, not OSError, so the errno is only in the text
_WRITE_FAILURES = {
    "no space left on device": "the disk is full",
    "storagefull": "the disk is full",
    "disk quota exceeded": "the disk quota is used up",
    "input/output error": "an I/O error",
    "read-only file system": "the file system is read-only",
    "file write failed": "the write failed (is the disk full?)",
    "unexpected pos": "the write failed (is the disk full?)",
}
_WRITE_ERRNOS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EIO: "an I/O error",
    errno.EROFS: "the file system is read-only",
}


def write_failure(exc: BaseException) -> str | None:
    """What the machine failed at when ``exc`` is a write it could not do (``"the disk is full"``),
    else None: the error is then omrl's own and must not be dressed up as the machine's."""
    if isinstance(exc, OSError) and exc.errno in _WRITE_ERRNOS:
        return _WRITE_ERRNOS[exc.errno]
    text = str(exc).lower()
    return next((what for words, what in _WRITE_FAILURES.items() if words in text), None)


_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlevel = 80, 80, 3


def short_repr(value: object) -> str:
    """``repr(value)`` cut to a line: bad values come from models and envs, megabytes long or deeply nested."""
    return _SHORT.repr(value)
