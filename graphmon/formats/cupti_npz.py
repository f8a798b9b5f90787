"""The raw CUPTI probe npz (shared/README.md, shared/traces/h200-cupti-decode-v1.npz) -> Trace.

Kernel columns as CUPTI gave them plus ``launch_correlation`` (correlation id of each graph
launch -> index into ``graph_keys``), ``exec_handles`` and per-replay CUDA-event times.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from graphmon.formats.common import I64_MAX, ReadLimits, check_counts, clean_text, require_int
from graphmon.model.trace import GraphInfo, Trace, TraceError

# The raw CUPTI npz was shifted so its earliest start is 0; Trace.build excludes start == 0 as
# "no timestamp". Adding 1 s to every kernel time keeps all records valid and all gaps unchanged.
RAW_CUPTI_OFFSET_NS = 1_000_000_000


def is_cupti_npz(arrays: dict[str, np.ndarray]) -> bool:
    return "start" in arrays and "launch_correlation" in arrays


def read_cupti_npz(path: str, arrays: dict[str, np.ndarray], limits: ReadLimits | None = None) -> Trace:
    """The CUPTI probe npz (shared/README.md): kernel columns + launch correlation -> graph key."""
    limits = limits or ReadLimits()
    cols = {k: require_int(arrays, k) for k in ("start", "end", "stream_id", "graph_id", "graph_node_id", "correlation_id", "name_id")}
    n = len(cols["start"])
    for k, v in cols.items():
        if len(v) != n:
            raise TraceError(f"array {k!r} has {len(v)} rows, expected {n}")
    if n == 0:
        raise TraceError("no kernel records")
    lc = require_int(arrays, "launch_correlation", ndim=2)
    if lc.shape[1] != 2:
        raise TraceError(f"launch_correlation must be N x 2, got {lc.shape}")
    keys_arr = arrays.get("graph_keys")
    names_arr = arrays.get("names")
    if keys_arr is None or keys_arr.dtype.kind != "U" or keys_arr.ndim != 1:
        raise TraceError("graph_keys must be a 1-D string array")
    if names_arr is None or names_arr.dtype.kind != "U" or names_arr.ndim != 1:
        raise TraceError("names must be a 1-D string array")
    check_counts(limits, kernels=n, names=len(names_arr), graphs=len(keys_arr))
    check_counts(limits, streams=len(np.unique(cols["stream_id"])))
    keys = [clean_text(str(s)) for s in keys_arr.tolist()]
    exec_handles = require_int(arrays, "exec_handles")
    if len(exec_handles) != len(keys):
        raise TraceError(f"exec_handles has {len(exec_handles)} entries for {len(keys)} graph keys")
    if len(lc) and (lc[:, 1].min() < 0 or lc[:, 1].max() >= len(keys)):
        raise TraceError("launch_correlation names a graph key out of range")

    start = cols["start"].astype(np.int64)
    end = cols["end"].astype(np.int64)
    if start.max() > I64_MAX - RAW_CUPTI_OFFSET_NS or end.max() > I64_MAX - RAW_CUPTI_OFFSET_NS:
        raise TraceError("timestamps too large to add the fixed offset")
    corr = cols["correlation_id"].astype(np.int64)
    gid = cols["graph_id"].astype(np.int64)

    # The launch callback ran through several phases; kernel tracing only during "traced".
    # Launches outside the traced correlation range have no kernels by design, so they are
    # summarized in meta rather than listed as launches whose kernels went missing.
    lo, hi = int(corr.min()), int(corr.max())
    in_window = (lc[:, 0] >= lo) & (lc[:, 0] <= hi)
    lcw = lc[in_window]
    if len(lcw) > limits.max_kernels:
        raise TraceError(f"more than {limits.max_kernels} graph launches (limit)")

    # CUPTI graph id of each key, from its launches' kernels: one sort, not a pass per key
    # (100k keys took 80 s that way).
    key_gid = np.full(len(keys), -1, np.int64)
    if len(lcw):
        o = np.argsort(lcw[:, 0], kind="stable")
        lcorr, lkey = lcw[o, 0].astype(np.int64), lcw[o, 1].astype(np.int64)
        pos = np.clip(np.searchsorted(lcorr, corr), 0, len(lcorr) - 1)
        hit = lcorr[pos] == corr
        pairs = np.unique(np.stack([lkey[pos[hit]], gid[hit]], axis=1), axis=0)
        per_key = np.bincount(pairs[:, 0], minlength=len(keys))
        if (per_key > 1).any():
            i = int(np.flatnonzero(per_key > 1)[0])
            raise TraceError(f"graph key {keys[i]!r} has kernels of several CUPTI graph ids {pairs[pairs[:, 0] == i, 1][:8].tolist()}")
        key_gid[pairs[:, 0]] = pairs[:, 1]
    graphs: list[GraphInfo] = []
    for i, key in enumerate(keys):
        g = int(key_gid[i])
        bs = re.search(r"_bs(\d+)", key)
        graphs.append(
            GraphInfo(
                key=f"g{g}" if g > 0 else key,
                graph_id=g,
                exec_handle=int(exec_handles[i]),
                # "/upload": the probe called cuGraphUpload right after instantiation. The other
                # capture was launched without an upload, so the driver uploaded it lazily on
                # its first launch.
                upload_mode="uploaded" if key.endswith("/upload") else "lazy" if key.endswith("/no_upload") else "unknown",
                label=key,
                batch_size=int(bs.group(1)) if bs else -1,
            )
        )
    if len({g.key for g in graphs}) != len(graphs):
        raise TraceError("two graph keys share one CUPTI graph id")

    meta: dict[str, Any] = {
        "format": "cupti-npz",
        "source": path,
        "time_offset_ns": RAW_CUPTI_OFFSET_NS,
        "launches_outside_kernel_trace": int((~in_window).sum()),
    }
    # CUDA-event time per replay: ground truth for observer-effect work. Summaries only.
    event_ms: dict[str, dict[str, float]] = {}
    event_n: dict[str, int] = {}
    for k, v in arrays.items():
        if k.startswith("event_ms_") and v.ndim == 2 and v.shape[0] == len(keys) and v.dtype.kind == "f":
            phase = k[len("event_ms_") :]
            if not v.shape[1]:
                continue
            event_ms[phase] = dict(zip(keys, np.median(v, axis=1).tolist()))
            event_n[phase] = int(v.shape[1])
    if event_ms:
        meta["event_ms_median"] = event_ms
        meta["event_ms_replays"] = event_n
    gt = arrays.get("graph_trace")
    if gt is not None:
        meta["graph_trace_records"] = int(len(gt))

    return Trace.build(
        start_ns=start + RAW_CUPTI_OFFSET_NS,
        end_ns=end + RAW_CUPTI_OFFSET_NS,
        stream=cols["stream_id"],
        correlation_id=corr,
        device=np.zeros(n, np.int32),  # the probe traced one GPU
        graph_id=gid,
        graph_node_id=cols["graph_node_id"],
        name_id=cols["name_id"],
        names=[clean_text(str(s)) for s in names_arr.tolist()],
        launches={
            "correlation_id": lcw[:, 0].astype(np.int64),
            "device": np.zeros(len(lcw), np.int32),
            "graph": lcw[:, 1].astype(np.int32),
        },
        graphs=graphs,
        meta=meta,
    )
