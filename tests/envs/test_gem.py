"""The ``gem:<id>`` envs on the real gem-llm package: scripted games won over many turns, GEM's
rewards as score, one-turn reasoning tasks, invalid moves, and names that cost no import."""

from __future__ import annotations

import itertools
import math
import random
import re
import sys

import numpy as np
import pytest

from omrl import registry
from omrl.envs import EpisodeFinishedError, UnknownTaskError, create_env, package_installed, step_problem
from omrl.errors import ConfigError
from omrl_plugins.envs.engines.common import MissingExtraError
from omrl_plugins.envs.engines.gem import ENV_IDS, GAMES, POOL_SIZE, TASKS, GemEnv, left_out_reason
from omrl_plugins.envs.engines.reasoning_gym import DATASETS
from tests.helpers import eval_two_tasks, fresh_python_json

# A readable first move per game; the sweep over every game leaves out Sokoban-v0-hard, whose rooms
# take seconds to build.
FIRST_MOVES = {
    "GuessTheNumber": "5",
    "Mastermind": "1 2",
    "Minesweeper": "reveal 0 0",
    "FifteenPuzzle": "left",
    "Sudoku": "1 1 1",
    "TowerofHanoi": "A C",
    "Game2048": "up",
    "Sokoban": "up",
    "Crosswords": "1 1 a",
}
SLOW = ("game:Sokoban-v0-hard",)


def make(name, **options):
    return create_env(registry.envs.get(f"gem:{name}"), options, f"gem:{name}")


def play(env, moves):
    return [env.step(move) for move in moves]


def test_names_cover_gems_registry_and_registering_them_imports_nothing():
    from gem.envs.registration import ENV_REGISTRY

    assert set(ENV_IDS) <= set(ENV_REGISTRY) and not [i for i in ENV_IDS if left_out_reason(i)]
    assert [i for i in ENV_REGISTRY if i not in ENV_IDS and not left_out_reason(i)] == []
    assert TASKS == tuple(f"rg:{name}" for name in DATASETS) and (len(GAMES), len(TASKS)) == (26, 103)
    names = [name for name in registry.envs.names() if name.startswith("gem:")]
    assert names == sorted(f"gem:{env_id}" for env_id in ENV_IDS)
    game, task = registry.envs.get("gem:game:Sudoku-v0-easy"), registry.envs.get("gem:rg:chain_sum")
    assert issubclass(game, GemEnv) and (game.package, game.extra) == ("gem-llm", "gem") and package_installed(game)
    assert (game.max_turns, task.max_turns) == (100, 1) and "final answer" in task.action_help

    code = (
        "import json, logging, sys\n"
        "from omrl import registry\n"
        "names = [n for n in registry.envs.names() if n.startswith('gem:')]\n"
        "imported = sorted({'gem', 'reasoning_gym', 'nltk'} & set(sys.modules))\n"
        "registry.envs.get('gem:game:GuessTheNumber-v0-easy')()  # imports gem\n"
        "print(json.dumps({'names': len(names), 'imported': imported,\n"
        "                  'root_handlers': len(logging.getLogger().handlers)}))\n"
    )
    seen = fresh_python_json(code)
    assert seen["names"] == 129 and seen["imported"] == []
    assert seen["root_handlers"] == 0  # gem's import-time logging.basicConfig is undone


def test_guess_the_number_binary_search_wins_over_many_turns():
    env = make("game:GuessTheNumber-v0-hard")  # 1..50 in 7 turns
    first = env.reset(1_000_000)
    assert "between 1 and 50" in first.instruction and first.text == "Enter your next guess."
    low, high, results = 1, 50, []
    while not results or not results[-1].done:
        guess = (low + high) // 2
        results.append(env.step(str(guess) if len(results) % 2 else f"I guess \\boxed{{{guess}}}"))
        low, high = (guess + 1, high) if "higher" in results[-1].observation else (low, guess - 1)
    assert len(results) > 2 and results[-1].won and results[-1].score == 1.0 and results[-1].reward == 1.0
    assert all(not r.won and r.score == 0.0 and r.observation.endswith("Enter your next guess.") for r in results[:-1])
    assert not any(r.info["invalid"] for r in results) and "Congratulations" in results[-1].observation
    with pytest.raises(EpisodeFinishedError):
        env.step("25")


