"""Child processes that end with their parent: the demo's ranks and the planner's sweep workers.

Pure Python (no torch), so every layer of :mod:`sim` may use it.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

__all__ = ["exit_with_parent"]


# Note [orphaned children]: a parent ends its children on its way out, Ctrl-C included, but a parent killed outright
# (SIGKILL, the OOM killer) runs no code, and a child would go on alone, holding a core. So each child watches its
# parent and exits when it is gone (re-parented: ``getppid`` changes). The parent is the pid multiprocessing handed
# over at the start, not ``getppid`` read here: a child reaches this after its imports, and a parent killed
# meanwhile would leave ``getppid`` already the new parent.
def exit_with_parent(every: float = 0.5) -> None:
    """Start a daemon thread that ends this process (``os._exit(1)``) once its parent is gone; polled every
    ``every`` seconds (Note [orphaned children])."""
    launcher = multiprocessing.parent_process()
    parent = launcher.pid if launcher is not None and launcher.pid is not None else os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        os._exit(1)

    threading.Thread(target=watch, name="gpipe-sim parent watch", daemon=True).start()
