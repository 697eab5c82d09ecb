"""What a secret becomes in every file omrl writes: config.yaml, a checkpoint's state.json, eval reports,
the errors episodes keep, the viewer's page. :func:`redact` cleans config data, :func:`redact_text` text.

A secret is

- the value of a key named like one (:func:`is_secret_key`: ``token``, ``api_key``, ``GITHUB_PAT``...);
- every value of an environment mapping below a config's top level (``plugins.mcp.env``): omrl cannot tell
  a server's ``DATABASE_URL`` from its ``LOG_LEVEL``, so it keeps the names and drops every value;
- in text, a command line or an argv list: the value after a flag named like one (``--api-key X``,
  ``--token=X``), of an assignment or a quoted key named like one (``GITHUB_TOKEN=X``, ``?api_key=X``,
  ``"password": "X"``), a URL's password (``postgres://me:X@host``) and a bearer token.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from omrl.errors import ConfigError

#: what a secret's value becomes in every file omrl writes
REDACTED = "<redacted>"
#: the last part of a config key that names a secret (see :func:`is_secret_key`)
SECRET_WORDS = (
    "token",
    "api_key",
    "apikey",
    "key",
    "secret",
    "password",
    "passwd",
    "passphrase",
    "credential",
    "credentials",
    "authorization",
    "cookie",
    "pat",
    "dsn",
)
#: keys whose mapping is a process's environment variables (below a config's top level: ``env`` at the
#: top is the env section)
ENVIRONMENT_KEYS = ("env", "environment", "env_vars")

_VALUE = r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s\"'&;,}\]]+)"
_FLAG = re.compile(r"(?<![\w-])--?(?P<name>[A-Za-z][\w-]*)(?P<sep>=|[ \t]+)" + _VALUE)
_ASSIGNED = re.compile(r"(?<![\w-])(?P<name>[A-Za-z_][\w.-]*)=" + _VALUE)
_QUOTED_KEY = re.compile(r"(?P<q>[\"'])(?P<name>[^\"'\s]+)(?P=q)\s*:\s*" + _VALUE)
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][\w+.-]*://[^\s/:@]*):(?P<value>[^\s/@]+)@")
_BEARER = re.compile(r"\b(?P<kind>Bearer|Basic)\s+(?P<value>[\w.~+/=-]{8,})", re.IGNORECASE)
_LONE_FLAG = re.compile(r"--?(?P<name>[A-Za-z][\w-]*)")


def is_secret_key(name: object) -> bool:
    """Whether a config key names a secret, whose value must never reach a file.

    The rule: the key's last part (``token`` of ``plugins.agentgym.token``), lower-cased with
    ``-`` read as ``_``, is one of :data:`SECRET_WORDS` or ends in ``_`` and one of them
    (``hf_token``, ``x-api-key``, ``db_password``, ``GITHUB_PAT``, an ``Authorization`` header). A name
    that only mentions one (``api_key_env``, which names an environment variable, ``max_new_tokens``) is not.

    >>> [is_secret_key(k) for k in ("token", "X-Api-Key", "Authorization", "api_key_env", "max_new_tokens")]
    [True, True, True, False, False]
    """
    word = str(name).lower().replace("-", "_")
    return any(word == secret or word.endswith("_" + secret) for secret in SECRET_WORDS)


def redact(data: Any, _top: bool = True) -> Any:
    """``data`` (nested mappings, lists and text) with every secret replaced by :data:`REDACTED`; an
    unset one (None, "") stays as it is, so a reader sees that none was given.

    >>> redact({"plugins": {"mcp": {"command": "srv --api-key abc123", "env": {"DATABASE_URL": "x"}}}})
    {'plugins': {'mcp': {'command': 'srv --api-key <redacted>', 'env': {'DATABASE_URL': '<redacted>'}}}}
    """
    if isinstance(data, dict):
        return {key: _redact_entry(key, value, _top) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        if all(isinstance(item, str) for item in data):
            return type(data)(redact_argv(data))
        return type(data)(redact(item, False) for item in data)
    if isinstance(data, str):
        return redact_text(data)
    return data


def _redact_entry(key: Any, value: Any, top: bool) -> Any:
    if _unset(value):
        return value
    if is_secret_key(key):
        return REDACTED
    if not top and str(key).lower() in ENVIRONMENT_KEYS and isinstance(value, dict):
        return {name: item if _unset(item) else REDACTED for name, item in value.items()}
    return redact(value, False)


def _unset(value: Any) -> bool:
    return value is None or (isinstance(value, (str, dict, list, tuple)) and not value)


def redact_argv(words: Sequence[str], found: list[str] | None = None) -> list[str]:
    """A command's words with its secrets redacted: the word after a flag named like a secret
    (``--api-key``, ``X``), and those in each word (:func:`redact_text`). ``found`` collects the values taken out."""
    out: list[str] = []
    for word in words:
        flag = _LONE_FLAG.fullmatch(out[-1]) if out else None
        if flag and is_secret_key(flag["name"]) and word and not word.startswith("--"):
            _keep(found, word)
            out.append(REDACTED)
        else:
            out.append(redact_text(word, found))
    return out


def redact_text(text: str, found: list[str] | None = None) -> str:
    """``text`` with every secret it shows redacted (see the module's list); ``found`` collects the values
    taken out.

    >>> redact_text("could not start `srv --token=abc123 postgres://me:pw@db/x`")
    'could not start `srv --token=<redacted> postgres://me:<redacted>@db/x`'
    """
    if not isinstance(text, str) or not text:
        return text

    def named(match: re.Match) -> str:
        if (
            not is_secret_key(match["name"].rsplit(".", 1)[-1])
            or match["value"] == REDACTED
            or match["value"].startswith("--")
        ):
            return match[0]
        _keep(found, match["value"].strip("\"'"))
        return match[0][: match.start("value") - match.start()] + REDACTED

    def always(match: re.Match) -> str:
        if match["value"] == REDACTED:
            return match[0]
        _keep(found, match["value"])
        return (
            match[0][: match.start("value") - match.start()] + REDACTED + match[0][match.end("value") - match.start() :]
        )

    text = _URL_PASSWORD.sub(always, text)
    text = _BEARER.sub(always, text)
    for pattern in (_FLAG, _ASSIGNED, _QUOTED_KEY):
        text = pattern.sub(named, text)
    return text


def _keep(found: list[str] | None, value: str) -> None:
    if found is not None and value:
        found.append(value)


def hide(text: str, values: Sequence[str]) -> str:
    """``text`` (a server's stderr, an error) with every occurrence of the secret ``values`` redacted,
    and the secrets it shows besides (:func:`redact_text`)."""
    for value in sorted(set(values), key=len, reverse=True):  # a longer secret may hold a shorter one
        text = text.replace(value, REDACTED)
    return redact_text(text)


def check_no_redacted(data: Any, path: str) -> None:
    """Refuse a config value that is (or holds) :data:`REDACTED`: read back from a file omrl wrote (a resumed
    run's config.yaml), it stands for a secret omrl never keeps, and a server given it would fail at login."""
    if isinstance(data, dict):
        for key, value in data.items():
            check_no_redacted(value, f"{path}.{key}")
    elif isinstance(data, (list, tuple)):
        for value in data:
            check_no_redacted(value, path)
    elif isinstance(data, str) and REDACTED in data:
        raise ConfigError(
            f"{path} is {data!r}: omrl writes no secret to its files, so a config read back from one (a resumed "
            f"run's config.yaml) has none; give it again on the command line ({path}=...)"
        )
