"""Temporary diagnostic (not committed): collector CPU per window on real CUPTI buffers, old vs new code."""
import json, os, sys, time
import numpy as np
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import host_impact as hi
sys.path.insert(0, os.environ['GM_PATH'])
import graphmon
from graphmon.settings import CuptiSettings
from graphmon.sources.cupti.collector import CuptiSource

OUT = os.environ.get("OUT", "/tmp"); tag = sys.argv[1]
res = {"graphmon_file": graphmon.__file__}

def run(name, run_once, seconds):
    for _ in range(3): run_once()
    try:
        cs = CuptiSettings(interval_s=0.5, first_window_s=0.3, max_traced_share=1.0, window_launches=16)
    except Exception:
        cs = CuptiSettings(interval_s=0.5, first_window_s=0.3, window_launches=16)
    src = CuptiSource(settings=cs)
    src.records_sink = True
    got, stats = [], []
    src.start(lambda w: (got.append(len(w)), stats.append(dict(src.stats))))
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        run_once()
    plog = [dict(p) for p in src.phase_log]
    src.stop()
    res[name] = {"records": got, "stats": stats, "decoder": vars(src._decoder.stats) if hasattr(src._decoder, "stats") else None,
                 "phases": [{"decode_cpu_ms": p.get("decode_cpu_ms"), "parts": p.get("decode_parts_cpu_ms"),
                             "hold": p.get("hold_cpu_max_ms"),
                             "cpu": {k: (p["cpu"][k] - p["cpu"]["t0"]) * 1e3 for k in p["cpu"]}} for p in plog]}
    json.dump(res, open(os.path.join(OUT, f"diag-{tag}.json"), "w"), indent=1, default=str)
    print(tag, name, "windows", len(got), "median records", np.median(got) if got else 0,
          "median decode cpu ms", np.median([p["decode_cpu_ms"] for p in res[name]["phases"][1:]]), file=sys.stderr)

ro, _ = hi.decode_server_workload(48, 200)
run("decode_server", ro, 6)
ro, _ = hi.hf_workload(1, 128)
run("hf_bs1", ro, 6)