def test_tower_of_hanoi_solution_wins_and_refused_moves_are_invalid():
    env = make("game:TowerofHanoi-v0-easy")
    assert "A: [3, 2, 1]" in env.reset(1_000_000).text
    refused = env.step("B C")
    assert refused.info["invalid"] and not refused.done and "which is empty" in refused.observation
    results = play(env, ["A C", "A B", "\\boxed{C B}", "A C", "B A", "B C", "A C"])
    assert [r.done for r in results] == [False] * 6 + [True] and results[-1].won and results[-1].score == 1.0
    assert "C: [3, 2]" in results[-2].observation  # each observation carries the board


def test_mastermind_dense_rewards_add_up_to_a_win():
    env = make("game:Mastermind-v0-easy")  # 2 digits from 1..6, no repeats, 10 turns
    env.reset(1_000_001)
    candidates = list(itertools.permutations(range(1, 7), 2))
    results = []
    while not results or not results[-1].done:
        guess = candidates[0]
        results.append(env.step(" ".join(map(str, guess))))
        pegs = re.search(r"(\d) black peg\(s\) and (\d) white", results[-1].observation)
        if pegs:  # keep the codes that would have answered this guess the same way
            black, white = map(int, pegs.groups())
            candidates = [
                c
                for c in candidates
                if sum(a == b for a, b in zip(c, guess)) == black and len(set(c) & set(guess)) - black == white
            ]
    assert results[-1].won and results[-1].score == 1.0
    assert sum(r.reward for r in results) == pytest.approx(1.0)
    assert [r.score for r in results] == pytest.approx(list(itertools.accumulate(r.reward for r in results)))


def test_an_unreadable_move_is_invalid_and_ends_the_game_as_in_gem():
    env = make("game:GuessTheNumber-v0-hard")
    env.reset(5)
    out_of_range = env.step("99")
    assert out_of_range.info["invalid"] and not out_of_range.done and out_of_range.reward == 0.0
    unreadable = env.step("hello")
    assert unreadable.info["invalid"] and unreadable.done and not unreadable.won
    assert unreadable.reward == -0.1 and unreadable.score == 0.0  # GEM's format-error reward; score stays in [0, 1]


def test_every_game_plays_a_move_and_its_board_is_a_function_of_the_seed():
    for env_id in GAMES:
        if env_id in SLOW:
            continue
        env = make(env_id)
        first = env.reset(1_000_000)
        assert isinstance(first.text, str) and first.instruction and env.reset(1_000_000) == first
        result = env.step(FIRST_MOVES[env_id.split(":")[1].split("-")[0]])
        assert step_problem(result) is None, env_id
        assert isinstance(result.info["won"], bool) and 0.0 <= result.score <= 1.0
        assert result.score == pytest.approx(max(0.0, min(1.0, result.reward)))
    with pytest.raises(UnknownTaskError, match="train 0..99999, test 1000000..1000499"):
        env.reset(100_000)


def test_an_episode_depends_on_its_seed_and_moves_alone():
    # 2048 draws every new tile from the global generator: two instances played in turns must not
    # disturb each other (each plays on its own random states), nor the caller's states.
    moves = ["up", "left", "down", "right", "up", "left"]
    alone = make("game:Game2048-v0-easy")
    alone.reset(1_000_003)
    expected = [r.observation for r in play(alone, moves)]
    random.seed(3)
    np.random.seed(3)
    caller = (random.random(), np.random.random())
    random.seed(3)
    np.random.seed(3)
    first, second = make("game:Game2048-v0-easy"), make("game:Game2048-v0-easy")
    first.reset(1_000_003)
    second.reset(1_000_003)
    seen = [(first.step(move).observation, second.step(move).observation) for move in moves]
    assert seen == list(zip(expected, expected)) and len(set(expected)) > 1
    assert (random.random(), np.random.random()) == caller


def test_reasoning_tasks_are_one_turn_and_the_datasets_answer_wins():
    env = make("rg:chain_sum")
    question = env.reset(1_000_000)
    assert question.text == question.instruction and question.text.startswith("State the final answer")
    answer = env.expert_action()
    assert answer.startswith("\\boxed{")
    won = env.step(answer)
    assert won.done and won.won and won.reward == 1.0 and won.observation == "Your answer scored 1.0 (1 is correct)."
    env.reset(1_000_000)
    assert env.step(answer[len("\\boxed{") : -1]).won  # a bare answer is boxed for GEM
    env.reset(1_000_000)
    wrong = env.step("0")
    assert wrong.done and not wrong.won and wrong.score == 0.0 and not wrong.info["invalid"]
    scorer_refused = make("rg:prime_factorization")
    scorer_refused.reset(3)
    refused = scorer_refused.step("hello")  # the dataset's scorer raises ValueError on it
    assert refused.done and refused.info["invalid"] and refused.reward == 0.0


