"""One rank's cumulative series and the processes that hold the rank, as the agent keeps them.

A :class:`RankSeries` (the rank's Aggregator and its part of the shared trace store) outlives
its processes: a process that connects with the rank of one that is gone takes it over
(graphmon.export.agent). An :class:`Attached` is one process, one connection.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

from graphmon.model.window import SourceHealth, Window
from graphmon.sources.remote import DROP_REASONS, RemoteProcess

if TYPE_CHECKING:
    from graphmon.export.aggregator import Aggregator
    from graphmon.export.tracestore import TraceStoreView

LINK_COUNTERS = ("windows_dropped", "reconnects")  # of a light collector's link, exported per rank


class Carried:
    """Counters a sender reports as its own running totals (collector errors, link drops),
    summed over the senders that held a rank: each report adds what grew since the same
    sender's previous report; a new sender (another pid or host, or totals that went back: a
    new process with the same pid) starts from 0. Totals never decrease. A reconnect of the
    same process continues its totals; a new process whose first totals are already at least the
    old one's is undercounted by those (not told apart by pid and host)."""

    def __init__(self) -> None:
        self.total: dict[str, int] = {}
        self._last: dict[str, int] = {}
        self._sender: Optional[tuple] = None

    def update(self, sender: tuple, values: dict[str, int]) -> None:
        if sender != self._sender:
            self._sender, self._last = sender, {}
        for k, v in values.items():
            last = self._last.get(k, 0)
            self.total[k] = self.total.get(k, 0) + (v - last if v >= last else v)
            self._last[k] = v


@dataclass(eq=False)
class RankSeries:
    """One rank's cumulative series; outlives the processes that hold the rank."""

    rank: str
    tag: str  # "r<n>", unique for the agent's lifetime: trace ids are "<tag>-w<k>"
    aggregator: "Aggregator" = None  # type: ignore[assignment]
    store: Optional["TraceStoreView"] = None
    holder: Optional["Attached"] = None  # the live process, or the last one
    gone_s: Optional[float] = None  # when its last process left; None while one is live
    errors: Carried = field(default_factory=Carried)
    link: Carried = field(default_factory=Carried)
    dropped: dict = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))

    def health(self) -> SourceHealth:
        a = self.holder
        return a.health() if a is not None else SourceHealth(up=False, state="stopped")

    def backend_info(self) -> dict[str, str]:
        return self.holder.proc.info() if self.holder is not None else {"backend": "cupti"}

    def count_drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def on_status(self, a: "Attached") -> None:
        st = a.proc.status
        sender = (a.proc.identity.get("pid", ""), a.proc.identity.get("host", ""))
        self.errors.update(sender, st.get("errors") or {})
        link = st.get("link") or {}
        self.link.update(sender, {k: link[k] for k in LINK_COUNTERS if k in link})


@dataclass(eq=False)
class Attached:
    """One process (one connection) as the agent sees it. The interface ``window_hooks`` get:
    ``.rank`` (stable across restarts), ``.incarnation`` (unique per connection for the agent's
    lifetime) and ``.proc.identity`` (the validated hello)."""

    key: str  # "i<n>": the connection
    proc: RemoteProcess
    series: RankSeries
    degraded: str = ""  # reason when the process is up but data does not flow
    no_windows_counted: bool = False
    gone_s: Optional[float] = None  # when it disconnected (lost or stopped)
    recorder: Optional[Callable[[Window], None]] = None
    windows_seen: int = 0
    scheduled: bool = False  # in the ingest thread's round robin
    extra: dict = field(default_factory=dict)

    @property
    def rank(self) -> str:
        return self.series.rank

    @property
    def incarnation(self) -> str:
        return self.key

    @property
    def aggregator(self) -> "Aggregator":
        return self.series.aggregator

    @property
    def store(self) -> "TraceStoreView":
        return self.series.store  # type: ignore[return-value]

    def identity(self) -> dict[str, str]:
        i = self.proc.identity
        h = self.health()
        return {"rank": self.rank, "pid": i.get("pid", str(self.proc.peer_pid)), "host": i.get("host", ""),
                "device": i.get("device", ""), "uuid": i.get("uuid", ""), "pci_bus_id": i.get("pci_bus_id", ""),
                "gpu_name": i.get("gpu_name", ""), "state": h.state, "reason": h.reason}

    def health(self) -> SourceHealth:
        h = self.proc.health()
        errors = dict(self.series.errors.total)  # carried over the rank's processes: never decreases
        if h.state == "running" and self.degraded:
            return SourceHealth(up=False, state="degraded", reason=self.degraded, errors=errors,
                                last_errors=h.last_errors)
        return SourceHealth(up=h.up, state=h.state, reason=h.reason, errors=errors, last_errors=h.last_errors)
