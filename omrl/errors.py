"""Errors that the CLI reports as one line, without a traceback (unless --debug)."""

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


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, carrying what a user needs to go on (which checkpoint was kept, how to resume)."""


class EnvFailure(OmrlError):
    """Every episode of a run failed in its env (a server down, a simulator crashed): nothing the
    model did was measured, so the run is no result."""


_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlevel = 80, 80, 3


def short_repr(value: object) -> str:
    """``repr(value)`` cut to a line: bad values come from models and envs, megabytes long or deeply nested."""
    return _SHORT.repr(value)
