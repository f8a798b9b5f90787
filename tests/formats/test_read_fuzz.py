"""Property tests of the trace readers on hostile input: random Chrome-trace event lists and
mutated / truncated real files (Kineto JSON, gzip, native npz, raw CUPTI npz).

Each example must end in either a Trace whose counts add up (kept + invalid == kernel events
in the input) or a TraceError naming the file; never another exception, never a hang
(hypothesis deadlines). Sized for CI: the module runs in well under 30 s.

Longer run (e.g. before a release), about 100x the examples:

    GRAPHMON_FUZZ_EXAMPLES=5000 .venv/bin/python -m pytest tests/test_readers_fuzz.py -q \
        -p no:cacheprovider --hypothesis-show-statistics
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphmon.formats.read import ReadLimits, read_trace, write_trace
from graphmon.model.trace import Trace, TraceError

from helpers import DATA
EXAMPLES = int(os.environ.get("GRAPHMON_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=3000,  # ms per example: a hang or runaway allocation shows up as a failure
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
    derandomize=os.environ.get("CI") == "true",  # reproducible in CI; random locally
)
# Small limits make the caps reachable by small examples.
LIMITS = ReadLimits(max_decompressed_bytes=8 << 20, max_event_bytes=1 << 20, max_kernels=5000, max_streams=40, max_names=500)
REASONS = {
    "missing_field", "non_numeric", "non_integer", "out_of_range", "bad_phase", "bad_name",
    "negative_timestamp", "zero_start", "end_before_start", "duplicate",
}


def read_or_error(data: bytes, suffix: str = ".trace") -> Trace | str:
    """The trace read from ``data``, or the TraceError's message (checked to be one line)."""
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"fuzz{suffix}"
        p.write_bytes(data)
        try:
            t = read_trace(p, progress=False, limits=LIMITS)
        except TraceError as e:
            assert str(e).startswith(f"{p}: ") and "\n" not in str(e)
            return str(e)
        check_consistent(t)
        # whatever was read can be saved and read back unchanged
        q = Path(d) / "back.graphmon.npz"
        write_trace(t, q)
        back = read_trace(q, progress=False)
        assert len(back) == len(t) and dict(back.invalid) == dict(t.invalid)
        np.testing.assert_array_equal(back.start_ns, t.start_ns)
        np.testing.assert_array_equal(back.graph, t.graph)
        return t


def check_consistent(t: Trace) -> None:
    assert set(t.invalid) <= REASONS, t.invalid
    assert all(v > 0 for v in t.invalid.values())
    if len(t):
        assert t.start_ns.min() > 0
        assert (t.end_ns >= t.start_ns).all()
        assert t.graph.min() >= -1 and t.graph.max() < len(t.graphs)
        assert t.name_id.min() >= -1 and t.name_id.max() < max(len(t.names), 1)
    lab, lg = t.launches["label"], t.launches["graph"]
    assert len(lab) == 0 or (lab.min() >= -1 and lab.max() < len(t.labels))
    assert len(lg) == 0 or (lg.min() >= -1 and lg.max() < len(t.graphs))


# ---------------------------------------------------------------------------- random events
def json_scalar():
    return st.one_of(
        st.none(), st.booleans(), st.text(max_size=8),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-(10**17), max_value=10**17).map(float),
    )


def field(good):
    """Mostly a plausible value, sometimes anything."""
    return st.one_of(good, good, good, json_scalar(), st.lists(st.integers(), max_size=2), st.just({"x": 1}))


times = st.one_of(
    st.integers(min_value=1, max_value=10**6),
    st.decimals(min_value=0, max_value=10**6, places=3).map(lambda d: float(d)),
    st.integers(min_value=-(10**3), max_value=0),
    st.integers(min_value=10**15, max_value=10**17),  # beyond int64 ns
)
names = st.one_of(st.sampled_from(["k_a", "k_b", "void gemm<bf16>()"]), st.text(max_size=12))  # unicode, surrogates


@st.composite
def kernel_event(draw, corrs):
    args = {"stream": draw(field(st.integers(0, 60))), "correlation": draw(field(corrs)), "device": draw(field(st.integers(0, 2)))}
    for k in list(args):
        if draw(st.integers(0, 15)) == 0:
            del args[k]
    e = {"ph": draw(st.sampled_from(["X"] * 9 + ["B", 1])), "cat": "kernel", "name": draw(field(names)),
         "pid": 0, "tid": 7, "ts": draw(field(times)), "dur": draw(field(st.integers(-2, 50))), "args": args}
    for k in ("ts", "dur", "name", "args"):
        if draw(st.integers(0, 20)) == 0:
            del e[k]
    return e


