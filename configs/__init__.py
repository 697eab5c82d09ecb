"""omrl's shipped YAML presets (installed as the package omrl_configs)."""
