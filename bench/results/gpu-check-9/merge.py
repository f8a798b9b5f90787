# How bench/results/host-impact.json was made from this folder (run from the repo root): call 3,
# the final graphmon code (97710c8, unchanged since), one device call holding every workload's
# rounds and paired blocks; call 2 (same graphmon code, host_impact without the tail and
# off-against-off figures) is kept beside it as a second run of the same state.
import json

D = "bench/results/gpu-check-9"
final = json.load(open(f"{D}/host-impact-call3.json"))
second = json.load(open(f"{D}/host-impact-call2.json"))
final["note"] = ("gpu-check-9 call 3 (bench/results/gpu-check-9/README.md): graphmon 97710c8, default settings, "
                 "agent mode, 3 rounds (12 s phases, one window each: 1.1-2.8x denser than the default interval) and "
                 "75 s of 0.1 s paired blocks per workload. aa_*: the same statistic for one 'off' phase against "
                 "another. tail_paired: pooled steps of the paired blocks (each 'on' block begins with an attach: "
                 "attach-stall-call4.json). 'second_run' holds call 2's summary (same code).")
final["second_run"] = {"call": 2, "summary": second["summary"], "settings": second["settings"]}
json.dump(final, open("bench/results/host-impact.json", "w"), indent=1, default=str)
print(json.dumps(final["summary"], indent=1, default=str)[:2000])
