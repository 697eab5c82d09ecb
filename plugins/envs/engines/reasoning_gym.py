"""``reasoning-gym:<dataset>``: reasoning_gym's procedural datasets (PyPI ``reasoning-gym``) as one-turn envs.

Install with ``pip install 'omrl[reasoning-gym]'``. Every dataset of reasoning_gym 0.1.23 that
builds offline has its own name (``reasoning-gym:chain_sum``, ``reasoning-gym:zebra_puzzles``,
... 103 of them); the names are listed below so that registering them imports nothing, and
tests/envs/test_reasoning_gym.py checks them against the package's own registry. Left out:
``composite``, which only mixes other datasets and needs their configs (play those by name).

Option (config block ``plugins."reasoning-gym:<dataset>"``): ``config``, the dataset's own
settings, the fields of its config dataclass, e.g. for a curriculum
(``plugins.reasoning-gym:chain_sum.config.max_terms=3``); ``seed`` and ``size`` belong to the splits.

Tasks: a task id is an item index under a fixed seed. ``train`` is 0..9,999 and ``test`` is
1,000,000..1,000,499; task id ``t`` of the split whose ids start at ``s`` is item ``t - s`` of
the dataset built with seed ``s`` and the split's size. Every dataset but ``acre`` generates item
``i`` from seed ``s + i`` (so task id ``t`` from seed ``t``); ``acre`` draws a split's items up
front from its seed (about 2.5 s for train's 10,000). Either way the splits share no random
stream. (``word_ladder`` refuses more than 20,000 items, hence train's 10,000.)

The splits share no question either: where a dataset's questions are few, different seeds give
the same one (``lcm``: 380 of the 500 test questions were also train tasks). A train task whose
question is a test question is drawn again, as the same item of the dataset seeded 2,000,000 +
n * 10,000 (n = 0, 1, ...), up to 20 times; only when all 20 are test questions too (settings
that leave almost every question to the test split) does it keep its own. The test split is
unchanged. The first train reset generates the test split's 500 questions to know them (as long as
500 resets: seconds for most datasets, minutes for futoshiki or knight_swap), once per machine: their
hashes are kept under ``$OMRL_HOME/split-keys``, named by reasoning-gym's version, the dataset and its
settings, and later processes read them (``disjoint.py``).

An episode is one turn: ``reset`` gives the question, ``step(answer)`` scores the answer (without
surrounding whitespace) with the dataset's own ``score_answer`` and ends the episode. Reward and
``score`` are that score (partial credit where the dataset gives it; ``score`` clipped to [0, 1]);
``won`` at 1. An answer the scorer cannot read (it raised) scores 0 and is ``invalid``. The expert
answers with the dataset's own ``answer`` field, where it has one (boxnet, graph_color,
propositional_logic, rubiks_cube and rush_hour have none: any valid solution scores). Thirteen
datasets (grids and boards: arc_agi, rearc, sudoku, rotate_matrix, n_queens...) want a multi-line
answer, which the ``xml`` and ``tool_call`` templates carry and ``react`` (one line) cuts. A few
sympy-based scorers (countdown, puzzle24, polynomial_multiplication, the integration datasets)
take about a minute on an answer such as ``1e999999``: that is the package.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import numbers
from typing import Any, Iterator, Sequence

from omrl.envs import Env, Observation, StepResult, env_variant
from omrl.errors import ConfigError
from omrl.hookspecs import hookimpl
from omrl_plugins.envs.engines.common import PrivateRandom, RangeSplits, check_running, check_task_in_splits, require
from omrl_plugins.envs.engines.disjoint import MAX_REDRAWS, clear_of, package_version, test_keys

DATASETS = (
    "ab",
    "acre",
    "advanced_geometry",
    "aiw",
    "arc_1d",
    "arc_agi",
    "base_conversion",
    "basic_arithmetic",
    "bf",
    "binary_alternation",
    "binary_matrix",
    "bitwise_arithmetic",
    "boxnet",
    "caesar_cipher",
    "calendar_arithmetic",
    "chain_sum",
    "circuit_logic",
    "codeio",
    "color_cube_rotation",
    "complex_arithmetic",
    "count_bits",
    "count_primes",
    "countdown",
    "course_schedule",
    "cryptarithm",
    "decimal_arithmetic",
    "decimal_chain_sum",
    "dice",
    "emoji_mystery",
    "family_relationships",
    "figlet_font",
    "fraction_simplification",
    "futoshiki",
    "game_of_life",
    "game_of_life_halting",
    "gcd",
    "graph_color",
    "group_anagrams",
    "gsm_symbolic",
    "intermediate_integration",
    "isomorphic_strings",
    "jugs",
    "kakurasu",
    "knight_swap",
    "knights_knaves",
    "largest_island",
    "lcm",
    "leg_counting",
    "letter_counting",
    "letter_jumble",
    "list_functions",
    "mahjong_puzzle",
    "manipulate_matrix",
    "maze",
    "mini_sudoku",
    "modulo_grid",
    "n_queens",
    "needle_haystack",
    "number_filtering",
    "number_format",
    "number_sequence",
    "number_sorting",
    "palindrome_generation",
    "palindrome_partitioning",
    "polynomial_equations",
    "polynomial_multiplication",
    "pool_matrix",
    "power_function",
    "prime_factorization",
    "products",
    "propositional_logic",
    "puzzle24",
    "quantum_lock",
    "ransom_note",
    "rearc",
    "rectangle_count",
    "rotate_matrix",
    "rotten_oranges",
    "rubiks_cube",
    "rush_hour",
    "self_reference",
    "sentence_reordering",
    "shortest_path",
    "simple_equations",
    "simple_geometry",
    "simple_integration",
    "sokoban",
    "spell_backward",
    "spiral_matrix",
    "string_insertion",
    "string_manipulation",
    "string_splitting",
    "string_synthesis",
    "sudoku",
    "survo",
    "syllogism",
    "time_intervals",
    "tower_of_hanoi",
    "tsumego",
    "word_ladder",
    "word_sequence_reversal",
    "word_sorting",
    "zebra_puzzles",
)
LEFT_OUT = {"composite": "it only mixes other datasets and needs their configs; play those by name"}
SPLITS = {"train": range(0, 10_000), "test": range(1_000_000, 1_000_500)}
REDRAW_SEED = 2_000_000  # a train task's n-th redraw: the same item of the dataset seeded this + n * 10,000


# -- what the reasoning-gym and gem adapters share ------------------------------------------
def as_number(value: Any) -> Any:
    """A package's reward as a float, or as it came when it is no real number (the rollout's
    protocol check then ends the episode as env_error, naming the value)."""
    return float(value) if isinstance(value, numbers.Real) else value


def unit_score(value: Any) -> Any:
    """``value`` clipped to [0, 1] when it is a finite number; anything else (NaN) passes as it is,
    so that the protocol check sees it (clipping NaN would hide it as 0)."""
    if isinstance(value, float) and math.isfinite(value):
        return min(1.0, max(0.0, value))
    return value


def unknown_name(kind: str, name: str, valid: Sequence[str], left_out: dict[str, str]) -> ConfigError:
    """The error for a ``kind`` (dataset, gem env id) that omrl does not play: why it is left out,
    or the close matches (all valid names when none is close)."""
    if name in left_out:
        return ConfigError(f"{kind} {name!r} is left out: {left_out[name]}")
    close = difflib.get_close_matches(name, valid, n=5, cutoff=0.6)
    hint = f"close matches: {', '.join(close)}" if close else f"valid: {', '.join(valid)}"
    return ConfigError(f"unknown {kind} {name!r}; {hint}")


class EngineRandom:
    """The ``random`` and numpy global random states of one engine instance.

    Engines that draw from (and reseed) the global generators run inside ``active()``: they get
    their own states, kept between calls, and the caller's are back afterwards.
    """

    def __init__(self) -> None:
        self._python = PrivateRandom()
        self._numpy: Any = None

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        import numpy as np

        outer = np.random.get_state()
        if self._numpy is not None:
            np.random.set_state(self._numpy)
        try:
            with self._python.active():
                yield
        finally:
            self._numpy = np.random.get_state()
            np.random.set_state(outer)


# -- the env ----------------------------------------------------------------------------------
class ReasoningGymEnv(RangeSplits, Env):
    """reasoning_gym's procedural datasets, one question per episode (pip install 'omrl[reasoning-gym]')."""

    split_ranges = SPLITS
    splits_name = "reasoning-gym"
    package = "reasoning-gym"
    extra = "reasoning-gym"
    action_help = "One action: your final answer alone, written exactly as the question asks for it."
    max_turns = 1
    deterministic = True

    def __init__(self, dataset: str, config: dict[str, Any] | None = None):
        if dataset not in DATASETS:
            raise unknown_name("reasoning-gym dataset", dataset, DATASETS, LEFT_OUT)
        self._package = require("reasoning_gym", f"reasoning-gym:{dataset}", "reasoning-gym")
        registered = self._package.factory.DATASETS
        if dataset not in registered:
            raise ConfigError(
                f"the installed reasoning_gym has no dataset {dataset!r}; omrl plays "
                "reasoning-gym 0.1.23's datasets: pip install 'omrl[reasoning-gym]'"
            )
        self.dataset = dataset
        self.config = dict(config or {})
        _check_config(dataset, registered[dataset][1], self.config)
        self._datasets: dict[str, Any] = {}  # split -> the dataset, built at its first reset
        self._random = EngineRandom()
        self._scorer: Any = None  # the dataset the episode's question came from
        self._entry: dict[str, Any] = {}
        self._running = False

    def reset(self, task_id: int) -> Observation:
        check_task_in_splits(f"reasoning-gym:{self.dataset}", task_id, SPLITS)
        split = next(name for name, ids in SPLITS.items() if task_id in ids)
        index = task_id - SPLITS[split].start
        with self._random.active():
            if split == "train":  # a test question is drawn again (the module's docstring)
                settings = repr(sorted(self.config.items()))
                avoid = test_keys(
                    ("reasoning-gym", self.dataset, settings),
                    lambda: (self._dataset("test")[i]["question"] for i in range(len(SPLITS["test"]))),
                    disk=("reasoning-gym", package_version("reasoning-gym"), self.dataset, settings, repr(SPLITS)),
                )
                drawn = ((dataset, dataset[index]) for dataset in self._train_datasets())
                self._scorer, self._entry = clear_of(avoid, drawn, lambda pair: pair[1]["question"])
            else:
                self._scorer = self._dataset(split)
                self._entry = self._scorer[index]
        self._running = True
        question = self._entry["question"]  # passed on as it is: the rollout checks that it is text
        return Observation(question, question, {"won": False, "score": 0.0, "dataset": self.dataset})

    def _dataset(self, split: str, seed: int | None = None) -> Any:
        """The dataset of ``split`` (seeded ``seed``, by default the split's first id), built once."""
        key = split if seed is None else f"{split}@{seed}"
        if key not in self._datasets:
            ids = SPLITS[split]
            self._datasets[key] = self._package.create_dataset(
                self.dataset, **self.config, seed=ids.start if seed is None else seed, size=len(ids)
            )
        return self._datasets[key]

    def _train_datasets(self) -> Iterator[Any]:
        """The train split's dataset, then those its tasks are drawn again from."""
        yield self._dataset("train")
        for redraw in range(MAX_REDRAWS):
            yield self._dataset("train", REDRAW_SEED + redraw * len(SPLITS["train"]))

    def step(self, action: str) -> StepResult:
        check_running(f"reasoning-gym:{self.dataset}", self._running)
        self._running = False
        try:
            with self._random.active():
                score = self._scorer.score_answer(answer=action.strip(), entry=self._entry)
        except Exception as exc:  # noqa: BLE001 - the dataset's own parser refused the answer
            return StepResult(
                f"The answer could not be scored ({type(exc).__name__}: {exc}); it scores 0.",
                0.0,
                True,
                {"won": False, "score": 0.0, "invalid": True},
            )
        reward = as_number(score)
        won = isinstance(reward, float) and reward >= 1.0
        return StepResult(
            f"Your answer scored {reward} (1 is correct).",
            reward,
            True,
            {"won": won, "score": unit_score(reward), "invalid": False},
        )

    def expert_action(self) -> str | None:
        answer = self._entry.get("answer")
        return answer if self._running and isinstance(answer, str) else None


