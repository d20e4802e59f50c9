"""The benchmarks' tests import what the scripts share (``benchmarks/_shared``) as the scripts do: from
``benchmarks/`` on ``sys.path``."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = str(Path(__file__).resolve().parents[2] / "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)
