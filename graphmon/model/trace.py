"""The columnar trace model: kernel records as numpy columns, launches, graph metadata.

Every source (CUPTI, recorded-trace replay, Kineto import, the native file format) ends in a
:class:`Trace`. Construction validates the kernel records: invalid ones are excluded and counted
by reason in ``Trace.invalid`` (never silently kept, never silently dropped).

Graph identity (documented in docs/trace-format.md): each kernel gets ``graph`` = an index into
``Trace.graphs`` or -1 for kernels launched outside a graph. Resolution order:
  1. the kernel's correlation id matches a launch row that names a graph (CUPTI launch callback);
  2. the kernel's ``graph_id`` (CUPTI's graph id of the exec) matches a :class:`GraphInfo`;
  3. ``graph_id > 0`` with no metadata: a new ``GraphInfo(key="g<id>")``;
  4. the correlation id is a known graph launch with no graph identity (Kineto): a signature of
     the replay = hash of its kernel-name multiset, its stream count and the launch's label.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

import numpy as np

from graphmon.model.invalid import InvalidReason

UPLOAD_MODES = ("uploaded", "instantiate_upload", "lazy", "unknown")


KERNEL_COLUMNS = {
    "start_ns": np.int64,
    "end_ns": np.int64,
    "device": np.int32,
    "stream": np.int64,
    "graph_id": np.int64,
    "graph_node_id": np.int64,
    "correlation_id": np.int64,
    "name_id": np.int32,
}
LAUNCH_COLUMNS = {
    "correlation_id": np.int64,
    "device": np.int32,
    "graph": np.int32,  # index into Trace.graphs, -1 = unknown graph
    "launch_ns": np.int64,  # CPU timestamp of the launch call, same clock as kernels; -1 unknown
    "stream": np.int64,  # launch stream, -1 unknown
    "label": np.int32,  # index into Trace.labels, -1 none (e.g. a record_function range)
}

class TraceError(ValueError):
    """A trace could not be read or built; the message names the problem."""


@dataclass(frozen=True)
class GraphInfo:
    """Metadata of one CUDA graph exec. Small (one per graph), so plain Python."""

    key: str  # identity within the trace: "g<graph_id>", "sig:<hash>", or a source's own key
    graph_id: int = -1  # the source's graph id (CUPTI graphId of the exec); -1 unknown
    exec_handle: int = 0  # CUgraphExec handle when known (process-local)
    upload_mode: str = "unknown"
    upload_stream: int = -1
    label: str = ""  # human name from the application (label_graph) or a profiler range
    batch_size: int = -1
    upload_stream_is_launch_stream: bool | None = None

    def __post_init__(self) -> None:
        if self.upload_mode not in UPLOAD_MODES:
            raise TraceError(f"unknown upload mode {self.upload_mode!r}; expected one of {UPLOAD_MODES}")

    @property
    def name(self) -> str:
        """What users see: the label when the application gave one, else the key."""
        return self.label or self.key


def _column(values, dtype, n: int | None, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise TraceError(f"column {name!r} must be 1-D, got shape {arr.shape}")
    if n is not None and len(arr) != n:
        raise TraceError(f"column {name!r} has {len(arr)} rows, expected {n}")
    if arr.dtype.kind == "f":
        if len(arr) and not np.all(np.isfinite(arr)):
            raise TraceError(f"column {name!r} has non-finite values")
    elif arr.dtype.kind not in "iub" and len(arr):
        raise TraceError(f"column {name!r} must be integer, got {arr.dtype}")
    out = arr.astype(dtype, copy=False)
    out.setflags(write=False)
    return out


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr.setflags(write=False)
    return arr


def empty_launches() -> dict[str, np.ndarray]:
    return {k: np.zeros(0, dtype=t) for k, t in LAUNCH_COLUMNS.items()}


@dataclass(frozen=True)
class Trace:
    """Kernel records (columns, all the same length) + launches + graph metadata.

    Build with :meth:`Trace.build`, which validates and resolves graph identity; the plain
    constructor trusts its input (used by load/slice of already-valid traces).
    """

    start_ns: np.ndarray
    end_ns: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    graph_id: np.ndarray
    graph_node_id: np.ndarray
    correlation_id: np.ndarray
    name_id: np.ndarray
    graph: np.ndarray  # int32 index into graphs per kernel, -1 = not in a graph
    names: tuple[str, ...]
    launches: Mapping[str, np.ndarray]
    graphs: tuple[GraphInfo, ...]
    labels: tuple[str, ...] = ()
    invalid: Mapping[str, int] = field(default_factory=dict)
    meta: Mapping[str, object] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.start_ns)

    @property
    def n_launches(self) -> int:
        return len(self.launches["correlation_id"])

    @property
    def invalid_total(self) -> int:
        return int(sum(self.invalid.values()))

    # ------------------------------------------------------------------ building
    @classmethod
    def build(
        cls,
        *,
        start_ns,
        end_ns,
        stream,
        correlation_id,
        device=None,
        graph_id=None,
        graph_node_id=None,
        name_id=None,
        names: Sequence[str] = (),
        launches: Mapping[str, Iterable] | None = None,
        graphs: Sequence[GraphInfo] = (),
        labels: Sequence[str] = (),
        invalid: Mapping[str, int] | None = None,
        meta: Mapping[str, object] | None = None,
    ) -> "Trace":
        """Validate columns, exclude invalid records (counted), resolve graph identity."""
        n = len(np.asarray(start_ns))
        cols = {
            "start_ns": start_ns,
            "end_ns": end_ns,
            "stream": stream,
            "correlation_id": correlation_id,
            "device": np.zeros(n, np.int32) if device is None else device,
            "graph_id": np.zeros(n, np.int64) if graph_id is None else graph_id,
            "graph_node_id": np.zeros(n, np.int64) if graph_node_id is None else graph_node_id,
            "name_id": np.full(n, -1, np.int32) if name_id is None else name_id,
        }
        c = {k: _column(v, KERNEL_COLUMNS[k], n, k) for k, v in cols.items()}
        names = tuple(str(s) for s in names)
        # An empty name table allows only -1 (no name): any other id would index past it.
        if n and (c["name_id"].max() >= len(names) or c["name_id"].min() < -1):
            raise TraceError("name_id out of range of the name table")

        counts = dict(invalid or {})
        keep = np.ones(n, dtype=bool)

        def exclude(mask: np.ndarray, reason: str) -> None:
            nonlocal keep
            m = mask & keep
            k = int(m.sum())
            if k:
                counts[reason] = counts.get(reason, 0) + k
                keep = keep & ~m

        exclude((c["start_ns"] < 0) | (c["end_ns"] < 0), InvalidReason.NEGATIVE_TIMESTAMP.value)
        exclude(c["start_ns"] == 0, InvalidReason.ZERO_START.value)
        exclude(c["end_ns"] < c["start_ns"], InvalidReason.END_BEFORE_START.value)
        if n:
            exclude(_duplicates(c, keep), InvalidReason.DUPLICATE.value)
        if not keep.all():
            c = {k: _readonly(v[keep]) for k, v in c.items()}

        lcols = empty_launches() if launches is None else dict(launches)
        m = len(np.asarray(lcols.get("correlation_id", [])))
        defaults = {"device": 0, "graph": -1, "launch_ns": -1, "stream": -1, "label": -1}
        launch = {}
        for k, t in LAUNCH_COLUMNS.items():
            v = lcols.get(k)
            if v is None:
                if k == "correlation_id":
                    v = np.zeros(0, t)
                else:
                    v = np.full(m, defaults[k], t)
            launch[k] = _column(v, t, m, f"launches.{k}")
        graphs = list(graphs)
        labels = tuple(str(s) for s in labels)
        if m and (
            launch["graph"].max() >= len(graphs)
            or launch["label"].max() >= len(labels)
            or min(launch["graph"].min(), launch["label"].min()) < -1  # -1 = none; -2 would index from the end
        ):
            raise TraceError("launch graph/label index out of range")

        kernel_graph, graphs = _resolve_graphs(c, launch, graphs, names, labels)
        return cls(
            graph=_readonly(kernel_graph),
            names=names,
            launches=launch,
            graphs=tuple(graphs),
            labels=labels,
            invalid=counts,
            meta=dict(meta or {}),
            **c,
        )

    # ------------------------------------------------------------------ derived views
    def select(self, mask: np.ndarray) -> "Trace":
        """A trace holding only the kernels where ``mask`` is true (launches and graphs kept)."""
        kcols = {k: _readonly(getattr(self, k)[mask]) for k in list(KERNEL_COLUMNS) + ["graph"]}
        return replace(self, **kcols)

    def with_graphs(self, graphs: Sequence[GraphInfo]) -> "Trace":
        """Same records with updated graph metadata (e.g. labels learned later)."""
        if len(graphs) != len(self.graphs):
            raise TraceError("with_graphs must keep the number of graphs")
        return replace(self, graphs=tuple(graphs))

    def graph_names(self) -> list[str]:
        """Unique display names: the label, disambiguated by key when two graphs share it."""
        names = [g.name for g in self.graphs]
        seen: dict[str, int] = {}
        for n in names:
            seen[n] = seen.get(n, 0) + 1
        return [f"{g.name}#{g.key}" if seen[g.name] > 1 and g.label else g.name for g in self.graphs]


def concat(traces: Sequence[Trace]) -> Trace:
    """Concatenate traces of one process (graph keys merge by key; names/labels re-indexed)."""
    if not traces:
        raise TraceError("nothing to concatenate")
    names: dict[str, int] = {}
    labels: dict[str, int] = {}
    graphs: dict[str, GraphInfo] = {}
    kparts: dict[str, list] = {k: [] for k in KERNEL_COLUMNS}
    lparts: dict[str, list] = {k: [] for k in LAUNCH_COLUMNS}
    invalid: dict[str, int] = {}
    for t in traces:
        nmap = np.array([names.setdefault(s, len(names)) for s in t.names] + [-1], dtype=np.int32)
        lmap = np.array([labels.setdefault(s, len(labels)) for s in t.labels] + [-1], dtype=np.int32)
        for g in t.graphs:
            old = graphs.get(g.key)
            # Later knowledge wins over "unknown" (an upload seen in a later window).
            if old is None or (old.upload_mode == "unknown" and g.upload_mode != "unknown") or (g.label and not old.label):
                graphs[g.key] = g
        gkeys = list(graphs)
        gmap = np.array([gkeys.index(g.key) for g in t.graphs] + [-1], dtype=np.int32)
        for k in KERNEL_COLUMNS:
            v = getattr(t, k)
            kparts[k].append(nmap[v] if k == "name_id" else v)
        for k in LAUNCH_COLUMNS:
            v = t.launches[k]
            if k == "graph":
                v = gmap[v]
            elif k == "label":
                v = lmap[v]
            lparts[k].append(v)
        for r, c in t.invalid.items():
            invalid[r] = invalid.get(r, 0) + c
    return Trace.build(
        **{k: np.concatenate(v) for k, v in kparts.items()},
        names=list(names),
        launches={k: np.concatenate(v) for k, v in lparts.items()},
        graphs=list(graphs.values()),
        labels=list(labels),
        invalid=invalid,
        meta=dict(traces[0].meta),
    )


# ---------------------------------------------------------------------- graph identity
def _name_hashes(names: Sequence[str]) -> np.ndarray:
    """A stable 64-bit hash per kernel name (blake2b, not Python's salted hash)."""
    out = np.zeros(len(names) + 1, dtype=np.uint64)  # last slot: name_id -1
    for i, s in enumerate(names):
        # surrogatepass: a name decoded from a JSON "\ud800" escape is a str UTF-8 cannot encode
        out[i] = np.frombuffer(hashlib.blake2b(s.encode("utf-8", "surrogatepass"), digest_size=8).digest(), dtype=np.uint64)[0]
    out[-1] = np.uint64(0x9E3779B97F4A7C15)
    return out


def _resolve_graphs(c, launch, graphs: list[GraphInfo], names, labels):
    n = len(c["start_ns"])
    kernel_graph = np.full(n, -1, dtype=np.int32)
    if n == 0:
        return kernel_graph, graphs

    # 1. launch rows that name a graph, matched by (device, correlation id)
    lc = launch["correlation_id"]
    if len(lc):
        lkey = replay_key(launch["device"], lc)
        order = np.argsort(lkey, kind="stable")
        skey = lkey[order]
        kkey = replay_key(c["device"], c["correlation_id"])
        pos = np.clip(np.searchsorted(skey, kkey), 0, len(skey) - 1)
        hit = skey[pos] == kkey
        lrow = np.where(hit, order[pos], -1)
        lg = np.where(hit, launch["graph"][np.maximum(lrow, 0)], -1)
        kernel_graph[:] = lg
    else:
        lrow = np.full(n, -1, dtype=np.int64)

    # 2./3. graph ids
    gid = c["graph_id"]
    todo = (kernel_graph < 0) & (gid > 0)
    if todo.any():
        by_id = {g.graph_id: i for i, g in enumerate(graphs) if g.graph_id > 0}
        for u in np.unique(gid[todo]).tolist():
            if u not in by_id:
                by_id[u] = len(graphs)
                graphs.append(GraphInfo(key=f"g{u}", graph_id=int(u)))
        ids = np.array(sorted(by_id), dtype=np.int64)
        idx = np.array([by_id[i] for i in sorted(by_id)], dtype=np.int32)
        kernel_graph[todo] = idx[np.searchsorted(ids, gid[todo])]

    # 4. known graph launches without identity: signature per replay
    todo = (kernel_graph < 0) & (lrow >= 0)
    if todo.any():
        sel = np.flatnonzero(todo)
        key = replay_key(c["device"][sel], c["correlation_id"][sel])
        order = np.argsort(key, kind="stable")
        sel, key = sel[order], key[order]
        bounds = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        h = _name_hashes(names)[c["name_id"][sel]]
        with np.errstate(over="ignore"):
            hsum = np.add.reduceat(h, bounds)  # multiset hash: order-free, wraps mod 2^64
            hsq = np.add.reduceat(h * (h | np.uint64(1)), bounds)
        cnt = np.diff(np.r_[bounds, len(sel)])
        # number of distinct streams per replay
        st = c["stream"][sel]
        rid = np.repeat(np.arange(len(bounds)), cnt)
        o2 = np.lexsort((st, rid))
        new_stream = np.r_[True, (rid[o2][1:] != rid[o2][:-1]) | (st[o2][1:] != st[o2][:-1])]
        nstreams = np.bincount(rid[o2], weights=new_stream, minlength=len(bounds)).astype(np.int64)
        lab = launch["label"][lrow[sel[bounds]]]
        sig_rows = np.stack([hsum.view(np.int64), hsq.view(np.int64), cnt, nstreams, lab], axis=1)
        uniq, inv = np.unique(sig_rows, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
        by_key = {g.key: i for i, g in enumerate(graphs)}
        gidx = np.empty(len(uniq), dtype=np.int32)
        for j, row in enumerate(uniq.tolist()):
            label = labels[row[4]] if row[4] >= 0 else ""
            digest = hashlib.blake2b(json.dumps(row).encode(), digest_size=4).hexdigest()
            k = f"sig:{digest}"
            if k not in by_key:
                by_key[k] = len(graphs)
                graphs.append(GraphInfo(key=k, label=label))
            gidx[j] = by_key[k]
        kernel_graph[sel] = np.repeat(gidx[inv], cnt)
    return kernel_graph, graphs


def _duplicates(c: Mapping[str, np.ndarray], keep: np.ndarray) -> np.ndarray:
    """Extra copies of kept records with the same device, stream, correlation, start and end.

    Copies share a start time, so only records whose start equals a neighbour's in start order
    are candidates; the full comparison runs on those few. Sorting by start is near-linear on the
    nearly time-ordered input sources deliver.
    """
    n = len(keep)
    dup = np.zeros(n, dtype=bool)
    o = np.argsort(c["start_ns"], kind="stable")
    ss = c["start_ns"][o]
    eq = ss[1:] == ss[:-1]
    if not eq.any():
        return dup
    cand = np.zeros(n, dtype=bool)
    cand[o[1:][eq]] = True
    cand[o[:-1][eq]] = True
    cand &= keep  # only a copy of a record that is itself kept counts as a duplicate
    ci = np.flatnonzero(cand)
    if len(ci) < 2:
        return dup
    cols = [c[k][ci] for k in ("device", "stream", "correlation_id", "start_ns", "end_ns")]
    order = np.lexsort(cols[::-1])
    same = np.ones(len(ci) - 1, dtype=bool)
    for col in cols:
        v = col[order]
        same &= v[1:] == v[:-1]
    dup[ci[order[1:][same]]] = True
    return dup


def replay_key(device: np.ndarray, corr: np.ndarray) -> np.ndarray:
    """One int64 per (device, correlation id): the key of a graph replay (launch) everywhere.

    Readers bound device ids to 2**15 and correlation ids to 2**48, so the key is unique.
    """
    return (np.asarray(device).astype(np.int64) << 48) ^ np.asarray(corr).astype(np.int64)

