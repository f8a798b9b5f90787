"""Synthetic graph timelines for the observer-effect bench tests (known gaps, event nodes)."""

import numpy as np


def chain_replay(layout, d_ns, gap_ns, ev_ns, t0=0, corr=1, stream=7):
    """One replay of a one-stream chain with an event node (ev_ns long) before each group and after
    the last, then a marker kernel: kernel rows and the events' times from the first (ms)."""
    rows, events, t = [], [], t0
    for _kind, n in layout:
        events.append(t)
        t += ev_ns
        for _ in range(n):
            rows.append((t, t + d_ns, stream, 1, len(rows), corr, 0, 0))  # node ids in capture order
            t += d_ns + gap_ns
    events.append(t)
    t += ev_ns
    rows.append((t, t + d_ns, stream, 1, len(rows), corr, 0, 0))  # the marker
    return np.array(rows, np.int64), (np.array(events) - events[0]) / 1e6
