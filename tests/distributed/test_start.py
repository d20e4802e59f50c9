"""gpipe.distributed.start: what a rank tells the others at a step's start survives its row of integers, and an
input structure's fingerprint is the same in every process (Note [one exchange a step])."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from gpipe.distributed.start import Told, _row, _told, fingerprint
from gpipe.transport.structure import structure_of

FIRST = Told(rejected=False, may_draw=True, rows=[3, 3, 2], fingerprint=(1 << 62) + 5, input_is_tuple=True)
LAST = Told(rejected=True, may_draw=False, target_rows=8)
MIDDLE = Told(rejected=False, may_draw=False)


@pytest.mark.parametrize("told", [FIRST, LAST, MIDDLE, Told(False, False, rows=[1], target_rows=1)])
def test_what_a_rank_told_survives_its_row(told: Told) -> None:
    row = _row(told, chunks=4)
    assert row.dtype == torch.int64 and row.shape == (6 + 4,)  # the same size on every rank
    assert _told(row) == told


@pytest.mark.slow
def test_fingerprints_tell_structures_apart_and_agree_across_processes() -> None:
    one = structure_of([torch.zeros(2, 6)], False)
    assert fingerprint(one) == fingerprint(structure_of([torch.ones(2, 6)], False))
    others = [structure_of([torch.zeros(3, 6)], False), structure_of([torch.zeros(2, 6)], True),
              structure_of([torch.zeros(2, 6, dtype=torch.float64)], False),
              structure_of([torch.zeros(2, 6), None], True)]
    assert len({fingerprint(s) for s in [one, *others]}) == 5
    assert all(0 <= fingerprint(s) < 2**63 for s in [one, *others])
    code = ("import torch; from gpipe.distributed.start import fingerprint; "
            "print(fingerprint((False, ((torch.float32, (2, 6)),))))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", "PATH": ""})
    assert int(other.stdout) == fingerprint(one)