@st.composite
def other_event(draw, corrs):
    kind = draw(st.sampled_from(["launch", "launch", "range", "junk", "scalar"]))
    if kind == "launch":
        return {"ph": "X", "cat": draw(st.sampled_from(["cuda_runtime", "cuda_driver", ["x"]])),
                "name": draw(st.sampled_from(["cudaGraphLaunch", "cudaGraphLaunch_v10000", "cuGraphLaunch", "cudaMemcpy"])),
                "pid": draw(field(st.integers(0, 2))), "tid": draw(field(st.integers(0, 2))),
                "ts": draw(field(times)), "args": {"correlation": draw(field(corrs))}}
    if kind == "range":
        return {"ph": "X", "cat": "user_annotation", "name": draw(field(names)), "pid": draw(field(st.integers(0, 2))),
                "tid": draw(field(st.integers(0, 2))), "ts": draw(field(times)), "dur": draw(field(st.integers(-5, 10**6)))}
    if kind == "junk":
        return draw(st.dictionaries(st.text(max_size=5), json_scalar(), max_size=4))
    return draw(json_scalar())


@st.composite
def event_lists(draw):
    corrs = st.integers(0, draw(st.integers(0, 30)))  # small ranges: duplicated correlation ids
    ks = draw(st.lists(kernel_event(corrs), max_size=60))
    if ks and draw(st.booleans()):
        ks += draw(st.lists(st.sampled_from(ks), max_size=10))  # exact duplicates
    os_ = draw(st.lists(other_event(corrs), max_size=20))
    events = draw(st.permutations(ks + os_))
    return events


def kernel_count(events) -> int:
    return sum(1 for e in events if type(e) is dict and e.get("cat") == "kernel")


@FUZZ
@given(events=event_lists(), gz=st.booleans(), array_format=st.booleans())
def test_random_event_lists(events, gz, array_format):
    doc = events if array_format else {"traceEvents": events, "deviceProperties": [{"id": 0, "name": "GPU"}]}
    data = json.dumps(doc).encode()  # allow_nan: NaN / Infinity appear as in Python-written traces
    if gz:
        data = gzip.compress(data)
    t = read_or_error(data)
    n = kernel_count(events)
    if isinstance(t, str):
        # the only legitimate refusals of a well-formed file: no kernels, or a cap reached
        assert (n == 0 and "no kernel events" in t) or "(limit)" in t, t
        return
    assert len(t) + t.invalid_total == n


@FUZZ
@given(st.data())
def test_many_streams_hit_the_cap_cleanly(data):
    n_streams = data.draw(st.integers(1, 120))
    events = [{"ph": "X", "cat": "kernel", "name": "k", "ts": 10 + i, "dur": 1, "args": {"stream": i, "correlation": 1, "device": 0}} for i in range(n_streams)]
    t = read_or_error(json.dumps({"traceEvents": events}).encode())
    assert isinstance(t, str) == (n_streams > LIMITS.max_streams)
    if not isinstance(t, str):
        assert len(t) == n_streams


# ---------------------------------------------------------------------------- mutated real files
def _small_kineto() -> bytes:
    """The real Kineto fixture cut to its first graph launch: 1 range, 1 launch, 120 kernels."""
    with gzip.open(DATA / "h200-kineto-decode-shapeA.json.gz", "rt") as fh:
        doc = json.load(fh)  # floats print back as the same shortest text
    ev = doc["traceEvents"]
    launch = next(e for e in ev if e.get("name") == "cudaGraphLaunch")
    corr = launch["args"]["correlation"]
    rng = [e for e in ev if e.get("cat") == "user_annotation"][:1]
    ks = [e for e in ev if e.get("cat") == "kernel" and e["args"]["correlation"] == corr][:120]
    doc["traceEvents"] = rng + [launch] + ks
    return json.dumps(doc).encode()


def _small_native(raw: bool) -> bytes:
    if raw:
        with np.load(DATA / "h200-cupti-decode-v1.npz", allow_pickle=False) as z:
            a = {k: z[k] for k in z.files}
        keep = np.isin(a["correlation_id"], np.unique(a["correlation_id"])[:2])
        for k in ("start", "end", "stream_id", "graph_id", "graph_node_id", "correlation_id", "name_id"):
            a[k] = a[k][keep][::8]
        buf = io.BytesIO()
        np.savez_compressed(buf, **a)
        return buf.getvalue()
    t = read_trace(DATA / "h200-cupti-decode-v1.graphmon.npz", progress=False)
    corr = np.unique(t.correlation_id)[:2]
    small = t.select(np.isin(t.correlation_id, corr))
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "s.npz"
        write_trace(small, p)
        return p.read_bytes()


@functools.lru_cache(maxsize=1)
def seeds():
    """Built once; a function rather than a fixture so failing examples do not print it."""
    k = _small_kineto()
    base = {"kineto": k, "kineto_gz": gzip.compress(k), "native": _small_native(False), "raw": _small_native(True)}
    for name, b in base.items():  # the unmutated seeds read cleanly
        t = read_or_error(b)
        assert isinstance(t, Trace) and len(t) > 0, (name, t)
    return base


