"""Helpers the benchmark tests share: where the benchmark scripts are, and one loaded as a module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(monkeypatch: pytest.MonkeyPatch, name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as the module ``<name>_benchmark``, until the test ends (benchmarks import
    their helpers from their own folder, which goes on ``sys.path``)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
