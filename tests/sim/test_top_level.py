"""The names ``sim`` exports at its top, and ``import sim`` staying light (Note [light import] in :mod:`sim`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import sim
from gpipe.schedule import one_f_one_b


def test_a_schedule_simulated_from_the_top_level_names() -> None:
    from sim import CostModel, LinkSpec, SimConfig, StageCost, simulate

    m, p, tf, tb = 8, 4, 1.0, 2.0
    timeline = simulate(one_f_one_b(m, p), CostModel.uniform(p, tf, tb))
    assert timeline.makespan == pytest.approx((m + p - 1) * (tf + tb))

    link = LinkSpec("test", latency=0.0, bandwidth=1e30)  # copies all but free: the same closed form
    stages = (StageCost(forward=tf, backward=tb, send_bytes=8),) * p
    priced = simulate(one_f_one_b(m, p), CostModel(stages), SimConfig(link=link))
    assert priced.makespan == pytest.approx((m + p - 1) * (tf + tb))


def test_the_exports_are_the_cores_own_objects() -> None:
    from sim.calibration.compare import compare
    from sim.core.config import SimConfig
    from sim.core.cost import CostModel, StageCost
    from sim.core.engine import simulate
    from sim.core.link import LinkSpec
    from sim.planning.plan import plan
    from sim.planning.request import PlanRequest

    assert sorted(sim.__all__) == ["CostModel", "LinkSpec", "PlanRequest", "SimConfig", "StageCost", "compare", "plan",
                                   "simulate"]
    assert (sim.CostModel, sim.LinkSpec, sim.SimConfig, sim.StageCost, sim.simulate, sim.PlanRequest, sim.plan,
            sim.compare) == (CostModel, LinkSpec, SimConfig, StageCost, simulate, PlanRequest, plan, compare)
    assert set(sim.__all__) <= set(dir(sim))


def test_an_unknown_name_is_an_attribute_error_and_submodules_still_import() -> None:
    with pytest.raises(AttributeError, match="no attribute 'simulte'"):
        sim.simulte  # noqa: B018 - the attribute access is the test
    from sim import files

    assert files.__name__ == "sim.files"


def _modules_after(code: str) -> set[str]:
    """The top-level packages loaded after ``code`` runs in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return {name.split(".")[0] for name in out.split()}


def test_import_sim_does_not_import_torch() -> None:
    loaded = _modules_after("import sim")
    assert not loaded & {"torch", "numpy", "simpy", "gpipe"}, sorted(loaded & {"torch", "numpy", "simpy", "gpipe"})
    assert "simpy" in _modules_after("from sim import simulate")  # the core, on first use


def test_a_prediction_compared_from_the_top_level() -> None:
    """``sim.compare`` aligns two timelines of one schedule task by task: a slower one reads as the simulator fast."""
    from sim import CostModel, compare, simulate

    schedule = one_f_one_b(4, 2)
    predicted = simulate(schedule, CostModel.uniform(2, 1.0, 2.0))
    measured = simulate(schedule, CostModel.uniform(2, 2.0, 4.0))
    assert compare(predicted, predicted).makespan_error == 0
    assert compare(predicted, measured).makespan_error == pytest.approx(-0.5)
