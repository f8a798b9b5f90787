"""How long does reading a Kineto trace take, and would a JSON library make it faster?

Times, on the shared H200 Kineto trace (median of N runs, one process, one core):
  read_trace            graphmon's reader end to end (gunzip + JsonStream + columns + Trace.build)
  gunzip                decompression alone (the floor every parser pays)
  jsonstream_events     JsonStream decoding every event, no column building (the parser's share)
  stdlib_loads          json.loads of the whole document (parse_float=Decimal, as graphmon needs)
  orjson_loads          orjson.loads of the whole document (floats only: no parse_float)
  msgspec_decode        msgspec.json.decode of the whole document with float_hook=Decimal
  ijson_items           ijson (yajl2_c backend) streaming traceEvents items, use_float=False (Decimal)
and whether each keeps Kineto's nanosecond digits exact (ts * 1000 == the ns from the text).

    .venv/bin/python bench/formats/parse_kineto.py [--runs 5] [--out bench/results/parse-kineto.json]
"""

from __future__ import annotations

import gzip
import io
import json
import platform
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path

DECISION = (
    "Kept graphmon's JsonStream (stdlib scanner, one event at a time). The whole-document parsers "
    "(orjson, msgspec) hold the full decompressed text plus every event in memory (the limit allows 4 GiB of "
    "JSON), and orjson has no parse_float hook: it returns float64 microseconds, which are ns-exact here "
    "(ts ~5.4e12 us) but not for epoch-based timestamps (~1.7e15 us, float64 step 0.25 us). ijson keeps "
    "streaming and Decimal but is not faster than JsonStream. The best case, orjson on the whole document, "
    "would save the difference between stdlib_loads and orjson_loads only."
)
if not __package__:  # run as a file: import bench.* and graphmon from this checkout (bench/README.md)
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.common import cli  # noqa: E402
from bench.common.paths import KINETO as TRACE, RESULTS  # noqa: E402


def _timed(fn, runs):
    out = []
    result = None
    for _ in range(runs):
        t0 = time.perf_counter()
        result = fn()
        out.append(time.perf_counter() - t0)
    return out, result


def _ns_exact(events, expect) -> bool:
    """Every kernel start to integer ns equals the exact value from the text. A Decimal or the
    number's own text (JsonStream's FloatText, a str) converts exactly; a float rounds."""
    got = []
    for e in events:
        if isinstance(e, dict) and e.get("cat") == "kernel":
            ts = e["ts"]
            exact = isinstance(ts, (Decimal, str))
            got.append(int(Decimal(ts).scaleb(3).to_integral_value()) if exact else round(ts * 1000))
    return got == expect


def main(argv=None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--out", help="default: bench/results/parse-kineto.json")
    args = ap.parse_args(argv)
    if args.smoke:  # one run on a tenth of the trace
        args.runs, args.trace = 1, str(cli.kineto_subset(TRACE))
    args.out = str(cli.out_path(args.out, RESULTS / "parse-kineto.json", args.smoke))

    from graphmon.formats.jsonstream import JsonStream
    from graphmon.formats.read import ReadLimits, read_trace

    raw = Path(args.trace).read_bytes()
    text = gzip.decompress(raw)
    exact = [int(Decimal(e["ts"]).scaleb(3)) for e in json.loads(text, parse_float=Decimal)["traceEvents"] if e.get("cat") == "kernel"]

    def jsonstream_events():
        js = JsonStream(io.BytesIO(raw), gzip.GzipFile(fileobj=io.BytesIO(raw)), ReadLimits(), lambda: None)
        js.expect("{")
        events = []
        while True:
            key = js.value()
            js.expect(":")
            if key == "traceEvents":
                js.expect("[")
                while True:
                    events.append(js.value())
                    if js.expect(",]") == "]":
                        break
            else:
                js.value()
            if js.expect(",}") == "}":
                return events

    cases = {
        "read_trace": lambda: read_trace(args.trace, progress=False),
        "gunzip": lambda: gzip.decompress(raw),
        "jsonstream_events": jsonstream_events,
        "stdlib_loads": lambda: json.loads(gzip.decompress(raw), parse_float=Decimal)["traceEvents"],
    }
    try:
        import orjson

        cases["orjson_loads"] = lambda: orjson.loads(gzip.decompress(raw))["traceEvents"]
    except ImportError:
        pass
    try:
        import msgspec

        dec = msgspec.json.Decoder(float_hook=Decimal)
        cases["msgspec_decode"] = lambda: dec.decode(gzip.decompress(raw))["traceEvents"]
    except ImportError:
        pass
    try:
        import ijson

        cases["ijson_items"] = lambda: list(ijson.items(gzip.GzipFile(fileobj=io.BytesIO(raw)), "traceEvents.item", use_float=False))
    except ImportError:
        pass

    results = {}
    for name, fn in cases.items():
        times, res = _timed(fn, args.runs)
        r = {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "runs": len(times)}
        if isinstance(res, list):
            r["ns_exact"] = _ns_exact(res, exact)
            r["whole_document_in_memory"] = name in ("stdlib_loads", "orjson_loads", "msgspec_decode")
        results[name] = r
        print(f"{name:20s} median {r['median_s'] * 1e3:8.1f} ms  (min {r['min_s'] * 1e3:.1f}, max {r['max_s'] * 1e3:.1f})"
              + (f"  ns exact: {r['ns_exact']}" if "ns_exact" in r else ""), flush=True)

    versions = {}
    for mod in ("orjson", "msgspec", "ijson", "numpy"):
        try:
            versions[mod] = __import__(mod).__version__
        except (ImportError, AttributeError):
            pass
    out = {
        "trace": Path(args.trace).name,
        "trace_bytes_gz": len(raw),
        "trace_bytes_json": len(text),
        "kernel_events": len(exact),
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "versions": versions,
        "results": results,
        "decision": DECISION,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
