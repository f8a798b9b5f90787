#!/usr/bin/env bash
# One device call: GPU tests, live `graphmon run` scraped over HTTP, steady overhead with the
# current defaults. Writes everything under $OUT (or ./gpu-out). Run from the repo root on a CUDA
# machine with torch and cupti-python importable (see docs/attach.md).
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # graphmon from this checkout
PY=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; $PY -c "import torch; print('torch', torch.__version__)"; } > "$OUT/gpu.txt" 2>&1

SECTIONS=${GPU_CHECK_SECTIONS:-sessions,tests,live,overhead}  # or "full": every bench/gpu_overhead.py section
SYNC_EVERY=${SYNC_EVERY:-8}
has() { case ",$SECTIONS," in *",$1,"*) return 0;; esac; return 1; }

if has sessions; then
echo "== CUPTI correlation ids and window edges (bench/cupti_sessions.py), both close modes"
for close in ${CLOSE_MODES:-drain_first disable_first}; do
  timeout 90 $PY bench/cupti_sessions.py --out "$OUT" --close $close 2>&1 | tail -8
done
fi

if has tests; then
echo "== GPU tests"
timeout 150 $PY -m pytest tests/gpu -q -p no:cacheprovider -rA 2>&1 | tail -40 | tee "$OUT/gpu-tests.txt"

fi

if has live; then
echo "== graphmon run -- examples/decode_server.py --sync-every $SYNC_EVERY, scraped live"
$PY -m graphmon.cli run --port 9477 --interval-s 2 -- $PY examples/decode_server.py --seconds 24 --sync-every "$SYNC_EVERY" > "$OUT/run.log" 2>&1 &
RUN=$!
sleep 18
$PY - "$OUT" <<'PY'
import json, sys, urllib.request
out = sys.argv[1]
m = urllib.request.urlopen("http://127.0.0.1:9477/metrics", timeout=10).read().decode()
open(f"{out}/live-metrics.txt", "w").write(m)
st = json.load(urllib.request.urlopen("http://127.0.0.1:9477/status", timeout=10))
json.dump(st, open(f"{out}/live-status.json", "w"), indent=1)
modes = sorted({l.split('upload_mode="')[1].split('"')[0] for l in m.splitlines() if l.startswith("graphmon_kernel_gap_seconds_count")})
print("live /metrics: state", st["state"], "windows", st["windows_total"], "upload modes with gap series:", modes,
      "invalid", st["records_invalid_total"], "errors", st["errors_total"])
print("graphs in last window:", [(g["graph"], g["upload_mode"], g["replays"], g["kernels_per_replay"]) for g in st["graphs"]])
for l in m.splitlines():
    if l.startswith("graphmon_kernel_gap_quantile_seconds{") and 'quantile="0.5"' in l:
        print("  ", l)
PY
wait $RUN; echo "graphmon run exit code: $?"
fi

if has overhead; then
ARMS=${OVERHEAD_ARMS:-off,on}
echo "== steady overhead, interleaved arms: $ARMS"
timeout 400 $PY bench/gpu_overhead.py --out "$OUT" --sections steady_overhead --json-name gpu-overhead-steady.json \
  --overhead-rounds ${OVERHEAD_ROUNDS:-6} --overhead-phase-s ${OVERHEAD_PHASE_S:-10} --overhead-arms "$ARMS" 2>&1 | tail -4
$PY -c "
import json; r = json.load(open('$OUT/gpu-overhead-steady.json')); print('errors', r['errors'])
s = r['sections'].get('steady_overhead') or {}
for a, v in s.get('arms', {}).items():
    print(a, 'overhead %', round(v['overhead_pct'], 3), 'ci95', [round(c, 2) for c in v.get('per_round_ci95_pct', [])], 'per-round', [round(x, 4) for x in v['per_round_ratio']], 'windows', v['windows'], 'ingest', v['ingest'])"
fi

if has full; then
ARMS=${OVERHEAD_ARMS:-off,on}
echo "== bench/gpu_overhead.py, every section; steady-overhead arms: $ARMS"
timeout 480 $PY bench/gpu_overhead.py --out "$OUT" --overhead-rounds ${OVERHEAD_ROUNDS:-8} \
  --overhead-phase-s ${OVERHEAD_PHASE_S:-10} --overhead-arms "$ARMS" 2>&1 | cut -c1-600 | tail -14
fi