def test_reasoning_task_splits_draw_from_disjoint_pools_and_stay_put():
    env = make("rg:chain_sum")
    train = {env.reset(task_id).text for task_id in range(40)}
    test = {env.reset(task_id).text for task_id in range(1_000_000, 1_000_040)}
    assert len(train) > 30 and len(test) > 30 and not train & test
    before = env.reset(1_000_007).text
    test_ids = env.task_ids("test")
    for task_id in itertools.islice(itertools.cycle(test_ids), POOL_SIZE + 20):  # GEM draws a new pool after 500
        env.reset(task_id)
    assert env.reset(1_000_007).text == before


def test_a_train_task_never_asks_a_test_pools_question():
    import reasoning_gym

    env = make("rg:lcm")  # few questions: the pools of seeds 42 and 1,000,042 share some
    test = {item["question"] for item in reasoning_gym.create_dataset("lcm", seed=1_000_042, size=POOL_SIZE)}
    train = [env.reset(task_id).text for task_id in range(400)]
    assert not set(train) & test and len(set(train)) > 200
    assert {env.reset(task_id).text for task_id in range(1_000_000, 1_000_100)} <= test  # test as it was
    again = make("rg:lcm")
    assert [again.reset(task_id).text for task_id in range(50)] == train[:50]
    assert again.step(again.expert_action()).won


def test_what_gem_gives_reaches_the_protocol_check_unchanged(monkeypatch):
    env = make("game:Minesweeper-v0-easy")
    env.reset(1_000_000)
    monkeypatch.setattr(env._engine, "step", lambda action: ("hit", float("nan"), False, False, {}))
    result = env.step("reveal 0 0")
    assert math.isnan(result.reward) and "returned reward nan" in step_problem(result)
    env.reset(1_000_000)
    monkeypatch.setattr(env._engine, "step", lambda action: ({"board": []}, 0.0, False, False, {"suffix": "b"}))
    assert "returned observation {'board': []}; it must be text" in step_problem(env.step("reveal 0 0"))


def test_unknown_and_left_out_ids_say_what_is_valid():
    with pytest.raises(
        ConfigError,
        match="unknown gem env 'game:GuessTheNumber-v0-medium'; close matches: "
        "game:GuessTheNumber-v0-random, game:GuessTheNumber-v0-hard",
    ):
        GemEnv(env_id="game:GuessTheNumber-v0-medium")
    with pytest.raises(ConfigError, match="'math:GSM8K' is left out: loads its problems from the Hugging Face hub"):
        GemEnv(env_id="math:GSM8K")
    with pytest.raises(ConfigError, match="'game:Wordle-v0-easy' is left out: downloads NLTK's `words` corpus"):
        GemEnv(env_id="game:Wordle-v0-easy")
    with pytest.raises(ConfigError, match="does not take options \\['env_id'\\]"):
        make("game:Sudoku-v0-easy", env_id="game:Sudoku-v0-hard")


def test_a_missing_package_names_the_extra(monkeypatch):
    for module in [name for name in sys.modules if name.startswith("gem.envs.game_env.crosswords")]:
        monkeypatch.delitem(sys.modules, module)  # imported afresh, without pandas
    monkeypatch.setitem(sys.modules, "pandas", None)  # makes `import pandas` fail
    crosswords = make("game:Crosswords-v0-easy")
    with pytest.raises(
        MissingExtraError, match="Crosswords-v0-easy needs a package gem-llm does not install \\(.*pandas"
    ):
        crosswords.reset(1_000_000)
    monkeypatch.setitem(sys.modules, "gem", None)  # makes `import gem` fail
    with pytest.raises(MissingExtraError, match="pip install 'omrl\\[gem\\]'"):
        make("game:Sudoku-v0-easy")


def test_eval_runs_a_game_by_its_name(tmp_path):
    eval_two_tasks("gem:game:GuessTheNumber-v0-easy", tmp_path)
