"""Small builders shared by the exporter tests (real trace fixtures live in tests/data/)."""

from pathlib import Path

import numpy as np

from graphmon.model.window import Window
from graphmon.model.trace import GraphInfo, Trace

DATA = Path(__file__).parent / "data"
NATIVE = DATA / "h200-cupti-decode-v1.graphmon.npz"
KINETO = DATA / "h200-kineto-decode-shapeA.json.gz"
WIDEN_NS = 320  # the motivating regression: median gap 0.19 -> 0.51 us


def synthetic_trace(n_graphs=1, n_streams=1, replays=3, kernels_per_stream=4, gap_ns=400, dur_ns=1000,
                    upload_mode="uploaded", base_ns=1_000_000, device=0):
    """A regular trace: every replay of every graph runs kernels_per_stream kernels on each stream."""
    rows = []
    graphs = []
    corr = 1
    t = base_ns
    for g in range(n_graphs):
        graphs.append(GraphInfo(key=f"g{g + 1}", graph_id=g + 1, upload_mode=upload_mode, label=f"graph{g}"))
        for _ in range(replays):
            for s in range(n_streams):
                for k in range(kernels_per_stream):
                    st = t + k * (dur_ns + gap_ns)
                    rows.append((st, st + dur_ns, s, corr, g + 1))
            t += kernels_per_stream * (dur_ns + gap_ns) + 10_000
            corr += 1
    a = np.array(rows, dtype=np.int64)
    return Trace.build(start_ns=a[:, 0], end_ns=a[:, 1], stream=a[:, 2], correlation_id=a[:, 3],
                       graph_id=a[:, 4], device=np.full(len(a), device), graphs=graphs)


def window(trace, ended_s=1_800_000_000.0, **kw):
    return Window(trace=trace, started_s=ended_s - 1.0, ended_s=ended_s, **kw)


def untraced(graph, duration_ns) -> dict:
    """Window.untraced columns (graphmon.model.window.UNTRACED_COLUMNS): row i is a replay of
    graph index ``graph[i]`` (-1: unknown) timed untraced at ``duration_ns[i]``."""
    return {"graph": np.asarray(graph, np.int32), "duration_ns": np.asarray(duration_ns, np.int64)}


def widen(trace: Trace, graph_index: int, add_ns: int = WIDEN_NS) -> Trace:
    """Shift kernels so every gap on every stream of one graph grows by exactly ``add_ns``.

    Within each (replay, stream), the k-th kernel by start moves later by k * add_ns.
    """
    start, end = trace.start_ns.copy(), trace.end_ns.copy()
    sel = np.flatnonzero(trace.graph == graph_index)
    o = np.lexsort((start[sel], trace.stream[sel], trace.correlation_id[sel], trace.device[sel]))
    rows = sel[o]
    key = np.stack([trace.device[rows], trace.correlation_id[rows], trace.stream[rows]])
    head = np.r_[True, (key[:, 1:] != key[:, :-1]).any(axis=0)]
    idx = np.arange(len(rows))
    k = idx - np.maximum.accumulate(np.where(head, idx, 0))
    start[rows] += k * add_ns
    end[rows] += k * add_ns
    return Trace.build(start_ns=start, end_ns=end, stream=trace.stream, correlation_id=trace.correlation_id,
                       device=trace.device, graph_id=trace.graph_id, graph_node_id=trace.graph_node_id,
                       name_id=trace.name_id, names=trace.names, launches=trace.launches, graphs=trace.graphs,
                       labels=trace.labels, meta=trace.meta)


def only(trace: Trace, name: str) -> Trace:
    return trace.select(trace.graph == trace.graph_names().index(name))


def half(trace: Trace, which: int) -> Trace:
    """The first (0) or second (1) half of each graph's replays, by time."""
    from graphmon.analysis.replays import analyze

    r = analyze(trace).replays
    keep_corr = []
    for g in np.unique(r.graph):
        rows = np.flatnonzero(r.graph == g)
        rows = rows[np.argsort(r.first_start_ns[rows])]
        keep_corr.append(r.correlation_id[np.array_split(rows, 2)[which]])
    return trace.select(np.isin(trace.correlation_id, np.concatenate(keep_corr)) & (trace.graph >= 0))


