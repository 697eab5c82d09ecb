"""omrl's built-in plugins. Each registers through the ``omrl`` entry-point group,
exactly as a third-party package does (see pyproject.toml)."""

from omrl.moved import alias_moved_modules

# Modules that were single files before their plugin became a package.
alias_moved_modules(
    {
        "omrl_plugins.envs.agentgym_dialects": "omrl_plugins.envs.agentgym.dialects",
        "omrl_plugins.envs.agentgym_http": "omrl_plugins.envs.agentgym.transport",
        "omrl_plugins.envs.openenv_session": "omrl_plugins.envs.openenv.session",
    }
)
