"""Histogram bucket bounds (ns) and the per-group bucket count: what a histogram series looks like."""

from __future__ import annotations

from typing import Optional

import numpy as np

from graphmon.analysis.replays import QUANTILES
from graphmon.export.snapshot import Hist

# Histogram upper bounds in ns. Gaps: from the 32 ns GPU timer tick to 10 ms, dense in 0.1-2 µs so
# that a 0.19 µs -> 0.51 µs median shift moves counts across several buckets.
GAP_BUCKETS_NS = (
    32, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768,
    1_000, 1_250, 1_500, 2_000, 3_000, 5_000, 10_000, 20_000, 50_000, 100_000, 1_000_000, 10_000_000,
)
# Replay GPU time / busy: 10 µs .. 1 s, dense around decode step times (0.5-5 ms).
REPLAY_BUCKETS_NS = (
    10_000, 50_000, 100_000, 250_000, 500_000, 750_000, 1_000_000, 1_250_000, 1_500_000, 1_750_000,
    2_000_000, 2_500_000, 3_000_000, 4_000_000, 5_000_000, 7_500_000, 10_000_000, 25_000_000,
    50_000_000, 100_000_000, 1_000_000_000,
)
# Idle per replay, launch latency, inter-replay gap: 1 µs .. 100 ms.
IDLE_BUCKETS_NS = (
    1_000, 5_000, 10_000, 25_000, 50_000, 100_000, 150_000, 200_000, 250_000, 300_000, 400_000,
    500_000, 750_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000, 100_000_000,
)
REPLAY_KINDS = {  # metric kind -> (Replays field, buckets)
    "gpu": ("span_ns", REPLAY_BUCKETS_NS),
    "busy": ("busy_ns", REPLAY_BUCKETS_NS),
    "idle": ("idle_ns", IDLE_BUCKETS_NS),
    "launch_latency": ("launch_latency_ns", IDLE_BUCKETS_NS),
    "inter_replay_gap": ("inter_replay_gap_ns", IDLE_BUCKETS_NS),
}
# Untraced replay time (CUDA events around a graph launch, kernel tracing off; export.untraced):
# 20 us .. 200 ms, log-spaced at six bounds a decade (1, 1.5, 2, 3, 5, 7), for replays of ~50 us
# (a small decode graph) to ~100 ms (a long prefill).
UNTRACED_BUCKETS_NS = (
    20_000, 30_000, 50_000, 70_000, 100_000, 150_000, 200_000, 300_000, 500_000, 700_000,
    1_000_000, 1_500_000, 2_000_000, 3_000_000, 5_000_000, 7_000_000, 10_000_000, 15_000_000,
    20_000_000, 30_000_000, 50_000_000, 70_000_000, 100_000_000, 150_000_000, 200_000_000,
)
GAP_QUANTILES = QUANTILES  # the same four as the analyze/status summary: one pass serves both
REPLAY_QUANTILES = (0.5, 0.9, 0.99)
# Values beyond this are not times a GPU produced (a gap or replay of more than 1,000 s inside one
# sampling window): they are excluded from histograms and counted, so sums cannot overflow int64
# (a window would need 9.2 million such values) and one bad timestamp cannot skew a mean.
MAX_VALUE_NS = 1_000 * 10**9


def bucket_counts(values: np.ndarray, group: np.ndarray, ngroups: int, bounds_ns) -> np.ndarray:
    """Per-group bucket counts (ngroups x (len(bounds)+1)); bucket i holds v <= bounds[i]."""
    nb = len(bounds_ns) + 1
    idx = np.searchsorted(np.asarray(bounds_ns, dtype=np.int64), values, side="left")
    return np.bincount(group * nb + idx, minlength=ngroups * nb).reshape(ngroups, nb)

# The default level (--cardinality standard) exports coarser histograms, re-binned at render time
# from the full counts: every bound here is also a full bound, so a cumulative count at it is
# exact. Why these (docs/reliability.md, "Series and cardinality"): a detail graph with 4 streams
# costs 84 series at standard, so two fit in the 300-per-rank budget with the health families.
# Gaps: 0.13-1 us in 128-256 ns steps (the 0.19 -> 0.51 us median shift crosses three buckets),
# then the tail up to 10 us; replay span and idle: one bucket per factor 2-4 around decode steps.
GAP_BUCKETS_STANDARD_NS = (128, 256, 384, 512, 768, 1_000, 2_000, 10_000)
REPLAY_BUCKETS_STANDARD_NS = (250_000, 500_000, 1_000_000, 2_500_000, 10_000_000)
IDLE_BUCKETS_STANDARD_NS = (10_000, 50_000, 100_000, 250_000, 1_000_000)
# Untraced replay time: half-decades from 30 us to 100 ms, the fewest log-spaced bounds that
# bracket ~50 us-100 ms replays: 11 series per detail graph, 22 per rank (the budget's room).
UNTRACED_BUCKETS_STANDARD_NS = (30_000, 100_000, 300_000, 1_000_000, 3_000_000, 10_000_000, 30_000_000, 100_000_000)


def hist_add(old: Optional[Hist], counts: np.ndarray, sum_ns: int, count: int) -> Hist:
    """``old`` plus one window's per-bucket ``counts``, exact ns sum and count (None: a new one)."""
    c = counts.tolist()  # Python ints: exact, and one conversion for the row
    if old is None:
        return Hist(tuple(c), int(sum_ns), int(count))
    return Hist(tuple([a + b for a, b in zip(old.counts, c)]), old.sum_ns + int(sum_ns), old.count + int(count))
