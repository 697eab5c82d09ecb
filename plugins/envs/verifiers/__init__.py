"""``verifiers:<module>``: environments written for PrimeIntellect's verifiers (PyPI ``verifiers``, the format
of prime-rl's Environments Hub), played in omrl's own token-exact loop.

Install with ``pip install 'omrl[verifiers]'`` (verifiers 0.3.1: its classic ``SingleTurnEnv``, ``MultiTurnEnv``,
``ToolEnv``, ``StatefulToolEnv`` and what is built on them). An environment is a module with
``load_environment(**args)``: an installed environment package, registered as ``verifiers:<module>`` (found from
package metadata, nothing imported), or any importable module, played by the ``verifiers`` env
(``plugins.verifiers.module=my_envs.wordle``) or registered under a name by a plugin (:func:`variant`).
Options (config block ``plugins."verifiers:<module>"``):

- ``args``: ``load_environment``'s arguments (``plugins."verifiers:wordle".args.num_train_examples=100``);
  one it does not take is refused, naming the ones it does.
- ``tool_format`` (``hermes``): how replies write tool calls (a format of :mod:`omrl.chat.tool_calls`).
- ``timeout_s`` (600): seconds the environment may take to answer a turn (its ``env_response``, its tools,
  its stop conditions) or to score the episode.
- ``reward_errors`` (``raise``): a reward function that raises, or returns no finite number (``None``, NaN, text),
  ends the episode as ``env_error``, naming it; ``zero`` keeps verifiers' own rule (it scores 0), listing the
  failures in ``info["reward_errors"]``.

Tasks: ``train`` is the environment's ``dataset`` (task id = row index), ``test`` its ``eval_dataset`` (task id
1,000,000 + row index). Without an eval dataset there is no ``test`` split (verifiers would fall back to the
train rows); without a dataset, no ``train`` split.

Rewards: the last step's reward is the rubric's reward (its weighted sum of reward functions); ``score`` is that
reward clipped to [0, 1], and ``won`` verifiers' own pass (reward >= the environment's ``pass_threshold``), so
the ``goal`` reward works as for any env. The last turn's info holds ``verifiers_reward`` (the rubric's reward),
``verifiers_metrics`` (the value of every rubric function and metric, and ``parser_format``, the parser's format
reward where it has one), ``stop_condition`` and the row's ``answer``. The ``verifiers_rubric`` reward trains on
the rubric's reward, or on one function's value (option ``metric``). A turn is ``format_ok`` when the parser's
format reward is 1 for its reply.

Refused, naming what it needs: environments that need a service (verifiers' sandboxes, browsers, OpenEnv
servers), rubrics or environments that call a model over the network (``JudgeRubric``, an OpenAI or Anthropic
client), group reward functions and rubric advantages (omrl scores each episode on its own and estimates
advantages itself), images in messages, and an environment that rewrites the conversation instead of extending
it or changes its tools mid-episode. An error the environment raises (or a ``vf.Error`` other than a tool
error, which is the agent's) ends the episode as ``env_error``.

Modules: the env (:mod:`.env`), its bridge to the environment's own rollout (:mod:`.bridge`), the environment's
messages as omrl's chat (:mod:`.messages`); finding installed environment packages (:mod:`.installed`), loading
one (:mod:`.loading`), what is refused in it (:mod:`.refusals`) and what omrl reads of its rubric
(:mod:`.rubric`); the ``verifiers_reply`` template (:mod:`.template`) and the ``verifiers_rubric`` reward
(:mod:`.reward`). Registering imports no verifiers.
"""

from omrl.hookspecs import hookimpl
from omrl_plugins.envs.verifiers.env import VerifiersEnv, variant
from omrl_plugins.envs.verifiers.installed import NAME, installed_environments, module_name
from omrl_plugins.envs.verifiers.reward import REWARD, verifiers_reward
from omrl_plugins.envs.verifiers.template import TEMPLATE, VerifiersTemplate

__all__ = [
    "NAME",
    "REWARD",
    "TEMPLATE",
    "VerifiersEnv",
    "VerifiersTemplate",
    "installed_environments",
    "module_name",
    "register_envs",
    "register_rewards",
    "register_templates",
    "variant",
    "verifiers_reward",
]


@hookimpl
def register_envs(register):
    register(NAME, VerifiersEnv)
    for module in installed_environments():
        register(f"{NAME}:{module}", variant(module))


@hookimpl
def register_templates(register):
    register(TEMPLATE, VerifiersTemplate)


@hookimpl
def register_rewards(register):
    register(REWARD, verifiers_reward)
