"""The training code's shape stays as the renovation left it: one recipe scaffold of free functions that
every recipe calls (no recipe base class), generation that takes values rather than a recipe, the core
reading strategy traits rather than names, lower layers never importing training, and algorithm help
generated from the registry."""

from __future__ import annotations

import ast
from pathlib import Path

import omrl
from omrl.config import describe
from omrl.config.options import TrainRunConfig
from omrl.hookspecs import hookimpl
from tests.test_architecture import _imported_modules

CORE = Path(omrl.__file__).parent
TRAINING = CORE / "training"


def _classes(path: Path) -> list[ast.ClassDef]:
    return [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)]


def test_no_recipe_inherits_a_scaffold():
    """A recipe reads top to bottom in its own file: it calls omrl.training.recipe, it does not inherit."""
    offenders = [
        f"{path.relative_to(CORE.parent)}: class {cls.name}({', '.join(ast.unparse(b) for b in cls.bases)})"
        for path in sorted(CORE.rglob("*.py"))
        for cls in _classes(path)
        if cls.name.endswith("Recipe") and cls.bases and not any(ast.unparse(b) == "Protocol" for b in cls.bases)
    ]
    assert not offenders, "recipes inherit nothing:\n" + "\n".join(offenders)


def test_scaffold_functions_are_typed_with_the_recipe_protocols():
    """Every function of the scaffolds that takes a recipe names what it reads (a Protocol), never Any."""
    untyped = []
    for name in ("recipe.py", "online_run.py"):
        for node in ast.walk(ast.parse((TRAINING / name).read_text())):
            if isinstance(node, ast.FunctionDef):
                for arg in node.args.args:
                    if arg.arg == "recipe" and (arg.annotation is None or ast.unparse(arg.annotation) == "Any"):
                        untyped.append(f"{name}:{node.lineno} {node.name}")
    assert not untyped, "type the recipe a scaffold function takes:\n" + "\n".join(untyped)


def test_the_generation_process_knows_no_recipe():
    """async_generation takes values: it imports neither the recipes nor what plays their steps."""
    above = ("omrl.training.online", "omrl.training.online_run", "omrl.training.rl", "omrl.training.dpo")
    found = [
        f"line {line}: {module}"
        for line, module in _imported_modules(TRAINING / "async_generation.py")
        if module in above
    ]
    assert not found, found
    functions = [
        n for n in ast.walk(ast.parse((TRAINING / "async_generation.py").read_text())) if isinstance(n, ast.FunctionDef)
    ]
    takes = [f.name for f in functions if any(arg.arg == "recipe" for arg in f.args.args)]
    assert not takes, f"these take a recipe instead of values: {takes}"


def test_the_core_reads_strategy_traits_not_names():
    """Training treats alike every strategy that declares the same traits: no built-in name compared."""
    offenders = [
        f"{path.relative_to(CORE.parent)}:{number}"
        for path in sorted(TRAINING.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "strategy" in line and ('== "chain"' in line or '!= "chain"' in line)
    ]
    assert not offenders, offenders


def test_search_state_is_not_kept_by_object_identity():
    """A search keeps each task's state on an object of its own, not in dicts keyed by id() (the forker's
    parked env states are opaque objects it keeps alive: keyed by id there on purpose)."""
    offenders = [
        f"{path.relative_to(CORE.parent)}:{number}"
        for path in (CORE / "search" / "runner.py", CORE / "search" / "context.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "id(" in line.replace("_id(", "").replace("uuid(", "")
    ]
    assert not offenders, offenders


def test_models_and_lower_layers_never_import_training():
    """Loading a model needs nothing of training (its manifest checks live in omrl.models.manifest)."""
    lower = [CORE / "models", CORE / "chat", CORE / "backends", CORE / "config"]
    offenders = [
        f"{path.relative_to(CORE.parent)}:{line} imports {module}"
        for folder in lower
        for path in sorted(folder.rglob("*.py"))
        for line, module in _imported_modules(path)
        if module.startswith("omrl.training")
    ]
    assert not offenders, offenders


def test_algorithm_help_lists_what_is_registered(register_plugin):
    """The help of algorithm.advantage (and the other plugin-named options) is generated from the
    registry: a third-party estimator appears there, with no list kept by hand."""

    class MyEstimator:
        @hookimpl
        def register_algorithms(self, register):
            register("my_estimator", lambda data, cfg: None, kind="advantage")

    def help_of(key: str) -> str:
        return next(row[3] for row in describe(TrainRunConfig) if row[0] == key)

    assert "my_estimator" not in help_of("algorithm.advantage")
    register_plugin(MyEstimator(), name="my-estimator")
    assert "my_estimator" in help_of("algorithm.advantage")
    assert "grpo" in help_of("algorithm.advantage") and "gae" in help_of("algorithm.advantage")
    for key, some in (("policy_loss", "ppo_clip"), ("kl_estimator", "k3"), ("rollout_correction", "token_tis")):
        assert some in help_of(f"algorithm.{key}"), key
