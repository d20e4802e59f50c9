"""The README's picture, committed, unlike the site's figures: GitHub shows the README without a site build.

``make_figures.py --readme`` redraws it (:func:`readme_figure`): what ``gpipe-sim demo`` draws, the demo's predicted
and measured timelines, one above the other.
"""

from __future__ import annotations

import logging
from pathlib import Path

from figures.common import ROOT, millis, save, simulate, teach_cost
from gpipe.schedule import gpipe
from gpipe.schedule.plot import plot_timeline

log = logging.getLogger(__name__)


#: Committed: the README (on GitHub, on PyPI) shows it without a site build.
README_FIGURE = ROOT / "docs" / "img" / "demo_timeline.png"


def readme_figure(path: Path = README_FIGURE, *, measure: bool = True) -> str:
    """Draw the README's picture into ``path``; return what it shows (``"measured"`` or ``"simulated"``).

    With ``measure`` and the executor present, it runs what ``gpipe-sim demo`` runs
    (:func:`sim.calibration.experiment.run` on :func:`sim.calibration.experiment.demo_model`) and keeps the demo's own
    picture, predicted above measured. Otherwise it draws the simulator's timeline of the same schedule alone, from a
    teaching cost model.
    """
    import shutil
    import tempfile

    import matplotlib

    matplotlib.use("Agg")
    path.parent.mkdir(parents=True, exist_ok=True)
    if measure:
        try:
            from gpipe import GPipe  # noqa: F401 (only: is the executor there?)
            from sim.calibration.experiment import Setup, demo_model, run
            from sim.calibration.outcome import write_outputs
        except ImportError:
            log.warning("the executor or sim.calibration.experiment is missing: drawing a simulated timeline only")
        else:
            model, batch = demo_model(0)
            outcome = run(model, batch, Setup(), description="demo")
            with tempfile.TemporaryDirectory() as tmp:
                files = write_outputs(outcome, tmp)
                shutil.copyfile(files["plot"], path)
            return "measured"
    tl = simulate(gpipe(4, 2, "except_last"), teach_cost(n=2))
    save(plot_timeline(tl, title=f"simulated: GPipe, n=2, m=4, checkpoint=except_last: makespan {millis(tl.makespan)}"),
         path)
    return "simulated"
