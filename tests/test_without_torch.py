"""The shared language and the simulator's core run without torch: each check is a fresh interpreter in which
importing torch fails, as on a machine that lacks it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Put first in a fresh interpreter: a finder that refuses torch and its submodules before any other finder looks.
NO_TORCH = """
import sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "torch":
            raise ImportError(f"no torch here: {name}")
        return None

sys.meta_path.insert(0, NoTorch())
"""


def without_torch(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run in a fresh interpreter at the project's root, torch refused."""
    return subprocess.run([sys.executable, "-c", NO_TORCH + code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("code", [
    # every generator registered; a schedule built and drawn as its grid
    "import gpipe.schedule as s\nassert len(s.SCHEDULES) == 9\nprint(s.step_grid(s.one_f_one_b(4, 2)))",
    # the core simulates a schedule: GPipe's makespan, (m + n - 1)(t_f + t_b)
    "from gpipe.schedule import gpipe\nfrom sim.core.cost import CostModel\nfrom sim.core.engine import simulate\n"
    "assert simulate(gpipe(4, 2, 'never'), CostModel.uniform(2, 1.0, 2.0)).makespan == 15.0",
], ids=["gpipe.schedule", "sim.core"])
def test_runs_without_torch(code: str) -> None:
    result = without_torch(code)
    assert result.returncode == 0, result.stderr


def test_the_executor_needs_torch() -> None:
    """The finder works: the executor, asked for through the package, fails to import."""
    result = without_torch("from gpipe import GPipe")
    assert result.returncode != 0 and "ImportError: no torch here: torch" in result.stderr
