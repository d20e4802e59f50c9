"""Sequence parallelism (Korthikanti et al., 2022) in the planner: a shard whose LayerNorms and dropouts run on ``s/t``
tokens, its all-reduces replaced by reduce-scatters and all-gathers of the same volume.

The closed forms, per layer in 16 bits with the math attention: ``s·b·h/t·(34 + 5·a·s/h)`` bytes saved, and
``34·s·b·h/t`` under selective recompute; the counter sees ``16·s·b/t`` bytes more, the fp32 mean and 1/std of the
block's two LayerNorms over this rank's tokens.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch

from sim.core.link import LinkSpec
from sim.core.rings import allgather_seconds, allreduce_seconds, reduce_scatter_seconds
from sim.planning.costs.from_flops import FlopCosts
from sim.planning.counting.counts import ALL_GATHER, ALL_REDUCE, COLLECTIVE, REDUCE_SCATTER, ModelProfile, OpTable
from sim.planning.counting.models import get_model
from sim.planning.counting.models.gpt import GPTConfig, gpt
from sim.planning.hardware.catalog import get_device
from sim.planning.parallel.recompute import core_table

H, A, S, V = 256, 8, 128, 1000  # hidden, heads, tokens, vocabulary of the small GPT
SMALL = f"gpt:layers=2,hidden={H},heads={A},seq={S},vocab={V},attention=math"  # Korthikanti et al.'s attention
LLAMA = "llama:layers=2,hidden=128,heads=8,kv-heads=4,ffn=256,seq=32,vocab=100,attention=math"
AG, RS, AR = ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE
SLOW, INSTANT = LinkSpec("slow", 1e-3, 1e9), LinkSpec("instant", 0.0, 1e30)


@cache
def _profile(t: int, sequence_parallel: bool = True, spec: str = SMALL) -> ModelProfile:
    return get_model(spec).tensor_parallel(t, sequence_parallel=sequence_parallel).count(torch.float16)


def _collectives(table: OpTable | None, batch: int) -> list[tuple[int, float]]:
    """Each collective of ``table`` as (kind, bytes of its whole message)."""
    assert table is not None
    at = table.kinds_or_default() == COLLECTIVE
    return [(int(k), float(x)) for k, x in zip(table.collectives_or_default()[at], table.bytes_at(batch)[at],
                                                strict=True)]


@pytest.mark.parametrize("t", [2, 4])
@pytest.mark.parametrize("b", [2, 3])
def test_saved_activations_per_layer_are_korthikantis_over_t(t: int, b: int) -> None:
    block = _profile(t).at(b)[1]
    assert block.saved_bytes == S * b * H / t * (34 + 5 * A * S / H) + 16 * S * b / t
    assert block.output_bytes == 2 * b * S * H / t  # a stage boundary sends this rank's tokens


@pytest.mark.parametrize("t", [2, 4])
@pytest.mark.parametrize("b", [2, 3])
def test_selective_recompute_keeps_34_sbh_over_t(t: int, b: int) -> None:
    profile = _profile(t)
    core = profile.attention_core
    assert core is not None and core_table(profile.layers[1].forward, core).kernels > 0
    assert profile.at(b)[1].saved_bytes - core.saved_bytes * b == 34 * S * b * H / t + 16 * S * b / t
    costs = FlopCosts(profile, get_device("a100-80gb"), "fp16-adam", tensor_link=SLOW)
    stage = costs.stages([1, 2, 1], b, recompute="selective")[1]  # the two blocks
    assert stage.saved_bytes == 2 * (34 * S * b * H / t + 16 * S * b / t)


@pytest.mark.parametrize("t", [2, 4])
def test_each_all_reduce_becomes_a_reduce_scatter_and_an_all_gather(t: int) -> None:
    b = 3
    message = 2 * b * S * H  # bytes: b·s·h elements in 16 bits, gathered or before the scatter
    embedding, block, _, head = _profile(t).layers
    assert _collectives(block.forward, b) == [(AG, message), (RS, message)] * 2  # f and g of attention, of the MLP
    # backward: g's all-gather, f's reduce-scatter after the GEMMs' input gradient and their tokens gathered again
    # for the weights' gradients (Note [gather again in the backward]); the input's gradient alone skips those
    assert _collectives(block.backward, b) == [(AG, message), (RS, message), (AG, message)] * 2
    assert _collectives(block.input_backward, b) == [(AG, message), (RS, message)] * 2
    assert _collectives(embedding.forward, b) == [(AR, message)]  # lookups summed, then this rank's tokens kept
    assert _collectives(embedding.backward, b) == [(AG, message)]
    assert _collectives(head.forward, b) == [(AG, message)]
    assert _collectives(head.backward, b) == [(RS, message), (AG, message)]


@pytest.mark.parametrize("t", [2, 4])
def test_a_layers_forward_moves_what_its_all_reduces_did(t: int) -> None:
    """Two reduce-scatters and two all-gathers send ``4 (t - 1) / t`` of the message per rank, as two all-reduces,
    and take as long on a link: ``(t - 1) / t * bytes / bandwidth + (t - 1) * latency`` each."""
    b = 3
    message = 2 * b * S * H

    def sent(kind: int, nbytes: float) -> float:
        return (2 if kind == AR else 1) * (t - 1) / t * nbytes

    split, whole = _profile(t).layers[1], _profile(t, False).layers[1]
    assert sum(sent(*c) for c in _collectives(split.forward, b)) == \
        sum(sent(*c) for c in _collectives(whole.forward, b)) == 4 * (t - 1) / t * message
    ring = (t - 1) / t * message / SLOW.bandwidth + (t - 1) * SLOW.latency
    assert ring == pytest.approx(reduce_scatter_seconds(message, t, SLOW)) == allgather_seconds(message, t, SLOW)
    device = get_device("a100-80gb")
    for profile, priced in ((_profile(t), 4 * ring), (_profile(t, False), 2 * allreduce_seconds(message, t, SLOW))):
        slow = FlopCosts(profile, device, "fp16-adam", tensor_link=SLOW).layer_seconds(b)[0]
        instant = FlopCosts(profile, device, "fp16-adam", tensor_link=INSTANT).layer_seconds(b)[0]
        assert slow[1] - instant[1] == pytest.approx(priced)
        assert priced == pytest.approx(4 * ring)


@pytest.mark.parametrize("spec", [SMALL, SMALL + ",kernels=eager", LLAMA, LLAMA + ",kernels=eager"])
@pytest.mark.parametrize("t", [2, 4])
def test_the_flops_are_the_shards_without_it(spec: str, t: int) -> None:
    split, whole = _profile(t, True, spec), _profile(t, False, spec)
    for a, b in zip(split.layers, whole.layers, strict=True):
        for table in ("forward", "backward", "input_backward"):
            ta, tb = getattr(a, table), getattr(b, table)
            assert (ta.flops_at(3).sum(), ta.flops_at(5).sum()) == (tb.flops_at(3).sum(), tb.flops_at(5).sum())
    assert split.parameters == whole.parameters


def test_a_llama_shard_reduce_scatters_its_lookups() -> None:
    embedding, block, _, _ = _profile(2, True, LLAMA).layers
    message = 2 * 3 * 32 * 128
    assert _collectives(embedding.forward, 3) == [(RS, message)]  # no positions to add after the sum
    assert _collectives(block.forward, 3) == [(AG, message), (RS, message)] * 2  # q, k, v share one all-gather


def test_the_profile_and_the_spec_say_so() -> None:
    assert _profile(2).sequence_parallel and not _profile(2, False).sequence_parallel
    assert _profile(2).tensor_parallel == 2
    spec = get_model(SMALL)
    assert spec.tensor_parallel(2, sequence_parallel=True).description.endswith(
        "tensor-parallel shard of 2, sequence parallel)")
    assert "sequence" not in spec.tensor_parallel(2).description
    assert spec.tensor_parallel(1, sequence_parallel=True) is spec  # one rank: the whole model
    with pytest.raises(ValueError, match="does not divide the 12 tokens"):
        get_model("gpt:layers=1,hidden=64,heads=8,seq=12,vocab=50").tensor_parallel(8, sequence_parallel=True)
    with pytest.raises(ValueError, match="needs tensor_parallel > 1"):
        GPTConfig(sequence_parallel=True)


def test_a_tiny_shard_runs_on_the_cpu() -> None:
    """The markers stand in for the collectives on a real device too: the shard trains, its shapes are one rank's."""
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=4, d_model=32, seq_len=8, vocab_size=50, tensor_parallel=2,
                    sequence_parallel=True)
    model = gpt(cfg)
    ids = torch.randint(cfg.shard_vocab, (3, 8))  # ids of this rank's rows (its lookup masks no others here)
    assert model[0](ids).shape == (3, 4, 32)  # this rank's 4 of the 8 tokens
    out = model(ids)
    assert out.shape == (3, 8, 25)  # every token's logits over this rank's half of the vocabulary
    out.pow(2).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
