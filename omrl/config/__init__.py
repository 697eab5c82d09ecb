"""Run configuration: each command's config (:mod:`.options`), built of sections, one per thing it
configures (:mod:`.sections`).

How YAML presets (:mod:`.presets`) and ``key=value`` overrides become one of them (:mod:`.loading`),
checked against its dataclasses and written back as plain data (:mod:`.schema`); what a secret becomes
in the files omrl writes (:mod:`.redaction`); how an option is declared, its help listing the registered
names where it names a plugin (:mod:`.fields`); who plays each seat of a game of several agents
(:mod:`.seats`)."""

from omrl.config.loading import (
    DeprecatedKeyWarning,
    command_line_config,
    load_config,
    merge,
    overrides_to_dict,
    parse_overrides,
)
from omrl.config.presets import PRESETS_DIR, preset_names, presets_dir, read_preset, user_sets
from omrl.config.redaction import REDACTED, hide, is_secret_key, redact, redact_argv, redact_text
from omrl.config.schema import describe, from_dict, to_dict, to_yaml

__all__ = [
    "PRESETS_DIR",
    "REDACTED",
    "DeprecatedKeyWarning",
    "command_line_config",
    "describe",
    "from_dict",
    "hide",
    "is_secret_key",
    "load_config",
    "merge",
    "overrides_to_dict",
    "parse_overrides",
    "preset_names",
    "presets_dir",
    "read_preset",
    "redact",
    "redact_argv",
    "redact_text",
    "to_dict",
    "to_yaml",
    "user_sets",
]
