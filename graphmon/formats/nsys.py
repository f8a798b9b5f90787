"""Nsight Systems SQLite exports (``nsys export --type sqlite``) -> Trace.

Tables read (created lazily by nsys, so any may be absent):

- ``CUPTI_ACTIVITY_KIND_KERNEL``: ``start``, ``end`` (ns, one timeline for CPU and GPU),
  ``deviceId``, ``streamId``, ``correlationId``; ``graphId`` and ``graphNodeId`` where the
  export's schema has them; the name as a ``StringIds`` id in ``mangledName``,
  ``demangledName`` or ``shortName`` (the first present and non-null, in that order: graphmon
  keeps mangled names like CUPTI gives them and demangles for display).
- ``CUPTI_ACTIVITY_KIND_RUNTIME``: graph launches (``nameId`` -> ``cudaGraphLaunch*`` /
  ``cuGraphLaunch*``), giving the launch's correlation id and CPU timestamp.
- ``CUPTI_ACTIVITY_KIND_MEMCPY`` / ``_MEMSET``: copies and sets launched by a graph launch are
  not kernels; they are counted apart in ``meta["graph_memops"]`` (docs/analysis.md).
- ``EXPORT_META_DATA``: the schema and product version, reported in ``meta``.

Without ``graphId`` (exports before it was added) graph identity falls back to the launch
correlation (rule 4 of model.trace: a signature per replay) and ``meta["missing_columns"]`` says
so. Rows are streamed with ``fetchmany`` into numpy chunks; nothing holds a Python object per row.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import numpy as np

from graphmon.formats.common import MAX_CORRELATION, MAX_DEVICE, ReadLimits, check_counts, clean_text, fill_launch_graphs
from graphmon.model.invalid import InvalidReason
from graphmon.model.trace import Trace, TraceError

SQLITE_MAGIC = b"SQLite format 3\x00"
KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
_REQUIRED = ("start", "end", "deviceId", "streamId", "correlationId")
_NAME_COLUMNS = ("mangledName", "demangledName", "shortName")
_FETCH_ROWS = 65_536
_IN_BATCH = 500  # ids per "IN (...)" query: under every SQLite version's host-parameter limit
_LAUNCH_PATTERNS = ("cudaGraphLaunch%", "cuGraphLaunch%")


def read_nsys(path: str, limits: ReadLimits) -> Trace:
    try:
        # immutable: no locks, no journal, never a write (the file may be on a read-only mount)
        # as_uri percent-encodes the path: a '?' or '#' in a file name would end it otherwise
        con = sqlite3.connect(Path(path).absolute().as_uri() + "?mode=ro&immutable=1", uri=True)
    except sqlite3.Error as e:
        raise TraceError(f"cannot open SQLite file: {e}") from None
    # a damaged file can hold TEXT that is not UTF-8 (hypothesis found one in EXPORT_META_DATA):
    # decode it with replacement characters instead of raising UnicodeDecodeError mid-read
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    try:
        return _read(con, path, limits)
    except sqlite3.Error as e:  # "file is not a database", "database disk image is malformed", ...
        raise TraceError(f"bad SQLite file: {e}") from None
    except UnicodeDecodeError:  # SQLite's own message about a damaged schema, in bytes that are not UTF-8
        raise TraceError("bad SQLite file: damaged schema (its text is not UTF-8)") from None
    finally:
        con.close()


def _columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]


def _export_meta(con: sqlite3.Connection, tables: set[str]) -> dict[str, str]:
    if "EXPORT_META_DATA" not in tables:
        return {}
    out = {}
    for name, value in con.execute("SELECT name, value FROM EXPORT_META_DATA LIMIT 1000"):
        if name in ("EXPORT_SCHEMA_VERSION", "EXPORT_PRODUCT_VERSION", "EXPORT_PRODUCT_NAME") and isinstance(value, str):
            out[name] = clean_text(value[:200])
    return out


def _read(con: sqlite3.Connection, path: str, limits: ReadLimits) -> Trace:
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    ex = _export_meta(con, tables)
    schema = ex.get("EXPORT_SCHEMA_VERSION", "unknown")
    if KERNEL_TABLE not in tables:
        raise TraceError(f"no {KERNEL_TABLE} table (nsys schema {schema}): the report has no CUDA kernels; was nsys run with --trace=cuda?")
    cols = set(_columns(con, KERNEL_TABLE))
    missing = [c for c in _REQUIRED if c not in cols]
    if missing:
        raise TraceError(f"{KERNEL_TABLE} (nsys schema {schema}) lacks column(s) {', '.join(missing)}")
    name_cols = [c for c in _NAME_COLUMNS if c in cols]
    absent = [c for c in ("graphId", "graphNodeId") if c not in cols]
    meta: dict[str, Any] = {"format": "nsys-sqlite", "source": path, "nsys_schema_version": schema}
    if "EXPORT_PRODUCT_VERSION" in ex:
        meta["nsys_version"] = ex["EXPORT_PRODUCT_VERSION"]
    if absent:
        meta["missing_columns"] = absent
    meta["graph_identity"] = "graphId" if "graphId" in cols else "launch correlation (no graphId column in this nsys schema)"

    (n_rows,) = con.execute(f"SELECT COUNT(*) FROM {KERNEL_TABLE}").fetchone()
    check_counts(limits, kernels=int(n_rows))
    k = _read_kernels(con, name_cols, "graphId" in cols, "graphNodeId" in cols)
    invalid = k.pop("invalid")
    check_counts(limits, streams=len(np.unique(k["stream"])))

    # Names: only the StringIds the kernels use (the table holds every string of the report).
    sid = k.pop("string_id")
    used, name_id = np.unique(sid, return_inverse=True)
    has_name = used >= 0
    check_counts(limits, names=int(has_name.sum()))
    text = _strings(con, used[has_name].tolist(), tables)
    names = [clean_text(text.get(int(i), f"<StringId {int(i)}>")) for i in used[has_name].tolist()]
    name_id = name_id.reshape(-1).astype(np.int32) - int((~has_name).sum())  # -1 for "no name"

    launches, launch_ids = _read_launches(con, tables, limits, meta)
    if launch_ids is not None:
        meta["graph_memops"] = _memops(con, tables, launch_ids)
    # A launch's device: that of its kernels (the runtime table has none).
    corr, dev = k["correlation_id"], k["device"]
    l_corr = launches["correlation_id"]
    l_dev = np.full(len(l_corr), -1, np.int32)
    if len(l_corr) and len(corr):
        o = np.argsort(corr, kind="stable")
        pos = np.clip(np.searchsorted(corr[o], l_corr), 0, len(corr) - 1)
        hit = corr[o][pos] == l_corr
        l_dev[hit] = dev[o][pos][hit]
    launches["device"] = l_dev
    meta["kernel_rows"] = int(n_rows)
    trace = Trace.build(
        start_ns=k["start_ns"],
        end_ns=k["end_ns"],
        stream=k["stream"],
        correlation_id=corr,
        device=dev,
        graph_id=k["graph_id"],
        graph_node_id=k["graph_node_id"],
        name_id=name_id,
        names=names,
        launches=launches,
        invalid=invalid,
        meta=meta,
    )
    return fill_launch_graphs(trace)


def _read_kernels(con: sqlite3.Connection, name_cols: list[str], has_gid: bool, has_node: bool) -> dict[str, Any]:
    """Kernel columns, fetched in chunks. Rows whose required fields are not SQLite integers
    (NULL, text, real: possible in a hand-made or damaged file) are counted, not read."""
    ints = " AND ".join(f"typeof({c}) = 'integer'" for c in _REQUIRED)
    name = f"COALESCE({', '.join(name_cols)}, -1)" if name_cols else "-1"
    sql = (
        f"SELECT start, end, deviceId, streamId, correlationId, "
        f"{'COALESCE(graphId, 0)' if has_gid else '0'}, {'COALESCE(graphNodeId, 0)' if has_node else '0'}, "
        f"CASE WHEN typeof({name}) = 'integer' THEN {name} ELSE -1 END "
        f"FROM {KERNEL_TABLE} WHERE {ints}"
    )
    parts = []
    cur = con.execute(sql)
    while True:
        rows = cur.fetchmany(_FETCH_ROWS)
        if not rows:
            break
        try:
            parts.append(np.array(rows, dtype=np.int64))
        except (TypeError, ValueError, OverflowError):  # graph columns of another type
            raise TraceError(f"{KERNEL_TABLE} holds non-integer graph ids or names") from None
    a = np.concatenate(parts) if parts else np.zeros((0, 8), np.int64)
    invalid: dict[str, int] = {}
    (bad,) = con.execute(f"SELECT COUNT(*) FROM {KERNEL_TABLE} WHERE NOT ({ints})").fetchone()
    if bad:
        invalid[InvalidReason.NON_NUMERIC.value] = int(bad)
    # Trace keys replays by device << 48 ^ correlation (see model.trace.replay_key).
    out_of_range = (a[:, 2] < 0) | (a[:, 2] >= MAX_DEVICE) | (a[:, 4] < 0) | (a[:, 4] >= MAX_CORRELATION)
    if out_of_range.any():
        invalid[InvalidReason.OUT_OF_RANGE.value] = int(out_of_range.sum())
        a = a[~out_of_range]
    return {
        "start_ns": a[:, 0].copy(),
        "end_ns": a[:, 1].copy(),
        "device": a[:, 2].astype(np.int32),
        "stream": a[:, 3].copy(),
        "correlation_id": a[:, 4].copy(),
        "graph_id": a[:, 5].copy(),
        "graph_node_id": a[:, 6].copy(),
        "string_id": a[:, 7].copy(),
        "invalid": invalid,
    }


def _strings(con: sqlite3.Connection, ids: list[int], tables: set[str]) -> dict[int, str]:
    if "StringIds" not in tables or not ids:
        return {}
    out: dict[int, str] = {}
    for i in range(0, len(ids), _IN_BATCH):
        batch = ids[i : i + _IN_BATCH]
        q = f"SELECT id, value FROM StringIds WHERE id IN ({','.join('?' * len(batch))})"
        for sid, value in con.execute(q, batch):
            if isinstance(value, str):
                out[int(sid)] = value
    return out


def _launch_name_ids(con: sqlite3.Connection, tables: set[str]) -> list[int]:
    if "StringIds" not in tables:
        return []
    where = " OR ".join("value LIKE ?" for _ in _LAUNCH_PATTERNS)
    return [int(r[0]) for r in con.execute(f"SELECT id FROM StringIds WHERE {where}", _LAUNCH_PATTERNS)]


def _read_launches(con, tables: set[str], limits: ReadLimits, meta: dict) -> tuple[dict[str, np.ndarray], list[int] | None]:
    """Graph launch rows from the runtime table, and the StringIds naming a graph launch
    (None when the table cannot tell graph launches: then there are no launch rows)."""
    empty = {"correlation_id": np.zeros(0, np.int64), "launch_ns": np.zeros(0, np.int64)}
    if RUNTIME_TABLE not in tables:
        meta["missing_tables"] = [RUNTIME_TABLE]
        return empty, None
    if "nameId" not in _columns(con, RUNTIME_TABLE):
        meta.setdefault("missing_columns", []).append(f"{RUNTIME_TABLE}.nameId")
        return empty, None
    ids = _launch_name_ids(con, tables)
    if not ids:
        return empty, []
    ph = ",".join("?" * len(ids))
    (n,) = con.execute(f"SELECT COUNT(*) FROM {RUNTIME_TABLE} WHERE nameId IN ({ph})", ids).fetchone()
    if n > limits.max_kernels:
        raise TraceError(f"more than {limits.max_kernels} graph launches (limit)")
    cur = con.execute(
        f"SELECT correlationId, start FROM {RUNTIME_TABLE} WHERE nameId IN ({ph}) "
        f"AND typeof(correlationId) = 'integer' AND typeof(start) = 'integer'", ids)
    parts = []
    while rows := cur.fetchmany(_FETCH_ROWS):
        parts.append(np.array(rows, dtype=np.int64))
    a = np.concatenate(parts) if parts else np.zeros((0, 2), np.int64)
    a = a[(a[:, 0] > 0) & (a[:, 0] < MAX_CORRELATION)]
    corr, first = np.unique(a[:, 0], return_index=True)  # one row per launch (retries share none)
    start = a[first, 1]
    return {"correlation_id": corr, "launch_ns": np.where(start > 0, start, -1)}, ids


def _memops(con, tables: set[str], launch_ids: list[int]) -> dict[str, int]:
    """Copies and sets that belong to a graph launch: count and total time, per kind. They are
    graph nodes but not kernels, so the kernel columns do not hold them (docs/analysis.md)."""
    out = {}
    ph = ",".join("?" * len(launch_ids)) or "NULL"
    for kind in ("MEMCPY", "MEMSET"):
        table = f"CUPTI_ACTIVITY_KIND_{kind}"
        if table not in tables:
            continue
        n, busy = con.execute(
            f"SELECT COUNT(*), COALESCE(SUM(end - start), 0) FROM {table} WHERE correlationId IN "
            f"(SELECT correlationId FROM {RUNTIME_TABLE} WHERE nameId IN ({ph}))", launch_ids).fetchone()
        out[kind.lower()] = int(n)
        out[f"{kind.lower()}_ns"] = int(busy or 0)
    return out
