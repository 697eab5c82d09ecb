"""omrl built-in plugins."""
