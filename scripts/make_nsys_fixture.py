"""Write an Nsight Systems-schema SQLite file from the real H200 CUPTI records.

The output has the tables and columns ``nsys export --type sqlite`` writes for CUDA traces
(``StringIds``, ``EXPORT_META_DATA``, ``CUPTI_ACTIVITY_KIND_KERNEL``, ``CUPTI_ACTIVITY_KIND_RUNTIME``),
filled from a subset of shared/traces/h200-cupti-decode-v1.npz: the first ``--replays`` traced
replays of each graph key in ``--keys`` (default: the bs1 decode graph, uploaded and lazy;
10 replays each: with fewer, ``graphmon compare``'s Mann-Whitney test cannot reach p < 0.01
after its Bonferroni correction even for a uniform +320 ns). Kernel times get the same +1 s offset as graphmon's raw CUPTI reader
(formats.cupti_npz.RAW_CUPTI_OFFSET_NS), so both readers give identical kernel columns.

What the probe did not record is written as nsys writes "unknown": the runtime rows' CPU
timestamps are 0 (the probe kept no CPU time per launch), ``globalTid``/``globalPid`` constants.
``--no-graph-columns`` writes the older schema without ``graphId`` (nsys 2022 exports, e.g.
schema 2.9.1), for the reader's fallback to the launch correlation.

    .venv/bin/python scripts/make_nsys_fixture.py [--replays 10] [--keys K1,K2] [--out tests/data/h200-cupti-decode-subset.nsys.sqlite]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RAW = ROOT / "tests" / "data" / "h200-cupti-decode-v1.npz"
OFFSET_NS = 1_000_000_000  # = graphmon.formats.cupti_npz.RAW_CUPTI_OFFSET_NS (kept literal: no graphmon import)
PID = 0x0001_0000_0000_0000 | (4242 << 24)  # nsys "serialized global id": process 4242

SCHEMA = """
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE EXPORT_META_DATA (name TEXT, value TEXT);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (
    start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, globalTid INTEGER,
    correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (
    start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL,
    streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL,
    shortName INTEGER NOT NULL, mangledName INTEGER, launchType INTEGER, cacheConfig INTEGER,
    registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL,
    blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL,
    staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL,
    localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL,
    sharedMemoryExecuted INTEGER, graphNodeId INTEGER, sharedMemoryLimitConfig INTEGER{graph_id});
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (
    start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL,
    streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL,
    copyKind INTEGER NOT NULL, graphNodeId INTEGER);
"""


DEFAULT_KEYS = ("decode_bs1/upload", "decode_bs1/no_upload")


def write_fixture(raw: Path, out: Path, replays: int = 10, graph_columns: bool = True, keys_wanted=DEFAULT_KEYS) -> int:
    z = np.load(raw, allow_pickle=False)
    corr = z["correlation_id"].astype(np.int64)
    lc = z["launch_correlation"].astype(np.int64)
    keys = z["graph_keys"].tolist()
    traced = np.unique(corr)
    chosen = []
    for i in range(len(keys)):
        if keys[i] not in keys_wanted:
            continue
        mine = lc[(lc[:, 1] == i) & np.isin(lc[:, 0], traced), 0]
        chosen.extend(np.sort(mine)[:replays].tolist())
    sel = np.flatnonzero(np.isin(corr, chosen))
    names = z["names"].tolist()

    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        tmp.unlink()
    con = sqlite3.connect(tmp)
    con.executescript(SCHEMA.format(graph_id=", graphId INTEGER" if graph_columns else ""))
    # StringIds: kernel names first (ids 1..), then the runtime API name of a graph launch.
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i + 1, s) for i, s in enumerate(names)])
    launch_sid = len(names) + 1
    con.execute("INSERT INTO StringIds VALUES (?, ?)", (launch_sid, "cudaGraphLaunch_v10000"))
    con.execute("INSERT INTO StringIds VALUES (?, ?)", (launch_sid + 1, "cudaStreamSynchronize_v3020"))
    meta = [("EXPORT_PRODUCT_NAME", "graphmon scripts/make_nsys_fixture.py (Nsight Systems export schema)"),
            ("EXPORT_SCHEMA_VERSION", "3.x-fixture" if graph_columns else "2.9.1-fixture"),
            ("EXPORT_INPUT_FILE", raw.name)]
    con.executemany("INSERT INTO EXPORT_META_DATA VALUES (?, ?)", meta)
    con.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (0, 0, 0, ?, ?, ?, 0, NULL)",
        [(PID + 1, c, launch_sid) for c in sorted(chosen)] + [(PID + 1, 1, launch_sid + 1)],  # one non-launch call
    )
    cols = [z[k][sel].astype(np.int64) for k in ("start", "end", "stream_id", "correlation_id", "name_id", "graph_node_id", "graph_id")]
    start, end, stream, c, nid, node, gid = cols
    rows = []
    for j in range(len(sel)):
        sid = int(nid[j]) + 1
        row = [int(start[j]) + OFFSET_NS, int(end[j]) + OFFSET_NS, 0, 1, int(stream[j]), int(c[j]), PID,
               sid, sid, sid, 3, 0, 32, 1, 1, 1, 128, 1, 1, 0, 0, 0, 0, j + 1, 0, int(node[j]), 0]
        if graph_columns:
            row.append(int(gid[j]))
        rows.append(row)
    ph = ",".join("?" * len(rows[0]))
    con.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES ({ph})", rows)
    con.commit()
    con.execute("VACUUM")
    con.close()
    os.replace(tmp, out)
    return len(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--raw", default=str(RAW))
    ap.add_argument("--replays", type=int, default=10, help="traced replays per graph key (default 10)")
    ap.add_argument("--keys", default=",".join(DEFAULT_KEYS), help="graph keys to include (comma-separated)")
    ap.add_argument("--no-graph-columns", action="store_true", help="older schema: no graphId column")
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "h200-cupti-decode-subset.nsys.sqlite"))
    args = ap.parse_args()
    n = write_fixture(Path(args.raw), Path(args.out), args.replays, not args.no_graph_columns, tuple(args.keys.split(",")))
    print(f"wrote {args.out}: {n} kernels ({os.path.getsize(args.out)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