def _check_config(dataset: str, config_class: type, config: dict[str, Any]) -> None:
    """Refuse dataset settings the dataset does not take (or that fail its own validation) up front."""
    fields = [f.name for f in dataclasses.fields(config_class)]
    taken = sorted({"seed", "size"} & set(config))
    if taken:
        raise ConfigError(
            f"reasoning-gym:{dataset} option config: {taken} are set by the split (train and "
            "test have fixed seeds and sizes); leave them out"
        )
    unknown = sorted(set(config) - set(fields))
    if unknown:
        raise ConfigError(
            f"reasoning-gym:{dataset} option config: unknown settings {unknown}; valid: "
            f"{', '.join(name for name in fields if name not in ('seed', 'size'))}"
        )
    try:
        settings = config_class(**config)
        if hasattr(settings, "validate"):
            settings.validate()
    except Exception as exc:  # noqa: BLE001 - the dataset's validation says what is wrong
        raise ConfigError(f"reasoning-gym:{dataset} option config {config}: {type(exc).__name__}: {exc}") from exc


# Built once: the registry asks the hook at every lookup and must get the same classes back.
VARIANTS = {
    f"reasoning-gym:{name}": env_variant(
        ReasoningGymEnv,
        f"ReasoningGym_{name}",
        f"reasoning_gym's {name}: one question, scored by the dataset (pip install 'omrl[reasoning-gym]').",
        dataset=name,
    )
    for name in DATASETS
}


@hookimpl
def register_envs(register):
    for name, env_class in VARIANTS.items():
        register(name, env_class)
