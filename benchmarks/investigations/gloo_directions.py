"""How long posting a gloo send or receive blocks the posting thread: one group, or groups per direction.

Two spawned gloo processes on this machine each run rounds of compute (one intra-op thread, ``--threads``; Note
[threads] in ``_shared/machine.py``) and every round send the other one message of ``--kb`` KB, with receives posted
two messages ahead, as a rank of :class:`gpipe.distributed.DistributedGPipe` does between its tasks. ``one``: every
message on one group (as ``torch.distributed.pipelining`` posts them); ``two``: messages to the higher rank on one
group and to the lower on another; ``four``: two groups per direction, a direction's messages taking them in turn
(Note [a group per direction] in :mod:`gpipe.distributed.group`). The ways alternate in blocks in one spawn, so a busy
moment of the machine weighs on all. Reported per way, over both ranks: the median post, the share over 1 ms, the
longest.

Finding: on one group a post often blocks over 1 ms, on a group per direction almost never, and two per direction
gain nothing more, so ``DistributedGPipe`` keeps one group per direction (docs/benchmarks.md, "Posting on gloo").

Run: ``.venv/bin/python -m benchmarks.investigations.gloo_directions`` (``--quick``: few blocks). Writes
``benchmarks/results/gloo_directions.json``.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks._shared import options
from benchmarks._shared.machine import set_threads
from benchmarks._shared.record import command_line, results_path, write_json
from gpipe.distributed.loopback import free_port, init_loopback_group

RESULTS = results_path("gloo_directions")
WAYS = ("one", "two", "four")
AHEAD = 2  # receives posted ahead, as DistributedGPipe's default lookahead


def _rank(rank: int, port: int, kb: int, blocks: int, rounds: int, threads: int, out: str) -> None:
    import torch.distributed as dist

    set_threads(threads)
    init_loopback_group(rank, 2, port, datetime.timedelta(minutes=30))
    peer = 1 - rank
    up = [dist.new_group([0, 1], backend="gloo") for _ in range(2)]
    down = [dist.new_group([0, 1], backend="gloo") for _ in range(2)]
    mine, theirs = (up, down) if rank == 0 else (down, up)  # the groups of messages to the peer and from it
    lanes = {"one": ([None], [None]), "two": (mine[:1], theirs[:1]), "four": (mine, theirs)}
    generator = torch.Generator().manual_seed(rank)
    a, w = torch.randn(256, 256, generator=generator), torch.randn(256, 256, generator=generator) * 0.01
    message = torch.ones(kb * 256)
    posts: dict[str, list[float]] = {way: [] for way in WAYS}
    for block in range(blocks + 1):  # the first block of each way is a warm-up
        for way in (WAYS if block % 2 == 0 else WAYS[::-1]):
            to_peer, from_peer = lanes[way]
            dist.barrier()
            receives, sends = [], []

            def post_receive(k: int, from_peer: list[Any] = from_peer, receives: list[Any] = receives) -> float:
                start = time.perf_counter()
                receives.append(dist.irecv(torch.empty_like(message), group=from_peer[k % len(from_peer)],
                                           group_src=peer))
                return time.perf_counter() - start

            timed = [post_receive(k) for k in range(min(AHEAD, rounds))]
            for k in range(rounds):
                x = a
                for _ in range(4):
                    x = torch.tanh(x @ w)
                start = time.perf_counter()
                sends.append(dist.isend(message, group=to_peer[k % len(to_peer)], group_dst=peer))
                timed.append(time.perf_counter() - start)
                receive = receives[k]
                if receive is not None:  # None only on a rank outside the group
                    receive.wait()  # once: a gloo work waited twice waits for a second completion
                if k + AHEAD < rounds:
                    timed.append(post_receive(k + AHEAD))
            for send in sends:
                if send is not None:
                    send.wait()
            if block:
                posts[way] += timed
    gathered: list[Any] = [None, None]
    dist.all_gather_object(gathered, posts)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = options.parser(__doc__)
    parser.add_argument("--kb", type=int, default=128, help="KB per message (default 128, the speed benchmark's)")
    parser.add_argument("--blocks", type=int, default=None, help="timed blocks per way (default 6; --quick 2)")
    parser.add_argument("--rounds", type=int, default=100, help="rounds per block (default 100)")
    options.add_quick(parser, "few blocks")
    options.add_out(parser, RESULTS)
    options.add_threads(parser)
    args = parser.parse_args(argv)
    if min(args.kb, args.rounds) < 1 or (args.blocks is not None and args.blocks < 1):
        parser.error("need positive --kb, --blocks and --rounds")
    blocks = args.blocks if args.blocks is not None else (2 if args.quick else 6)
    import torch.multiprocessing as mp

    print(f"2 gloo processes, {args.kb} KB each way a round, {blocks} blocks of {args.rounds} rounds per way; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "posts.json")
        mp.spawn(_rank, args=(free_port(), args.kb, blocks, args.rounds, args.threads, out), nprocs=2, join=True)
        both = json.loads(Path(out).read_text())
    rows = []
    for way in WAYS:
        posts = sorted(p for rank in both for p in rank[way])
        rows.append({"way": way, "posts": len(posts), "median_ms": round(statistics.median(posts) * 1e3, 3),
                     "over_1ms": round(sum(1 for p in posts if p > 1e-3) / len(posts), 4),
                     "max_ms": round(posts[-1] * 1e3, 3)})
    print(f"{'way':5s} {'posts':>6s} {'median ms':>10s} {'over 1 ms':>10s} {'max ms':>8s}")
    for r in rows:
        print(f"{r['way']:5s} {r['posts']:6d} {r['median_ms']:10.3f} {r['over_1ms']:10.2%} {r['max_ms']:8.2f}")
    doc = {"workload": {"kb": args.kb, "blocks": blocks, "rounds": args.rounds, "processes": 2, "backend": "gloo"},
           "rows": rows}
    write_json(args.out, doc, command=command_line(__file__, argv), machine={"threads_per_rank": args.threads})
    print(f"wrote {args.out}")
    return doc


if __name__ == "__main__":
    main()
