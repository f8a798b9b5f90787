# How bench/results/host-impact.json was put together from this folder's calls (run from the repo root;
# argument: call 3's host-impact.json).
import json, sys
c1=json.load(open('bench/results/gpu-check-7/host-impact-call1.json'))
c2=json.load(open('bench/results/gpu-check-7/host-impact-call2.json'))
out={"note": "Merged from gpu-check-7 (bench/results/gpu-check-7/README.md): HF bs 1 and bs 4 from call 2 "
             "(b9d2e8d, the final graphmon code; 0.1 s paired blocks); decode_server from call 1 (0fd0efd: "
             "the native decode and no polling, but the warm-up still after 'running'; 2 s paired blocks of "
             "the earlier design); launch_loop from call 3 (63f0237: the same graphmon code as call 2). One device call could not hold "
             "all three workloads (10 min a command), and the session's device time ran out before a "
             "decode_server run on the final code.",
     "calls": {"hf_static_bs1": 2, "hf_static_bs4": 2, "decode_server": 1},
     "workloads": {}, "errors": {}, "versions": c2["versions"], "settings": {"call1": c1.get("settings"), "call2": c2.get("settings")},
     "section_seconds": {"call1": c1.get("section_seconds"), "call2": c2.get("section_seconds")}}
out["workloads"].update(c2["workloads"])
out["workloads"]["decode_server"] = c1["workloads"]["decode_server"]
if len(sys.argv) > 1:
    c3=json.load(open(sys.argv[1]))
    for k,v in c3["workloads"].items():
        out["workloads"][k + "@call3"] = v
        out["calls"][k + "@call3"] = 3
    out["settings"]["call3"] = c3.get("settings")
out["summary"] = {}
for k, r in out["workloads"].items():
    p = r.get("paired", {})
    out["summary"][k] = {m: r.get(m) for m in ("max_step_increase_ms", "max_step_increase_in_windows_ms", "p999_step_ratio",
        "gil_hold_max_ms_per_window", "ticker_stall_max_off_ms", "ingest_records_per_s", "hold_cpu_max_ms",
        "steps_tracing_share", "interval_s_median")}
    out["summary"][k].update({"median_overhead_pct": p.get("median_overhead_pct") if "p25_overhead_pct" in p else p.get("median_of_pairs_pct"),
        "ci95_low_pct": p.get("ci95_low_pct") if "p25_overhead_pct" in p else (p.get("median_of_pairs_ci95_pct") or [None])[0],
        "ci95_high_pct": p.get("ci95_high_pct") if "p25_overhead_pct" in p else (p.get("median_of_pairs_ci95_pct") or [None, None])[1],
        "paired_block_s": p.get("block_s"), "n_pairs": p.get("n_pairs"),
        "ingest_steady_records_per_s_median": r.get("ingest_steady", {}).get("records_per_s_median")})
out["targets"] = c2.get("targets") or {"max_step_increase_ms": 1.0, "p999_step_ratio": 1.05, "median_overhead_pct": 0.3,
    "ci95_high_pct": 0.5, "gil_hold_max_ms_per_window": 1.0, "ingest_records_per_s": 10e6}
json.dump(out, open('bench/results/host-impact.json','w'), indent=1, default=str)
print(json.dumps(out["summary"], indent=1, default=str))
