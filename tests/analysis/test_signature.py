"""graphmon.analysis.signature on the real H200 traces: equal for two captures of one graph, changed
by a node that is no kernel (a memcpy node) or another kernel, absent node ids leave the count out."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from graphmon.analysis.signature import graph_signatures
from helpers import only


def _by_name(t):
    return {t.graph_names()[g]: s for g, s in graph_signatures(t).items()}


def test_real_trace_signatures(native, kineto):
    s = _by_name(native)
    assert s["decode_bs1/upload"].startswith("k960-s4-o0-") and s["chain/upload"].startswith("k1000-s1-o0-")
    # one graph captured twice (uploaded, not): the same structure
    assert s["decode_bs1/upload"] == s["decode_bs1/no_upload"] and s["chain/upload"] == s["chain/no_upload"]
    assert s["decode_bs1/upload"] != s["decode_bs2/upload"]  # other kernels (batch 2)
    assert s["decode_bs1/upload"] != s["chain/upload"]
    k = set(graph_signatures(kineto).values())
    assert len(k) == 1 and k.pop().startswith("k960-s4-") and "-o" not in next(iter(graph_signatures(kineto).values()))


def test_a_node_without_a_kernel_changes_the_signature(native):
    """A memcpy node between consecutive kernels takes a node index: the kernels' indices get holes."""
    t = only(native, "decode_bs1/upload")
    node = t.graph_node_id
    spaced = (node >> 32 << 32) | ((node & 0xFFFFFFFF) * 2)  # a non-kernel node after every kernel
    a, b = graph_signatures(t), graph_signatures(replace(t, graph_node_id=spaced))
    (ga, sa), = a.items()
    (gb, sb), = b.items()
    assert sa.startswith("k960-s4-o0-") and sb.startswith("k960-s4-o959-")
    assert sa.rsplit("-", 1)[1] == sb.rsplit("-", 1)[1]  # same kernels


def test_another_kernel_changes_the_hash(native):
    t = only(native, "decode_bs1/upload")
    names = list(t.names)
    names[int(t.name_id[0])] += "_v2"
    assert graph_signatures(replace(t, names=tuple(names))) != graph_signatures(t)


def test_the_usual_replay_wins_and_empty_traces(native):
    t = only(native, "decode_bs1/upload")
    corr = np.unique(t.correlation_id)
    # one replay missing a kernel: the other replays' signature stays the graph's
    drop = np.flatnonzero(t.correlation_id == corr[0])[0]
    keep = np.ones(len(t), bool)
    keep[drop] = False
    assert graph_signatures(t.select(keep)) == graph_signatures(t)
    assert graph_signatures(t.select(np.zeros(len(t), bool))) == {}
