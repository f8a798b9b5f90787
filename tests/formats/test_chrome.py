"""Chrome / Perfetto trace output: tracks per stream, gaps in args, demangled kernel names."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import cxxfilt
from graphmon.formats import demangle as dm
from graphmon.formats.chrome import to_chrome_trace
from graphmon.formats.read import read_trace

from tracefiles import RAW

REDUCE = "_ZN2at6native13reduce_kernelILi512ELi1ENS0_8ReduceOpIN3c108BFloat16ENS0_7MeanOpsIS4_ffS4_EEjS4_Li4ELi8EEEEEvT1_"


@pytest.fixture(scope="module")
def raw_trace():
    t = read_trace(RAW, progress=False)
    return t.select(np.isin(t.correlation_id, np.unique(t.correlation_id)[:3]))


def test_kernel_names_are_demangled(raw_trace):
    doc = to_chrome_trace(raw_trace)
    names = {e["name"] for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "kernel"}
    assert names and not any(n.startswith("_Z") for n in names)
    used = sorted({raw_trace.names[i] for i in raw_trace.name_id.tolist()})
    if shutil.which("c++filt"):  # binutils: the reference demangler
        want = subprocess.run(["c++filt"], input="\n".join(used) + "\n", capture_output=True, text=True, check=True).stdout.split("\n")[:-1]
        assert names == set(want)


def test_demangle_known_name_and_fallbacks(monkeypatch):
    dm.demangle.cache_clear()
    assert dm.demangle(REDUCE).startswith("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, ")
    assert dm.demangle("add_kernel") == "add_kernel"  # a C name: unchanged
    assert dm.demangle("_Z!!not-a-name") == "_Z!!not-a-name"  # invalid: shown mangled
    assert dm.demangle("_Z" + "N" * 20_000) == "_Z" + "N" * 20_000  # overlong: not demangled
    # no libstdc++ on the host: cxxfilt raises on use; the mangled name is shown
    monkeypatch.setattr(cxxfilt, "default_demangler", cxxfilt.DeferedErrorDemangler(cxxfilt.LibraryNotFound("x")))
    dm.demangle.cache_clear()
    assert dm.demangle(REDUCE) == REDUCE
    dm.demangle.cache_clear()


def test_kernels_without_a_name(raw_trace):
    from dataclasses import replace

    t = replace(raw_trace, name_id=np.full(len(raw_trace), -1, np.int32))
    assert {e["name"] for e in to_chrome_trace(t)["traceEvents"] if e["ph"] == "X" and e["cat"] == "kernel"} == {"kernel"}


def _medians(trace):
    from graphmon.analysis.replays import analyze
    from graphmon.report.summary import analysis_json

    doc = analysis_json(analyze(trace))
    return ({(g["graph"], s["stream"]): (s["gaps"], s["gap_ns"]["p50"], s["gap_ns"]["p99"]) for g in doc["graphs"]
             for s in g["streams"]}, {g["graph"]: g["replays"] for g in doc["graphs"]})


def test_chrome_json_reads_back_as_the_same_graphs_replays_and_gaps(tmp_path):
    """Every graph of the real capture, including pairs with identical kernels (upload vs not):
    the launch ranges keep them apart, and every per-stream gap statistic survives."""
    import json

    from tracefiles import NATIVE

    t = read_trace(NATIVE, progress=False)
    keep = np.concatenate([np.unique(t.correlation_id[t.graph == g])[:4] for g in range(len(t.graphs))])
    w = t.select(np.isin(t.correlation_id, keep))
    path = tmp_path / "w.json"
    path.write_text(json.dumps(to_chrome_trace(w)))
    back = read_trace(path, progress=False)
    assert len(back) == len(w) and dict(back.invalid) == {} and back.meta.get("truncated") is None
    assert sorted(back.graph_names()) == sorted(w.graph_names())
    assert _medians(back) == _medians(w)


def test_a_cut_keeps_whole_replays_the_earliest_first_and_says_so(tmp_path):
    import json

    from graphmon.formats.chrome import TRUNCATED_KEY, kept_rows

    from tracefiles import NATIVE

    t = read_trace(NATIVE, progress=False)
    t = t.select(np.isin(t.correlation_id, np.unique(t.correlation_id)[:30]))
    per_replay = np.unique(t.correlation_id, return_counts=True)[1]
    cap = int(per_replay[:7].sum()) + int(per_replay[7]) // 2  # in the middle of the 8th replay
    rows = kept_rows(t, cap)
    assert len(rows) == per_replay[:7].sum()  # 7 whole replays, not 7.5
    first = {int(c): int(t.start_ns[t.correlation_id == c].min()) for c in np.unique(t.correlation_id)}
    kept = set(np.unique(t.correlation_id[rows]).tolist())
    assert max(first[c] for c in kept) < min(first[c] for c in first if c not in kept)  # the earliest
    doc = to_chrome_trace(t, max_events=cap)
    assert doc[TRUNCATED_KEY]["kernels"] == len(t) and doc[TRUNCATED_KEY]["kernels_kept"] == len(rows)
    assert doc["otherData"]["truncated"] is True
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(doc))
    back = read_trace(path, progress=False)
    assert back.meta["truncated"] == {"kernels": len(t), "kernels_kept": len(rows)} and len(back) == len(rows)


def _analyses(trace) -> dict:
    from graphmon.analysis.replays import analyze
    from graphmon.report.summary import analysis_json

    a = analyze(trace)
    return {by: analysis_json(a, by=by) for by in ("graph", "stream", "boundary")}


@pytest.mark.parametrize("name", ["h200-graphmon-decode.graphmon.npz", "h200-graphmon-chain.graphmon.npz"])
def test_chrome_export_analyzes_as_the_native_form(name, tmp_path):
    """Everything `graphmon analyze` reports, by graph, stream and boundary, is the same for the
    Chrome export as for the trace itself: graph keys, upload modes, launch latency from the
    recorded launch times, launch streams, the excluded records (the boundaries' kernel names are
    the export's demangled ones)."""
    import json

    from helpers import DATA

    t = read_trace(DATA / name, progress=False)
    assert (t.launches["launch_ns"] > 0).any() and t.invalid  # what the export must carry over
    path = tmp_path / "w.json"
    path.write_text(json.dumps(to_chrome_trace(t)))
    back = read_trace(path, progress=False)
    want, got = _analyses(t), _analyses(back)
    assert got["graph"] == want["graph"] and got["stream"] == want["stream"]
    for doc in (want["boundary"], got["boundary"]):
        for g in doc["boundaries"]:
            for b in g["widest"]:
                b["kernel_before"], b["kernel_after"] = dm.demangle(b["kernel_before"]), dm.demangle(b["kernel_after"])
    assert got["boundary"] == want["boundary"]
    assert {g.key: g.upload_mode for g in back.graphs} == {g.key: g.upload_mode for g in t.graphs}


def test_unknown_launch_times_stay_unknown_and_skewed_ones_stay_as_recorded(tmp_path):
    """A launch without a recorded time is drawn at its first kernel for display but marked, so
    that analyze reports no latency (it used to read 0 ns); a launch recorded after its first
    kernel (a skewed clock) keeps its time and its negative latency."""
    import json
    from dataclasses import replace

    from helpers import DATA

    t = read_trace(DATA / "h200-graphmon-decode.graphmon.npz", progress=False)
    lns = t.launches["launch_ns"].copy()
    lns[::2] = -1  # every other launch unknown
    first = {int(c): int(t.start_ns[t.correlation_id == c].min()) for c in np.unique(t.correlation_id)}
    skew = int(np.flatnonzero(lns > 0)[0])
    lns[skew] = first[int(t.launches["correlation_id"][skew])] + 500  # 500 ns after its first kernel
    t = replace(t, launches={**t.launches, "launch_ns": lns})
    doc = to_chrome_trace(t)
    launches = [e for e in doc["traceEvents"] if e.get("name") == "cudaGraphLaunch"]
    known = dict(zip(t.launches["correlation_id"].tolist(), (lns > 0).tolist()))
    assert [e["args"].get("launch_time") != "unknown" for e in launches] == [known[e["args"]["correlation"]] for e in launches]
    assert not all(known[e["args"]["correlation"]] for e in launches)
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    back = read_trace(path, progress=False)
    assert _analyses(back)["graph"] == _analyses(t)["graph"]
    back_first = {int(c): int(back.start_ns[back.correlation_id == c].min()) for c in np.unique(back.correlation_id)}
    latency = {int(c): back_first[int(c)] - int(v) for c, v in zip(back.launches["correlation_id"], back.launches["launch_ns"])}
    assert all((latency[c] != back_first[c] + 1) == known[c] for c in latency)  # unknown: launch_ns -1
    assert latency[int(t.launches["correlation_id"][skew])] == -500


def test_malformed_graphmon_metadata_is_one_error(tmp_path):
    import json

    from graphmon.model.trace import TraceError
    from tracefiles import NATIVE

    t = read_trace(NATIVE, progress=False)
    t = t.select(np.isin(t.correlation_id, np.unique(t.correlation_id)[:3]))
    doc = to_chrome_trace(t)
    doc["graphmonTrace"]["graphs"][0]["upload_mode"] = "sideways"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match="graphmonTrace metadata at graphs.0.upload_mode"):
        read_trace(path, progress=False)


