"""The fidelity benchmark's statistics on hand-made samples: trimmed means, halves and a row's own noise."""

from __future__ import annotations

import importlib.util
import math
import statistics
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fidelity.py"


@pytest.fixture(scope="module")
def fidelity() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fidelity_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_trimmed_mean_drops_a_fifth_at_each_end(fidelity: ModuleType) -> None:
    values = (100.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, -50.0)
    assert fidelity.trimmed_mean(values) == statistics.mean([2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    assert fidelity.trimmed_mean((3.0, 1.0, 2.0), cut=0.0) == 2.0


def test_halves_is_the_drift_within_a_row(fidelity: ModuleType) -> None:
    assert fidelity.halves_of((10.0,) * 6) == 0.0
    assert fidelity.halves_of((10.0, 10.0, 10.0, 12.0, 12.0, 12.0)) == pytest.approx(2.0 / 11.0)
    assert fidelity.halves_of((10.0,)) == 0.0


def test_standard_error_of_the_block_errors(fidelity: ModuleType) -> None:
    errors = [0.0, 0.1, 0.0, -0.1, 0.0]
    assert fidelity.standard_error(errors) == pytest.approx(statistics.stdev(errors) / math.sqrt(5))
    assert fidelity.standard_error([0.04] * 5) == 0.0
    assert fidelity.standard_error([0.1]) is None