def untraced_rows(trace: Trace, factor: float = 1.0, which=None) -> dict:
    """Untraced replay durations (model.window.UNTRACED_COLUMNS) made from ``trace``'s real replay
    spans, each x ``factor``: one row per replay (``which``: of the first (0) or second (1) half of
    each graph's replays only), in time order; ``graph`` indexes ``trace.graphs``."""
    from graphmon.analysis.replays import analyze

    r = analyze(trace if which is None else half(trace, which)).replays
    o = np.argsort(r.first_start_ns, kind="stable")
    return {"graph": r.graph[o].astype(np.int32), "duration_ns": np.round(r.span_ns[o] * factor).astype(np.int64)}


def widen_at(trace: Trace, graph_index: int, stream: int, positions, add_ns: int = 5_000) -> Trace:
    """Widen chosen boundaries of one graph by ``add_ns`` in every replay.

    On ``stream``, kernel k+1 onward (by start, within each replay) moves later by ``add_ns`` for each
    position k in ``positions``: exactly the boundaries (k, k+1) widen, every other gap stays.
    """
    start, end = trace.start_ns.copy(), trace.end_ns.copy()
    sel = np.flatnonzero((trace.graph == graph_index) & (trace.stream == stream))
    o = np.lexsort((start[sel], trace.correlation_id[sel], trace.device[sel]))
    rows = sel[o]
    key = np.stack([trace.device[rows], trace.correlation_id[rows]])
    head = np.r_[True, (key[:, 1:] != key[:, :-1]).any(axis=0)]
    idx = np.arange(len(rows))
    k = idx - np.maximum.accumulate(np.where(head, idx, 0))
    shift = sum((k > p).astype(np.int64) * add_ns for p in positions)
    start[rows] += shift
    end[rows] += shift
    return Trace.build(start_ns=start, end_ns=end, stream=trace.stream, correlation_id=trace.correlation_id,
                       device=trace.device, graph_id=trace.graph_id, graph_node_id=trace.graph_node_id,
                       name_id=trace.name_id, names=trace.names, launches=trace.launches, graphs=trace.graphs,
                       labels=trace.labels, meta=trace.meta)


def wait_until(pred, timeout=5.0, step_s=0.01):
    """Poll ``pred`` until it is true (True) or ``timeout`` seconds passed (False)."""
    import time

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return True
        time.sleep(step_s)
    return False


def per_stream_gap_medians(trace, min_gaps=5):
    """{(kernels per replay, stream): median gap ns} over a trace's graph replays: graphs matched
    by kernel count per replay, so a live trace and a profiler trace of one workload compare."""
    from graphmon.analysis.replays import analyze

    a = analyze(trace)
    kpr = {}
    for gi in np.unique(trace.graph[trace.graph >= 0]):
        _, counts = np.unique(trace.correlation_id[trace.graph == gi], return_counts=True)
        kpr[int(gi)] = int(np.median(counts))
    out: dict = {}
    g = a.gaps
    for i in range(len(g)):
        vals = g.values[g.offsets[i]:g.offsets[i + 1]]
        if len(vals) >= min_gaps and int(g.graph[i]) in kpr:
            out.setdefault((kpr[int(g.graph[i])], int(g.stream[i])), []).append(vals)
    return {k: float(np.median(np.concatenate(v))) for k, v in out.items()}


