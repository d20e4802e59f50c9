"""A torchgpipe script runs with only its imports changed (examples/torchgpipe_example.py)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchgpipe_example.py"


def test_torchgpipe_example_runs() -> None:
    spec = importlib.util.spec_from_file_location("torchgpipe_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, losses, calls = module.main(steps=3, batch=16, chunks=4)
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
    assert calls == 3 * 4  # once per micro-batch per step, never on recompute
    assert sum(model.balance) == len(model)
    source = EXAMPLE.read_text()
    assert "from torchgpipe" not in source.split('"""')[2]  # only gpipe imports below the docstring
