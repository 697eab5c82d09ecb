"""Run configuration: the option dataclasses (:mod:`.options`) and how YAML presets, files and
``key=value`` overrides become one of them (:mod:`.loading`)."""

from omrl.config.loading import (
    PRESETS_DIR,
    REDACTED,
    DeprecatedKeyWarning,
    command_line_config,
    describe,
    from_dict,
    is_secret_key,
    load_config,
    merge,
    overrides_to_dict,
    parse_overrides,
    preset_names,
    presets_dir,
    read_preset,
    redact,
    to_dict,
    to_yaml,
    user_sets,
)

__all__ = [
    "PRESETS_DIR",
    "REDACTED",
    "DeprecatedKeyWarning",
    "command_line_config",
    "describe",
    "from_dict",
    "is_secret_key",
    "load_config",
    "merge",
    "overrides_to_dict",
    "parse_overrides",
    "preset_names",
    "presets_dir",
    "read_preset",
    "redact",
    "to_dict",
    "to_yaml",
    "user_sets",
]
