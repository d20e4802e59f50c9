"""gpipe.distributed.shapes.check_boundaries: the whole model on fake tensors, a mismatch between stages refused
with both shapes, nothing of the model changed, anything else left to the real step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpipe.distributed.shapes import check_boundaries
from gpipe.transport.structure import structure_of
from tests.gpipe.models import skipnet, tuple_input, tuplenet

BATCH = structure_of([torch.zeros(2, 6)], False)


def _mismatched() -> list[nn.Module]:
    return [nn.Linear(6, 6), nn.Tanh(), nn.Linear(5, 3)]


def test_a_mismatch_between_stages_names_both_shapes() -> None:
    with pytest.raises(ValueError) as caught:
        check_boundaries(_mismatched(), [2, 1], BATCH)
    assert str(caught.value) == (
        "shape mismatch between stages 0 and 1: stage 0 outputs (float32[2, 6]), and stage 1's first layer (layer 2, "
        "Linear) cannot take it: RuntimeError: a and b must have same reduction dim, but got [2, 6] X [5, 3]. (fix "
        "the layers at the boundary, or move it with the balance)")


def test_layers_on_meta_are_checked_alike() -> None:
    with torch.device("meta"):
        layers = _mismatched()
    layers[0] = nn.Linear(6, 6)  # this rank's layer, real; the others on meta
    with pytest.raises(ValueError, match=r"stage 0 outputs \(float32\[2, 6\]\)"):
        check_boundaries(layers, [2, 1], BATCH)


def test_a_mismatch_inside_a_stage_is_left_to_the_step() -> None:
    check_boundaries(_mismatched(), [3], BATCH)
    check_boundaries(_mismatched(), [1, 2], BATCH)


def test_a_good_model_passes_and_keeps_its_state_modes_and_random_stream() -> None:
    torch.manual_seed(0)
    norm = nn.BatchNorm1d(6)
    layers: list[nn.Module] = [nn.Linear(6, 6), nn.Dropout(0.5), norm, nn.Linear(6, 3)]
    layers[1].eval()
    before = {k: v.clone() for k, v in norm.state_dict().items()}
    rng = torch.get_rng_state()
    check_boundaries(layers, [2, 2], BATCH)
    assert all(torch.equal(v, norm.state_dict()[k]) for k, v in before.items())
    assert torch.equal(rng, torch.get_rng_state())
    assert [layer.training for layer in layers] == [True, False, True, True]


def test_skips_and_tuples_cross_stages_in_the_dry_run() -> None:
    check_boundaries(list(skipnet()), [2, 3], BATCH)
    check_boundaries(list(tuplenet()), [2, 2], structure_of(list(tuple_input(4)), True))
