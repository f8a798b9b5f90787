"""PNG figures (matplotlib, imported lazily: an optional extra). One self-contained function per
figure; each takes a result object and a path."""

from __future__ import annotations

import os

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: never a display
    import matplotlib.pyplot as plt

    return plt


def plot_ab(result, path: str | os.PathLike) -> None:
    """``graphmon ab``'s figure for a graphmon.analysis.ab.ABResult: step time per arm (all
    replays, instance medians marked) and the gap ECDF of each stream rank per arm."""
    plt = _pyplot()
    ranks = sorted({s.rank for a in result.arms for s in a.streams})
    npanels = 1 + max(1, len(ranks))
    ncols = min(3, npanels)
    nrows = -(-npanels // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.8 * nrows), squeeze=False)
    axes = axes.ravel()
    for extra in axes[npanels:]:
        extra.set_axis_off()
    ax = axes[0]
    steps = result.meta.get("_step_us", {})
    for i, a in enumerate(result.arms):
        vals = np.asarray(steps.get(a.name, []), dtype=np.float64)
        if vals.size:
            ax.boxplot(vals.ravel(), positions=[i], widths=0.5, showfliers=False)
        ax.scatter(np.full(len(a.instance_medians_us), i) + np.linspace(-0.15, 0.15, len(a.instance_medians_us)),
                   a.instance_medians_us, s=14, zorder=3, label="instance medians" if i == 0 else None)
    ax.set_xticks(range(len(result.arms)), [a.name for a in result.arms])
    ax.set_ylabel("GPU time per replay (µs, CUDA events, no tracing)")
    ax.set_title("step time per arm")
    ax.legend(loc="best", fontsize=8)
    for j, r in enumerate(ranks):
        ax = axes[1 + j]
        for a in result.arms:
            s = next((s for s in a.streams if s.rank == r), None)
            if s is None or not len(s.gaps):
                continue
            v = np.sort(s.gaps)
            # log x: most gaps are ~0.2-1 µs, the rest are waits on other streams (~10-25 µs)
            ax.step(np.maximum(v, 1), np.arange(1, len(v) + 1) / len(v), where="post",
                    label=f"{a.name} (median {s.median_gap_ns:.0f})")
        ax.set_xscale("log")
        ax.set_xlabel("gap between consecutive kernels (ns, log; <= 0 drawn at 1)")
        ax.set_ylabel("fraction of gaps")
        ax.set_title(f"stream rank {r} (traced windows)")
        ax.legend(loc="lower right", fontsize=8)
    if not ranks:
        axes[1].set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
