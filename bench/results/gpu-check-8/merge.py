# How bench/results/host-impact.json was put together from this folder's calls (run from the repo root).
# Every call ran bench/host_impact.py in agent mode on the H200; the graphmon code differs only in
# the default of idle_unsubscribe_s (calls 4 and 5: ce280e3, 30 s, but every attach of the bench set
# it explicitly; call 6: the final code, default 0), see README.md here.
import json

D = "bench/results/gpu-check-8"
calls = {n: json.load(open(f"{D}/host-impact-call{n}.json")) for n in (4, 5, 6)}
out = {"note": "Merged from gpu-check-8 (bench/results/gpu-check-8/README.md). Keys: workload@state(call). "
               "'default': graphmon as shipped (stays subscribed between windows); 'idle1s': every attach "
               "with idle_unsubscribe_s=1 (opt-in: unsubscribed between windows once quiet). Paired arms: "
               "'idle' attaches with idle_unsubscribe_s=0.001, 'subscribed' with 0 (the default).",
       "workloads": {}, "errors": {}, "versions": calls[6]["versions"],
       "settings": {f"call{n}": c.get("settings") for n, c in calls.items()},
       "section_seconds": {f"call{n}": c.get("section_seconds") for n, c in calls.items()}}
W = out["workloads"]
W["hf_static_bs1@default(call6)"] = calls[6]["workloads"]["hf_static_bs1"]
for k in ("hf_static_bs1", "hf_static_bs4", "decode_server"):
    W[f"{k}@idle1s(call5)"] = calls[5]["workloads"][k]
for k in ("hf_static_bs1", "decode_server"):
    W[f"{k}@idle1s(call4)"] = calls[4]["workloads"][k]
out["summary"] = {}
for k, r in W.items():
    s = {m: r.get(m) for m in ("max_step_increase_ms", "max_step_increase_in_windows_ms", "max_step_increase_tracing_ms",
                               "max_step_increase_not_tracing_ms", "p999_step_ratio", "gil_hold_max_ms_per_window",
                               "ticker_stall_max_off_ms", "steps_tracing_share", "interval_s_median", "observer_slowdown")}
    for arm, p in r.get("paired_arms", {}).items():
        s[f"paired_{arm}"] = {m: p.get(m) for m in ("median_overhead_pct", "ci95_low_pct", "ci95_high_pct", "n_pairs",
                                                    "p25_overhead_pct", "first_half", "second_half")}
    out["summary"][k] = s
out["targets"] = calls[6].get("targets")
json.dump(out, open("bench/results/host-impact.json", "w"), indent=1, default=str)
print(json.dumps(out["summary"], indent=1, default=str)[:3000])
