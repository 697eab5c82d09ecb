"""Built-in env plugin (in progress)."""
