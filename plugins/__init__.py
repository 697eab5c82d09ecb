"""omrl's built-in plugins. Each registers through the ``omrl`` entry-point group,
exactly as a third-party package does (see pyproject.toml)."""
