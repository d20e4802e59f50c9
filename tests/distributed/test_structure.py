"""gpipe.transport.structure: a message's structure through its fixed header and back, and what it refuses."""

from __future__ import annotations

import pytest
import torch

from gpipe.transport.structure import HEADER, decode, describe, encode, structure_of


@pytest.mark.parametrize("structure", [
    (False, ((torch.float32, (2, 8)),)),
    (True, ((torch.float64, (3,)), None, (torch.bool, ()), (torch.int64, (1, 2, 3, 4)))),
    (True, (None,)),
    (False, ((torch.bfloat16, (0, 5)),)),
])
def test_a_structure_survives_its_header(structure: tuple) -> None:
    header = encode(structure)
    assert header.dtype == torch.int64 and header.shape == (HEADER,)
    assert decode(header) == structure


def test_structure_of_tensors_and_its_description() -> None:
    structure = structure_of([torch.zeros(2, 8), None, torch.ones(3, dtype=torch.int8)], True)
    assert structure == (True, ((torch.float32, (2, 8)), None, (torch.int8, (3,))))
    assert describe(structure) == "(float32[2, 8], None, int8[3]) as a tuple"
    assert describe(structure_of([torch.zeros(())], False)) == "(float32[])"


def test_a_dtype_the_wire_does_not_carry_is_refused() -> None:
    with pytest.raises(ValueError, match=r"a torch.uint16 tensor cannot cross between ranks: send one of "):
        encode((False, ((torch.uint16, (2,)),)))


def test_a_structure_larger_than_the_header_is_refused() -> None:
    # 2 + 20 * (2 + 2) = 82 integers > 64
    big = (True, tuple((torch.float32, (2, 2)) for _ in range(20)))
    with pytest.raises(ValueError, match=r"more entries and dimensions than a header holds \(64 integers\): send "
                                         "fewer tensors, or flatten them"):
        encode(big)
