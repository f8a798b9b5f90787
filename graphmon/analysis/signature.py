"""A graph's structural signature: what ``graphmon_graph_info{signature}`` shows so that a changed
graph is visible under a name that stayed the same (docs/analysis.md, "Graph identity").

``k<kernels>-s<streams>[-o<other nodes>]-<hash>`` of the graph's usual replay (the most common
signature among its replays in the trace):
- kernels per replay and streams per replay;
- other nodes: CUPTI numbers a graph's nodes (node id = graph id << 32 | index), so the indices
  that no kernel carries inside the replay's index range are nodes that are no kernels (memcpy,
  memset, event, empty nodes). Left out when a kernel has no node id (Kineto, older exports);
- hash: 8 hex digits of the multiset of kernel names (order-free).

The signature is a label, never part of the graph's name: a changed graph must stay comparable
with its previous version under the same name. Vectorised over replays; one small Python step
per distinct signature.
"""

from __future__ import annotations

import hashlib

import numpy as np

from graphmon.model.trace import Trace, _name_hashes, replay_key

NODE_INDEX_MASK = 0xFFFFFFFF


def graph_signatures(trace: Trace) -> dict[int, str]:
    """graph index -> signature, for every graph with kernels in ``trace``."""
    sel = np.flatnonzero(trace.graph >= 0)
    if len(sel) == 0:
        return {}
    key = replay_key(trace.device[sel], trace.correlation_id[sel])
    o = np.lexsort((trace.stream[sel], key))
    sel, key = sel[o], key[o]
    head = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    cnt = np.diff(np.r_[head, len(sel)])
    h = _name_hashes(trace.names)[trace.name_id[sel]]
    with np.errstate(over="ignore"):
        hsum = np.add.reduceat(h, head)  # multiset hash: order-free, wraps mod 2^64
        hsq = np.add.reduceat(h * (h | np.uint64(1)), head)
    st = trace.stream[sel]  # sorted by stream within each replay
    rid = np.repeat(np.arange(len(head)), cnt)
    new_stream = np.r_[True, (rid[1:] != rid[:-1]) | (st[1:] != st[:-1])]
    streams = np.bincount(rid, weights=new_stream, minlength=len(head)).astype(np.int64)
    node = trace.graph_node_id[sel]
    idx = node & NODE_INDEX_MASK
    known = np.minimum.reduceat((node > 0).astype(np.int64), head).astype(bool)
    span = np.maximum.reduceat(idx, head) - np.minimum.reduceat(idx, head) + 1
    other = np.where(known, span - cnt, -1)  # a replay runs each node once: cnt distinct indices
    rows = np.stack([trace.graph[sel[head]].astype(np.int64), cnt, streams, other,
                     hsum.view(np.int64), hsq.view(np.int64)], axis=1)
    uniq, counts = np.unique(rows, axis=0, return_counts=True)
    out: dict[int, str] = {}
    best: dict[int, int] = {}
    for row, c in zip(uniq.tolist(), counts.tolist()):
        g = row[0]
        if c > best.get(g, 0):  # the most common replay shape (the first, in sort order, on a tie)
            best[g] = c
            digest = hashlib.blake2b(f"{row[4]}:{row[5]}".encode(), digest_size=4).hexdigest()
            out[g] = f"k{row[1]}-s{row[2]}" + (f"-o{row[3]}" if row[3] >= 0 else "") + f"-{digest}"
    return out
