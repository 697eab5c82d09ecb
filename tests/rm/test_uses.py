"""A trained reward model where a score is needed: the ``rm`` reward, the ``rm`` scorer, the random and
majority selectors, and ``omrl eval --select``; on the tiny model and gridworld."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from omrl.config import load_config
from omrl.config.options import EvalRunConfig
from omrl.data import Episode, Turn
from omrl.errors import ConfigError
from omrl.rewards import allocate_rewards, compose_rewards
from omrl.rm.model import RewardModel, RewardModelError, build_reward_model
from omrl.rollout import PlaySpec, RolloutSession
from omrl.search import Node, Tree, play_strategy
from omrl_plugins.strategies.scorers import majority_vote, random_pick, reward_model
from tests.helpers import cli_exit, eval_report

FAST = [
    "env.name=gridworld",
    "model.name=tiny",
    "generation.max_new_tokens=8",
    "env.max_turns=3",
    "generation.temperature=1.0",
]


@pytest.fixture(scope="module")
def rm_dirs(tmp_path_factory):
    """Untrained reward models of each kind on ``tiny`` (the policy's tokenizer), one of them in bfloat16,
    plus an ``orm`` on ``smollm2-135m`` (another tokenizer)."""
    out = {}
    # smollm2 in float32: a bfloat16 forward of it on a CPU is ~20x slower; bfloat16 is tested on tiny
    for name, base, kind, dtype in [
        ("orm", "tiny", "orm", "float32"),
        ("prm", "tiny", "prm", "float32"),
        ("bf16", "tiny", "orm", "bfloat16"),
        ("smol", "smollm2-135m", "orm", "float32"),
    ]:
        model, tokenizer = build_reward_model(base, kind, "bce", "success", dtype=dtype)
        out[name] = str(tmp_path_factory.mktemp(name))
        model.save_pretrained(out[name])
        tokenizer.save_pretrained(out[name])
    return out


def session(plugins=None, *overrides):
    cfg = load_config(EvalRunConfig, overrides=[*FAST, *overrides])
    cfg.plugins = plugins or {}
    return RolloutSession.from_config(cfg)


@pytest.fixture(scope="module")
def episodes():
    """Gridworld episodes of the tiny model, several turns each, plus one that never got a turn."""
    with session() as s:
        played = s.play(s.task_ids("test", 2), PlaySpec(split="test", group_size=2, seed=3)).episodes
    assert all(len(ep.turns) > 1 for ep in played)
    return [*played, Episode(env="gridworld", task_id=9, split="test", instruction="")]


def test_orm_reward_sits_on_the_last_turn(rm_dirs, episodes):
    compose_rewards(episodes, {"rm": 1.0}, {"rm": {"path": rm_dirs["orm"]}})
    expected = RewardModel.load(rm_dirs["orm"]).score_turns(episodes)
    assert [ep.rewards["rm"] for ep in episodes] == expected  # the same model on the same ids: exactly
    for ep in episodes[:-1]:
        assert ep.rewards["rm"][:-1] == [0.0] * (len(ep.turns) - 1) and 0 < ep.rewards["rm"][-1] < 1
    assert episodes[-1].rewards["rm"] == []


def test_prm_reward_scores_every_turn(rm_dirs, episodes):
    compose_rewards(episodes, {"rm": 1.0}, {"rm": {"path": rm_dirs["prm"]}})
    expected = RewardModel.load(rm_dirs["prm"]).score_turns(episodes)
    for ep, scores in zip(episodes[:-1], expected):
        assert ep.rewards["rm"] == pytest.approx(scores) and all(0 < v < 1 for v in scores)
        assert len(set(scores)) > 1  # not one number copied onto every turn
        per_token = allocate_rewards(ep, "per_turn")  # each turn's score on its own last token
        assert [per_token[turn.span[1] - 1] for turn in ep.turns] == pytest.approx(scores)


def test_reward_without_a_path_names_the_option(episodes):
    with pytest.raises(ConfigError, match=r"reward 'rm' needs the option path.*plugins\.rm\.path=DIR"):
        compose_rewards(episodes, {"rm": 1.0}, {})


def test_a_bfloat16_reward_model_scores_in_float32(rm_dirs, episodes):
    compose_rewards(episodes, {"rm": 1.0}, {"rm": {"path": rm_dirs["bf16"]}})
    assert all(type(ep.rewards["rm"][-1]) is float and 0 < ep.rewards["rm"][-1] < 1 for ep in episodes[:-1])


@pytest.mark.slow
def test_reward_model_with_another_tokenizer_scores_text_only(rm_dirs, episodes):
    some = [*episodes[:2], episodes[-1]]  # two played and the empty one: enough, and smollm2 reads slowly
    with pytest.raises(RewardModelError, match="uses another tokenizer than the policy.*text=true"):
        compose_rewards(some, {"rm": 1.0}, {"rm": {"path": rm_dirs["smol"]}})
    compose_rewards(some, {"rm": 1.0}, {"rm": {"path": rm_dirs["smol"], "text": True}})
    assert all(0 < ep.rewards["rm"][-1] < 1 for ep in some[:-1])


def test_a_session_scored_by_a_reward_model_of_another_tokenizer_is_refused_before_it_plays(rm_dirs):
    """It was found at scoring time, once the first rollout had been played."""
    weights = ["reward.weights={goal: 1.0, rm: 1.0}"]
    with pytest.raises(ConfigError, match=r"reward 'rm' at .* uses another tokenizer than the policy .*text=true"):
        session({"rm": {"path": rm_dirs["smol"]}}, *weights)
    with session({"rm": {"path": rm_dirs["smol"], "text": True}}, *weights):  # scored as text: it can
        pass
    with session({"rm": {"path": rm_dirs["orm"]}}, *weights):  # the policy's own tokenizer
        pass


@pytest.mark.parametrize("kind", ["orm", "prm"])
def test_best_of_n_answers_with_the_reward_models_favourite(rm_dirs, kind):
    plugins = {"best_of_n": {"n": 3, "select": "rm"}, "rm": {"path": rm_dirs[kind]}}
    with session(plugins) as s:
        spec = PlaySpec(split="test", seed=1, rewards=False, strategy="best_of_n")
        trees = play_strategy(s, s.task_ids("test", 2), spec).trees
        tokenizer = s.tokenizer
    rm = RewardModel.load(rm_dirs[kind])
    for tree in trees:
        leaves = [leaf for leaf in tree.leaves() if leaf.parent is not None]
        scores = rm.score_episodes([leaf.episode for leaf in leaves])
        assert len(leaves) == 3 and len(set(scores)) == 3
        assert [leaf.score for leaf in leaves] == pytest.approx(scores)
        assert tree.chosen() is leaves[scores.index(max(scores))]
    ctx = SimpleNamespace(tokenizer=tokenizer)
    assert reward_model(leaves, ctx, path=rm_dirs[kind], text=True) == pytest.approx(
        rm.score_episodes([leaf.episode for leaf in leaves], text=True)
    )
    with pytest.raises(RewardModelError, match="different vocabulary"):
        reward_model(leaves, ctx, path=rm_dirs["smol"])


def node(tree: Tree | None, action: str | None, node_id: int = 1) -> Node:
    turn = Turn("obs", f"Act: {action}", action, action is not None, 0.0, False)
    ep = Episode(env="gridworld", task_id=tree.task_id if tree else 0, split="test", instruction="", turns=[turn])
    out = Node(node_id, None, ep, [], "")
    out.tree = tree
    return out


def chosen(scores: list[float]) -> int:
    """The leaf best_of_n answers with: the highest score, the first on ties."""
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def test_majority_picks_the_most_common_final_action_per_tree():
    one, two = (Tree(task, task, node(None, None, 0)) for task in (0, 1))
    nodes = [node(one, a) for a in ["up", "left", " left ", None, "down"]] + [node(two, a) for a in ["up", "up"]]
    scores = majority_vote(nodes, SimpleNamespace(seed=0))
    assert scores == pytest.approx([0.2, 0.4, 0.4, 0.0, 0.2, 1.0, 1.0])
    assert chosen(scores[:5]) == 1
    tie = majority_vote([node(one, a) for a in ["down", "up", "up", "down"]], SimpleNamespace(seed=0))
    assert chosen(tie) == 0  # a tie keeps the first


def test_random_is_reproducible_and_uniform():
    trees = [Tree(task, task, node(None, None, 0)) for task in range(600)]
    nodes = [node(tree, "up", i) for tree in trees for i in (1, 2, 3)]
    scores = random_pick(nodes, SimpleNamespace(seed=7))
    assert scores == random_pick(nodes, SimpleNamespace(seed=7))
    assert scores[3:6] == random_pick(nodes[3:6], SimpleNamespace(seed=7))  # however the trees are batched
    assert scores != random_pick(nodes, SimpleNamespace(seed=8))
    picks = [chosen(scores[i : i + 3]) for i in range(0, len(scores), 3)]
    assert all(150 < picks.count(i) < 250 for i in range(3)), [picks.count(i) for i in range(3)]


def test_eval_selects_with_the_reward_model_and_rewards_with_it(rm_dirs, tmp_path):
    _, data = eval_report(
        tmp_path,
        "eval",
        *FAST,
        "--num-tasks",
        "2",
        "--strategy",
        "best_of_n",
        "--select",
        "rm",
        f"plugins.rm.path={rm_dirs['orm']}",
        "reward.weights={rm: 1.0}",
        "plugins.best_of_n.n=2",
    )
    assert data["config"]["plugins"]["best_of_n"]["select"] == "rm" and data["metrics"]["episodes"] == 2
    assert 0 < data["metrics"]["reward/rm"] < 1


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--strategy", "best_of_n", "--select", "env", "plugins.best_of_n.select=logprob"],
            "plugins.best_of_n.select='logprob' and the flag for plugins.best_of_n.select ('env_reward')",
        ),
        (["--strategy", "dfsdt", "--select", "rm"], "--select rm is for --strategy best_of_n or beam"),
        (["--select", "majority"], "but the strategy is 'chain'"),
    ],
)
def test_select_errors_are_one_line(capsys, args, message):
    code, _, err = cli_exit(capsys, "eval", "--env", "gridworld", "--model", "tiny", *args)
    assert code != 0 and message in " ".join(err.split()) and "Traceback" not in err, err
    assert sum("error" in line for line in err.splitlines()) == 1, err