def agent_window_traces(url, folder, want=4, timeout_s=70.0):
    """Windows with records fetched from a running agent's /trace (native format), newest 6 per poll."""
    import time

    import httpx

    from graphmon.formats.read import read_trace

    deadline = time.monotonic() + timeout_s
    traces = []
    while time.monotonic() < deadline and len(traces) < want:
        st = httpx.get(url + "/status", timeout=10).json()
        traces = []
        for wid in [w for p in st["processes"] for w in p["windows"]][-6:]:
            r = httpx.get(f"{url}/trace/{wid}", params={"format": "graphmon"}, timeout=30)
            if r.status_code == 200:
                path = f"{folder}/{wid}.graphmon.npz"
                with open(path, "wb") as fh:
                    fh.write(r.content)
                t = read_trace(path)
                if len(t):
                    traces.append(t)
        time.sleep(2)
    return traces


def run_under_agent(tmp_path, script, *args):
    """`graphmon run -- python SCRIPT OUT_DIR GO_FILE ...` (GPU tests): fetch live windows while the
    workload runs, then touch GO_FILE (the workload profiles itself and exits). Returns (live
    traces, profiler trace paths OUT_DIR/prof*.json, /metrics text, /status)."""
    import os
    import re
    import subprocess
    import sys

    import httpx

    go = tmp_path / "go"
    env = dict(os.environ, TMPDIR=str(tmp_path), NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    env.pop("GRAPHMON_AGENT", None)
    proc = subprocess.Popen([sys.executable, "-m", "graphmon.cli", "run", "--port", "0", "--interval-s", "2",
                             "--max-traced-share", "1", "--",
                             sys.executable, str(script), str(tmp_path), str(go), *args],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        url = "http://127.0.0.1:" + re.search(r":(\d+)/metrics", proc.stderr.readline()).group(1)
        traces = agent_window_traces(url, str(tmp_path), want=4, timeout_s=100.0)
        status = httpx.get(url + "/status", timeout=10).json()
        metrics = httpx.get(url + "/metrics", timeout=10).text
        go.touch()
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    return traces, sorted(tmp_path.glob("prof*.json")), metrics, status


def check_gaps_against_profiler(traces, prof_paths, metrics, tolerance_ns=32):
    """Live windows vs torch.profiler: per-stream gap medians within ``tolerance_ns``; no empty window."""
    import re

    from graphmon.formats.read import read_trace
    from graphmon.model.trace import concat

    assert len(traces) >= 4, "fewer than 4 windows with records"
    assert re.search(r'graphmon_up\{rank="[^"]+"\} 1.0', metrics)
    assert not re.search(r"graphmon_empty_windows_total\{[^}]*\} [1-9]", metrics), "an empty window"
    assert prof_paths, "the workload wrote no profiler trace"
    live = per_stream_gap_medians(concat(traces))
    ref: dict = {}
    for p in prof_paths:
        ref.update(per_stream_gap_medians(read_trace(str(p))))
    common = set(live) & set(ref)
    assert common, f"no graph/stream in common: live {sorted(live)} profiler {sorted(ref)}"
    for k in sorted(common):
        assert abs(live[k] - ref[k]) <= tolerance_ns, (k, live[k], ref[k])


HELD_OUT_GRAPH = "decode_bs2/no_upload"
HELD_OUT_STREAMS = (7, 154, 156)  # the streams with many boundaries: +5 us on one moves no per-replay median


def held_out_concentrated(trace: Trace, add_ns: int = 5_000) -> tuple[list[tuple[int, int]], Trace]:
    """The issue's held-out case: +``add_ns`` on three boundaries (one on each of three streams, a
    small gap in the middle of the stream) of decode_bs2/no_upload of the H200 trace."""
    from graphmon.analysis.boundaries import boundary_gaps

    g = trace.graph_names().index(HELD_OUT_GRAPH)
    b = boundary_gaps(trace)
    med = b.quantile(0.5)
    picks = []
    for s in HELD_OUT_STREAMS:
        rows = np.flatnonzero((b.graph == g) & (b.stream == s) & (med < 1_000) & (b.position >= 5))
        picks.append((s, int(b.position[rows[len(rows) // 2]])))
    cur = trace
    for s, p in picks:
        cur = widen_at(cur, g, s, [p], add_ns)
    return picks, cur


class AgentClient:
    """A hand-made process on an agent's Unix socket: hello, heartbeats, windows, raw frames."""

    def __init__(self, socket_path, rank="0", interval_s=10.0, pid=None, hello=True, status=None):
        import os
        import socket

        from graphmon.model.wire import encode_message

        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(socket_path)
        self.ident = {"rank": rank, "rank_source": "RANK", "pid": str(pid or os.getpid()), "host": "h", "device": "0",
                      "uuid": "GPU-1", "pci_bus_id": "00000000:10:00.0", "interval_s": interval_s, "first_window_s": 0.0}
        if hello:
            self.s.sendall(encode_message("hello", identity=self.ident, status=status or {"state": "running"}))

    def send(self, kind, **fields):
        from graphmon.model.wire import encode_message

        self.s.sendall(encode_message(kind, **fields))

    def heartbeat(self, state="running", **status):
        self.send("heartbeat", identity=self.ident, status={"state": state, **status})

    def bye(self):
        self.send("bye", status={"state": "stopped"})

    def window(self, n_kernels, n_launches=2, status=None, ended_s=None, **header):
        """A window of ``n_kernels`` kernels on stream 7 of graph 1 (n_launches replays);
        ``header`` entries replace the encoded header's (hostile senders)."""
        import time

        from graphmon.model.trace import Trace
        from graphmon.model.window import Window
        from graphmon.model.wire import encode_window, frame, split_frame

        corr = np.repeat(np.arange(1, n_launches + 1), n_kernels // n_launches) if n_kernels else np.zeros(0, np.int64)
        t = Trace.build(start_ns=np.arange(1, n_kernels + 1) * 1000, end_ns=np.arange(1, n_kernels + 1) * 1000 + 400,
                        stream=np.full(n_kernels, 7), correlation_id=corr, graph_id=np.full(n_kernels, 1),
                        launches={"correlation_id": np.arange(1, n_launches + 1)})
        ended_s = time.time() if ended_s is None else ended_s
        data = encode_window(Window(trace=t, started_s=ended_s - 0.1, ended_s=ended_s), status=status)
        if header:
            h, payload = split_frame(bytes(data[4:]))
            data = frame({**h, **header}, bytes(payload))
        self.s.sendall(data)

    def closed_by_peer(self, timeout_s=2.0) -> bool:
        """True once the agent closed this connection (EOF or reset) within ``timeout_s``."""
        import select

        r, _, _ = select.select([self.s], [], [], timeout_s)
        if not r:
            return False
        try:
            return self.s.recv(65536) == b""
        except OSError:
            return True

    def close(self):
        self.s.close()


def make_pki(folder):
    """A throwaway CA, a server certificate for 127.0.0.1/localhost and a client certificate it
    signed, as PEM files in ``folder`` (the `cryptography` package): {"ca", "cert", "key",
    "client_cert", "client_key"} -> path."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def cert(subject, key, issuer, issuer_key, *, ca=False, san=None, usage=None):
        b = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name(issuer)).public_key(key.public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if ca:
            b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                              content_commitment=False, key_encipherment=False, data_encipherment=False,
                                              key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            b = b.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        else:
            b = b.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                                critical=False)
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        if usage:
            b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    def write(stem, obj):
        path = folder / stem
        if isinstance(obj, x509.Certificate):
            path.write_bytes(obj.public_bytes(serialization.Encoding.PEM))
        else:
            path.write_bytes(obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return str(path)

    ca_key, key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = cert("graphmon test CA", ca_key, "graphmon test CA", ca_key, ca=True)
    server = cert("127.0.0.1", key, "graphmon test CA", ca_key, usage=ExtendedKeyUsageOID.SERVER_AUTH,
                  san=[x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    client = cert("prometheus", client_key, "graphmon test CA", ca_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    return {"ca": write("ca.pem", ca), "cert": write("server.pem", server), "key": write("server.key", key),
            "client_cert": write("client.pem", client), "client_key": write("client.key", client_key)}


def many_graphs(n_graphs=64, n_streams=4, replays=2, kernels_per_stream=8):
    """A window of ``n_graphs`` graphs (half uploaded, half lazy) on ``n_streams`` streams, each
    replayed ``replays`` times, with a launch record per replay (so the agent keeps them)."""
    rows, t, corr = [], 10**12, 0
    for g in range(n_graphs):
        for _ in range(replays):
            corr += 1
            for s in range(n_streams):
                for k in range(kernels_per_stream):
                    st = t + k * 1_400 + (g % 7) * 10
                    rows.append((st, st + 1_000, 7 + s, corr, g + 1))
            t += kernels_per_stream * 1_400 + 20_000
    a = np.array(rows, dtype=np.int64)
    corrs = np.arange(1, corr + 1)
    graphs = [GraphInfo(key=f"g{g + 1}", graph_id=g + 1, label=f"decode_bs{g + 1}",
                        upload_mode="uploaded" if g % 2 else "lazy") for g in range(n_graphs)]
    return Trace.build(start_ns=a[:, 0], end_ns=a[:, 1], stream=a[:, 2], correlation_id=a[:, 3], graph_id=a[:, 4],
                       graphs=graphs, launches={"correlation_id": corrs, "graph": (corrs - 1) // replays,
                                                "launch_ns": 10**12 - 5_000 + corrs})


def deploy_result(n_graphs=64, n_streams=4, untraced_shift_ns=None):
    """A deploy verdict's Result as DeployCollector reads it: every graph regressed (uniform);
    ``untraced_shift_ns``: each graph's untraced replay shift too (None: not measured)."""
    import time
    from types import SimpleNamespace

    streams = [SimpleNamespace(stream_current=7 + s, flagged=True, shift_ns=300.0) for s in range(n_streams)]
    graphs = [SimpleNamespace(graph=f"decode_bs{g + 1}", device=0, kind="uniform", regression=True,
                              gap_added_ns=1_000.0 + g, streams=streams,
                              untraced_replay=None if untraced_shift_ns is None else SimpleNamespace(shift_ns=untraced_shift_ns, tested=True))
              for g in range(n_graphs)]
    verdict = SimpleNamespace(graphs=graphs, regressions=lambda: graphs)
    return SimpleNamespace(rank="0", reference="previous", state="ready", verdict=verdict,
                           reference_newest_s=time.time(), current_incarnation="i1")


def windows_of(trace, per_window=4):
    """The trace cut into windows of ``per_window`` consecutive replays (a default window: 4)."""
    corr = np.unique(trace.correlation_id[trace.graph >= 0])
    return [trace.select(np.isin(trace.correlation_id, corr[i:i + per_window]))
            for i in range(0, len(corr) - per_window + 1, per_window)]


class VerdictProc:
    """What the agent hands the deploy verdict's window hook: an Attached (graphmon.export.ranks)
    whose rank's series (one aggregator, window ids ``r1-w<k>``) it shares with the process it took
    the rank over from (``after``), the window ingested. ``identity``: more of its hello (host,
    process_start_s)."""

    def __init__(self, rank="0", pid=100, incarnation=None, after=None, **identity):
        from types import SimpleNamespace

        from graphmon.export.aggregator import Aggregator

        self.rank = rank
        start = identity.get("process_start_s")
        self.incarnation = incarnation or (f"i{pid}-{start}" if start else f"i{pid}")
        self.series = after.series if after is not None else SimpleNamespace(
            rank=rank, tag="r1", aggregator=Aggregator(rank=rank))
        self.proc = SimpleNamespace(identity={"pid": str(pid), "rank": rank, **identity})
        self.t = after.t if after is not None else 1_800_000_000.0

    @property
    def aggregator(self):
        return self.series.aggregator

    def send(self, verdict, trace, **kw):
        """``kw``: more of the Window (untraced=...)."""
        self.t += 10
        w = window(trace, ended_s=self.t, **kw)
        self.aggregator.ingest(w)
        verdict.on_window(self, w)
        return f"{self.series.tag}-{self.aggregator.snapshot().windows[-1]}"
