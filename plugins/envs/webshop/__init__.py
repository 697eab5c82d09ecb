"""The built-in ``webshop`` env: WebShop's text-mode shopping site, offline (see env.py)."""

from omrl.hookspecs import hookimpl
from omrl_plugins.envs.webshop.env import WebShopEnv

__all__ = ["WebShopEnv"]


@hookimpl
def register_envs(register):
    register("webshop", WebShopEnv)
