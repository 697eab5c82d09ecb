"""Errors that the CLI reports as one line, without a traceback (unless --debug)."""


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
