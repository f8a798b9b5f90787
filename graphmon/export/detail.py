"""Per-graph state an aggregator keeps beside its series: which graphs are its detail graphs,
each graph's structural signature (computed once per graph, not per window), capped labels."""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

from graphmon.analysis.signature import graph_signatures
from graphmon.model.trace import Trace

# Detail graphs (the ones with series of their own at the default level): ranked by the GPU time
# of their sampled replays (replays x span: where the GPU spends a decode step), decayed with
# this half-life so a graph that stopped replaying gives way; a graph takes a detail slot from
# another only when its GPU time is DETAIL_HYSTERESIS times as large, so two graphs of similar
# weight do not swap their series back and forth.
DETAIL_HALF_LIFE_S = 600.0
DETAIL_HYSTERESIS = 2.0
SIGNATURE_MEMORY = 1024  # graph execs whose signature is kept


def cap_label(value: str, max_len: int) -> str:
    """``value`` cut to ``max_len`` characters; a cut value ends in ``~`` + 8 hex digits of its
    hash so two long values that share a prefix stay two series."""
    if len(value) <= max_len:
        return value
    h = hashlib.sha1(value.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return value[: max(0, max_len - 9)] + "~" + h


def _decayed(score: float, at_s: float, now_s: float) -> float:
    return score * 0.5 ** (max(0.0, now_s - at_s) / DETAIL_HALF_LIFE_S)


class DetailGraphs:
    """The ``n`` graphs of a rank with the most GPU time sampled, chosen stably (DETAIL_HYSTERESIS)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._score: dict[tuple, tuple[float, float]] = {}  # (device, graph) -> (decayed replays, at wall s)
        self._detail: list[tuple] = []

    def replayed(self, graph: tuple, gpu_ns: float, now_s: float) -> None:
        """``graph`` (device, name) replayed for ``gpu_ns`` in the window that ended at ``now_s``."""
        score, at = self._score.get(graph, (0.0, now_s))
        self._score[graph] = (_decayed(score, at, now_s) + gpu_ns, now_s)

    def pick(self, graphs: Mapping[tuple, Any], now_s: float) -> frozenset:
        """The detail graphs among ``graphs`` ((device, graph) -> GraphSeries, not expired): by GPU
        time, the detail graphs' own counted DETAIL_HYSTERESIS times (a graph takes a slot only
        from one with less than 1/DETAIL_HYSTERESIS of its GPU time); the best graph of each upload
        mode first, so a rank that runs uploaded and lazy graphs keeps both compared (the
        dashboards' and alerts' uploaded/lazy comparisons). Ties: by name."""
        for g in [g for g in self._score if g not in graphs]:
            del self._score[g]  # expired
        held = set(self._detail)

        def weight(g):
            return -_decayed(*self._score[g], now_s) * (DETAIL_HYSTERESIS if g in held else 1.0), g

        order = sorted(self._score, key=weight)
        chosen, modes = [], set()
        for g in order:
            mode = getattr(graphs[g], "upload_mode", "")
            if len(chosen) < self.n and mode not in modes:
                chosen.append(g)
                modes.add(mode)
        chosen += [g for g in order if g not in chosen][: max(0, self.n - len(chosen))]
        self._detail = chosen
        return frozenset(chosen)


class Signatures:
    """graph_signatures once per graph exec: a window of a graph seen before costs a lookup (the
    per-window computation was a fifth of the agent's ingest thread at 64 ranks). A new process
    on the rank starts a new instance: its graphs may have changed under the same keys."""

    def __init__(self) -> None:
        self._known: dict[tuple, str] = {}

    def of(self, t: Trace, wanted: set) -> dict[int, str]:
        """graph index -> signature, for the graph indices ``wanted`` of ``t``."""
        ids = {gi: (g.key, g.graph_id, g.exec_handle, g.label, g.upload_mode)
               for gi, g in enumerate(t.graphs) if gi in wanted}
        if any(i not in self._known for i in ids.values()):
            if len(self._known) > SIGNATURE_MEMORY:
                self._known = {}
            for gi, sig in graph_signatures(t).items():
                if gi in ids:
                    self._known[ids[gi]] = sig
        return {gi: self._known[i] for gi, i in ids.items() if i in self._known}