def test_untraced_rows_ride_in_graphmon_trace_and_read_back(tmp_path):
    """The window's untraced replay durations (issue 36) in graphmonTrace.untraced: read back by
    read_trace_untraced, indexing the same graphs; whole even where the kernels are cut; a file
    without them has none; malformed rows are one TraceError."""
    import json

    from graphmon.formats.read import read_trace_untraced
    from graphmon.model.trace import TraceError
    from helpers import NATIVE, untraced_rows

    t = read_trace(NATIVE, progress=False)
    t = t.select(np.isin(t.correlation_id, np.unique(t.correlation_id[t.graph >= 0])[:24]))
    rows = untraced_rows(t, 1.0)
    rows = {k: np.r_[v, -1 if k == "graph" else 7] for k, v in rows.items()}  # and one of an unknown graph
    doc = to_chrome_trace(t, max_events=len(t) // 2, untraced=rows)
    assert doc["graphmonTruncated"] and len(doc["graphmonTrace"]["untraced"]["graph"]) == len(rows["graph"])
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    back, u = read_trace_untraced(path, progress=False)
    assert all(np.array_equal(u[k], rows[k]) for k in rows) and u["graph"].dtype == np.int32
    assert [g.key for g in back.graphs[: len(t.graphs)]] == [g.key for g in t.graphs]  # the graphs it indexes
    path.write_text(json.dumps(to_chrome_trace(t)))
    assert len(read_trace_untraced(path, progress=False)[1]["graph"]) == 0
    for bad, msg in (({"graph": [0], "duration_ns": [0]}, "u_duration_ns must be > 0"),
                     ({"graph": [99], "duration_ns": [5]}, "u_graph must index"),
                     ({"graph": [0, 0], "duration_ns": [5]}, "differ in length"),
                     ({"graph": [0], "duration_ns": [2**70]}, "beyond 64 bits"),
                     ({"graph": [0.5], "duration_ns": [5]}, "bad graphmonTrace metadata at untraced.graph")):
        d = to_chrome_trace(t)
        d["graphmonTrace"]["untraced"] = bad
        path.write_text(json.dumps(d))
        with pytest.raises(TraceError, match=msg):
            read_trace_untraced(path, progress=False)
