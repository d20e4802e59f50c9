"""The largest built-in model the planner counts: a cap on each size of each family, checked when its config is made.

Note [size caps]: a model is counted layer by layer on the meta device (:mod:`sim.planning.counting.flops`), so the
count's time grows with the layers, and a width past the caps below makes a tensor whose bytes overflow a signed 64-bit
integer. Each cap is far above the largest published model of its family, and the deepest model allowed counts in
under a minute on a 2-core machine: a decoder block takes about 5 ms to build and count there, a U-Net layer
about 9 ms, an AmoebaNet cell about 0.5 s. Past a cap the refusal comes at once, with the model's parameters or the
count's time estimated, instead of a count that runs for hours or overflows.
"""

from __future__ import annotations

__all__ = ["AMOEBANET_FILTERS", "AMOEBANET_LAYERS", "DECODER_LAYERS", "EXPERTS", "FFN", "HIDDEN", "SEQ", "UNET_BLOCKS",
           "UNET_CHANNELS", "VOCAB", "check_amoebanet_size", "check_decoder_size", "check_unet_size"]

DECODER_LAYERS = 2048  # blocks; GPT-3 175B has 96, Llama 3 405B 126: about 10 s to count
HIDDEN = 2**17  # 131,072; PaLM 540B has 18,432, Megatron-LM's 1T GPT 25,600
FFN = 2**19  # 524,288, the MLP's width; PaLM 540B has 73,728
SEQ = 2**20  # 1,048,576 tokens; Llama 3.1's context is 131,072 (heads x s^2 scores stay below 2^63 bytes)
VOCAB = 2**21  # 2,097,152 tokens; Gemma has 256,000, Llama 3 128,256
EXPERTS = 2**14  # 16,384 routed experts a block; DeepSeek-V3 has 256 (its config_671B.json), Kimi K2 384
UNET_BLOCKS = 64  # B: 44 B + 21 = 2,837 layers, about 25 s; torchgpipe's largest U-Net has B = 48
UNET_CHANNELS = 4096  # C; torchgpipe's largest has 160
AMOEBANET_LAYERS = 96  # L: L + 4 cells, about 50 s; GPipe's largest AmoebaNet-D has L = 72
AMOEBANET_FILTERS = 8192  # D; GPipe's Table 1 goes to 544

_BLOCK_SECONDS = 5e-3  # to build and count one decoder block on meta (Note [size caps])
_UNET_LAYER_SECONDS = 9e-3  # to count one U-Net layer
_CELL_SECONDS = 0.5  # to count one AmoebaNet cell


def _duration(seconds: float) -> str:
    """``seconds`` in the largest unit that keeps it above 1 (``"about 58 days"``)."""
    for unit, size in (("years", 365 * 86400), ("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= 2 * size:
            return f"about {seconds / size:,.0f} {unit}"
    return f"about {seconds:.0f} seconds"


def _cap(what: str, value: int, cap: int, known: str, estimate: str) -> None:
    if value > cap:
        raise ValueError(f"{what} {value:,} is above the planner's cap of {cap:,} ({known}): {estimate}")


def check_decoder_size(layers: int, hidden: int, ffn: int, seq: int, vocab: int, heads: int,
                       parameters: int, experts: int = 0) -> None:
    """Refuse a decoder of any family past a cap (Note [size caps]); the message estimates what it would cost.

    Raises:
        ValueError: one line naming the size, the cap and the estimate.
    """
    size = f"about {parameters:.2g} parameters"
    _cap("layers", layers, DECODER_LAYERS, "GPT-3 175B has 96, Llama 3 405B 126",
         f"{size}, and counting them on the meta device takes {_duration(layers * _BLOCK_SECONDS)}")
    _cap("hidden size", hidden, HIDDEN, "PaLM 540B's is 18,432", size)
    _cap("MLP width", ffn, FFN, "PaLM 540B's is 73,728", size)
    _cap("vocabulary", vocab, VOCAB, "Gemma's is 256,000", size)
    _cap("routed experts", experts, EXPERTS, "DeepSeek-V3 has 256", size)
    _cap("sequence", seq, SEQ, "Llama 3.1's context is 131,072 tokens",
         f"the attention's scores alone are {heads * seq * seq:.2g} elements a sample")


def check_unet_size(blocks: int, channels: int) -> None:
    """Refuse a U-Net (B, C) past a cap (Note [size caps]).

    Raises:
        ValueError: one line naming the size, the cap and the estimate.
    """
    layers = 44 * blocks + 21
    _cap("U-Net B", blocks, UNET_BLOCKS, "torchgpipe's largest is 48",
         f"{layers:,} layers, and counting them takes {_duration(layers * _UNET_LAYER_SECONDS)}")
    _cap("U-Net C", channels, UNET_CHANNELS, "torchgpipe's largest is 160",
         f"the bottleneck's convolutions alone have {9 * (32 * channels) ** 2:.2g} weights")


def check_amoebanet_size(layers: int, filters: int) -> None:
    """Refuse an AmoebaNet-D (L, D) past a cap (Note [size caps]).

    Raises:
        ValueError: one line naming the size, the cap and the estimate.
    """
    _cap("AmoebaNet-D L", layers, AMOEBANET_LAYERS, "GPipe's largest is 72",
         f"{layers + 4:,} cells, and counting them takes {_duration((layers + 4) * _CELL_SECONDS)}")
    _cap("AmoebaNet-D D", filters, AMOEBANET_FILTERS, "GPipe's largest is 544",
         f"the last cells' convolutions alone have about {(4 * filters) ** 2:.2g} weights each")