mutations = st.lists(
    st.tuples(st.sampled_from(["flip", "set", "delete", "insert", "truncate"]), st.floats(0, 1, exclude_max=True), st.binary(min_size=1, max_size=8)),
    min_size=1, max_size=4,
)


def mutate(data: bytes, ops) -> bytes:
    b = bytearray(data)
    for op, where, payload in ops:
        if not b:
            break
        i = int(where * len(b))
        if op == "flip":
            b[i] ^= payload[0] or 1
        elif op == "set":
            b[i : i + len(payload)] = payload
        elif op == "delete":
            del b[i : i + len(payload)]
        elif op == "insert":
            b[i:i] = payload
        else:
            del b[i:]
    return bytes(b)


@FUZZ
@given(which=st.sampled_from(["kineto", "kineto_gz", "native", "raw"]), ops=mutations)
def test_mutated_real_files(which, ops):
    data = mutate(seeds()[which], ops)
    t = read_or_error(data)
    if isinstance(t, Trace) and which == "kineto":
        # plain JSON still parsed: every kernel event in it is accounted for
        try:
            doc = json.loads(data)
        except ValueError:
            return  # (the reader and json may disagree only on what is not JSON at all)
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        assert len(t) + t.invalid_total == kernel_count(events)


@FUZZ
@given(which=st.sampled_from(["kineto", "kineto_gz", "native", "raw"]), cut=st.floats(0, 1, exclude_max=True))
def test_truncated_real_files(which, cut):
    data = seeds()[which]
    assert isinstance(read_or_error(data[: int(cut * len(data))]), str)


def test_nan_and_infinity_literals_are_counted(tmp_path):
    # NaN/Infinity are not JSON but Python writes them; they count as non_numeric records
    ev = [{"ph": "X", "cat": "kernel", "ts": x, "dur": 1, "args": {"stream": 1, "correlation": 1, "device": 0}} for x in (1.0, math.nan, math.inf, -math.inf)]
    t = read_or_error(json.dumps({"traceEvents": ev}).encode())
    assert len(t) == 1 and dict(t.invalid) == {"non_numeric": 3}


# ---------------------------------------------------------------------------- structured native
i64 = st.one_of(st.integers(-3, 3), st.integers(-(2**63), 2**63 - 1), st.integers(1, 10**6))


@FUZZ
@given(
    n=st.integers(0, 12),
    m=st.integers(0, 4),
    data=st.data(),
)
def test_native_with_random_columns(n, m, data):
    """Hostile values inside a well-formed native file: columns and indexes of any int64."""
    from graphmon.model.trace import KERNEL_COLUMNS, LAUNCH_COLUMNS

    col = lambda dtype, k: np.array(data.draw(st.lists(i64 if dtype == np.int64 else st.integers(-3, 2**31 - 1), min_size=k, max_size=k)), dtype)  # noqa: E731
    arrays = {f"k_{k}": col(t, n) for k, t in KERNEL_COLUMNS.items()}
    arrays.update({f"l_{k}": col(t, m) for k, t in LAUNCH_COLUMNS.items()})
    if data.draw(st.booleans()):  # share correlation ids so launch rows match kernels
        arrays["k_correlation_id"] = np.array(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), np.int64)
        arrays["l_correlation_id"] = np.array(data.draw(st.lists(st.integers(0, 3), min_size=m, max_size=m)), np.int64)
    names = data.draw(st.lists(st.text(max_size=4), max_size=3))
    labels = data.draw(st.lists(st.text(max_size=4), max_size=2))
    graphs = data.draw(st.lists(st.builds(lambda k, g: {"key": k, "graph_id": g}, st.text(max_size=3), i64), max_size=3))
    meta = {"format": "graphmon-trace", "version": 1, "names": names, "labels": labels, "graphs": graphs,
            "invalid": data.draw(st.dictionaries(st.sampled_from(sorted(REASONS)), st.integers(1, 5), max_size=2)), "meta": {}}
    arrays["meta_json"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    t = read_or_error(buf.getvalue())
    if isinstance(t, Trace):
        assert len(t) + t.invalid_total == n + sum(meta["invalid"].values())


def test_mutated_npy_header_found_by_fuzzing():
    # This flipped byte lands in a compressed member's npy header; numpy's header parser raised
    # tokenize.TokenError (before the zip CRC check could object). It must read as a TraceError.
    msg = read_or_error(mutate(seeds()["native"], [("flip", 0.7265625, b"\x02")]))
    assert isinstance(msg, str)  # (with other numpy/zlib bytes the flip may hit elsewhere)
