"""The figure and tables of "The paper's ablation" (docs/ablation.md), and the skip table of "Skip connections and
portals": torchgpipe's U-Net counted and simulated beside the published numbers."""

from __future__ import annotations

from pathlib import Path

from figures import figure, markdown
from figures.common import md_table, millis, save


# --8<-- [start:ablation]
@figure("ablation.png")
def ablation(path: Path) -> None:
    import matplotlib.pyplot as plt

    from sim.ablation.counted import counted_unet
    from sim.ablation.study import run

    rows = run(counted_unet())
    labels = [r.step for r in rows]
    xs = range(len(rows))
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    w = 0.38
    a.bar([x - w / 2 for x in xs], [r.throughput for r in rows], w, color="#4c72b0", label="simulated")
    a.bar([x + w / 2 for x in xs], [r.published_throughput for r in rows], w, color="#bbbbbb", label="published")
    a.set_ylabel("samples / s")
    a.set_title("Throughput", fontsize=10)
    b.bar([x - w / 2 for x in xs], [100 * r.utilisation for r in rows], w, color="#4c72b0", label="simulated")
    b.bar([x + w / 2 for x in xs], [100 * r.published_utilisation for r in rows], w, color="#bbbbbb",
          label="published")
    b.set_ylabel("utilisation (%)")
    b.set_ylim(0, 100)
    b.set_title("Mean device utilisation", fontsize=10)
    for ax in (a, b):
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("torchgpipe's U-Net (5, 64) ablation on 4 P40s, chunks 8: counted and simulated beside published",
                 fontsize=10)
    fig.tight_layout()
    save(fig, path)
# --8<-- [end:ablation]


@markdown
def ablation_fragments() -> dict[str, str]:
    from sim.ablation.counted import ONE_P40, counted_unet, one_device_throughput
    from sim.ablation.study import STEPS, portal_slack, run, simulate_step

    unet = counted_unet()
    rows = run(unet)

    def verdict(error: float) -> str:
        return "within 10%" if abs(error) <= 0.10 else "**misses**"

    table = md_table(
        ["step", "simulated samples/s", "published samples/s", "error", "simulated utilisation",
         "published utilisation", "error"],
        [[r.step, f"{r.throughput:.1f}", f"{r.published_throughput:.3f}",
          f"{r.throughput_error:+.1%} ({verdict(r.throughput_error)})", f"{r.utilisation:.0%}",
          f"{r.published_utilisation:.0%}", f"{r.utilisation_error:+.1%} ({verdict(r.utilisation_error)})"]
         for r in rows])
    by = {r.step: r for r in rows}
    skip = md_table(["skip connections", "makespan", "samples/s", "utilisation"],
                    [[label, millis(by[step].makespan), f"{by[step].throughput:.1f}", f"{by[step].utilisation:.0%}"]
                     for label, step in (("through every stage", "+ streams"), ("portals", "+ portals"))])
    batch, published = ONE_P40
    one = one_device_throughput(batch)
    factor = one / published
    fast = run(unet.scaled_compute(factor))
    evidence = (f"torchgpipe's U-Net speed benchmark trains the same U-Net (5, 64) on **one** P40, batch {batch}, "
                f"no pipeline: {published:.1f} samples/s published, {one:.1f} counted (the same counts and roofline, "
                f"{one / published - 1:+.0%}). No pipeline, copy or schedule is involved there: the counted kernels "
                f"take {1 / factor:.2f}x as long as the P40's. With every compute second times {factor:.3f} "
                f"(that one-GPU ratio; a diagnostic, not the prediction):\n\n" + md_table(
                    ["step", "samples/s", "published", "error", "utilisation", "published", "error"],
                    [[r.step, f"{r.throughput:.1f}", f"{r.published_throughput:.3f}", f"{r.throughput_error:+.1%}",
                      f"{r.utilisation:.0%}", f"{r.published_utilisation:.0%}", f"{r.utilisation_error:+.1%}"]
                     for r in fast]))
    from sim.core.copies import ON_COMPUTE

    on_compute = [sum(s.duration for s in simulate_step(step, unet).spans if s.label == ON_COMPUTE) for step in STEPS]
    busy = md_table(["step", "published: utilisation x 4 GPUs x step", "simulated: kernels (catalog P40)",
                     f"kernels x {factor:.3f}", "simulated copies on the compute streams"],
                    [[r.step, f"{4 * r.published_utilisation * unet.batch / r.published_throughput:.2f} s",
                      f"{4 * r.utilisation * r.step_seconds:.2f} s", f"{4 * f.utilisation * f.step_seconds:.2f} s",
                      f"{c:.2f} s"] for r, f, c in zip(rows, fast, on_compute, strict=True)])
    tl = simulate_step(STEPS[-1], unet)
    memory = sum(tl.peak_memory(d) for d in range(unet.devices)) / 2**30
    notes = (f"The long skips' own portal copies (stage 0 to 3, 1 to 3) end at least "
             f"{millis(portal_slack(tl, unet))} before the forward that waits for them (Note [portal copies]). "
             f"The simulated peak of saved activations is {memory:.1f} GiB over the four devices in every step.")
    return {"ablation_table": table, "skip_table": skip, "unet_setup": unet.describe(),
            "ablation_evidence": evidence, "ablation_busy": busy, "ablation_notes": notes}
