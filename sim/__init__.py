"""gpipe-sim's simulator, in layers; each imports only the layers listed before it (tests/test_imports.py checks).

    sim.core         the discrete-event simulator: devices, compute and copy streams, links, memory, a cost per
                     task; it knows schedules and timelines (gpipe.schedule, gpipe.schedule.timeline), nothing of the
                     executor
    sim.calibration  measures the executor (gpipe) on this machine and turns what it measures into the core's costs:
                     the experiment behind ``gpipe-sim demo`` and ``compare``, and its outcome
    sim.planning     capacity-planning sweeps (:func:`sim.planning.plan.plan` of a
                     :class:`sim.planning.request.PlanRequest`) on rooms layered below them: ``counting`` (FLOPs and
                     bytes on ``meta``, the built-in models), ``hardware`` (the catalog, rooflines), ``parallel``
                     (the layout, its nodes, each dimension's price), ``costs`` (a count priced on a device)
    sim.ablation     the torchgpipe paper's U-Net ablation, simulated on counted costs
    sim.cli          the ``gpipe-sim`` command line on top of the core, calibration and planning

:mod:`sim.files` (output folders that never overwrite a user's files unasked) serves every layer that writes,
:mod:`sim.workers` (child processes that end with their parent) every layer that starts processes.

What simulating a schedule from Python takes is exported here, from the core::

    from gpipe.schedule import one_f_one_b
    from sim import CostModel, LinkSpec, SimConfig, StageCost, simulate

    timeline = simulate(one_f_one_b(8, 4), CostModel.uniform(4, forward=1.0, backward=2.0))
    timeline.makespan                                   # (m + p - 1)(tf + tb) = 33.0

    stages = (StageCost(forward=1.0, backward=2.0, send_bytes=2**20),) * 4
    link = LinkSpec("pcie", latency=1e-5, bandwidth=16e9)
    simulate(one_f_one_b(8, 4), CostModel(stages), SimConfig(link=link))   # each copy: latency + bytes / bandwidth

What planning a cluster takes, from the planning layer (:mod:`sim.planning.plan`)::

    from sim import PlanRequest, plan

    result = plan(PlanRequest(profile=counts, batch=256, device="a100-80gb", gpus=[64], link="nvlink"))
    result.best                                         # the fastest configuration that fits

What checking a prediction against the executor takes, from the calibration layer (:mod:`sim.calibration.compare`)::

    from sim import compare

    comparison = compare(predicted, measured)           # two timelines of one schedule, aligned task by task
    comparison.makespan_error                           # (predicted - measured) / measured

Note [light import]: ``import sim`` loads none of its layers: what needs only part of sim (:mod:`sim.files`, the
dispatcher in :mod:`sim.cli`) should not pay for SimPy, numpy or the planner's torch. So the names above are
looked up in their modules on first use (``__getattr__``), and ``from sim import simulate`` imports the core then.
"""

TYPE_CHECKING = False  # typing's constant, without importing typing (Note [light import])
if TYPE_CHECKING:
    from sim.calibration.compare import compare
    from sim.core.config import SimConfig
    from sim.core.cost import CostModel, StageCost
    from sim.core.engine import simulate
    from sim.core.link import LinkSpec
    from sim.planning.plan import plan
    from sim.planning.request import PlanRequest

__all__ = ["CostModel", "LinkSpec", "PlanRequest", "SimConfig", "StageCost", "compare", "plan", "simulate"]

#: Where each exported name lives (Note [light import]).
_HOMES = {"CostModel": "sim.core.cost", "LinkSpec": "sim.core.link", "SimConfig": "sim.core.config",
          "StageCost": "sim.core.cost", "simulate": "sim.core.engine", "PlanRequest": "sim.planning.request",
          "plan": "sim.planning.plan", "compare": "sim.calibration.compare"}


def __getattr__(name: str) -> object:
    """An exported name, imported from its module on first use and kept (Note [light import])."""
    home = _HOMES.get(name)
    if home is None:  # an AttributeError lets ``from sim import files`` import the submodule
        raise AttributeError(f"module 'sim' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
