#!/usr/bin/env bash
# One device call on a CUDA machine (run from the repo root; wheels for what the image lacks in
# .whl/, see docs/attach.md): the GPU tests three times in a row, the end-to-end tests on real
# clients (HF transformers static-cache generate; a vLLM-shaped spawn tree), and a live
# `graphmon run` over examples/decode_server.py scraped over HTTP; with "impact", what graphmon
# costs a serving loop (bench/overhead/host_impact.py, agent mode, ~7 min) and the decode path on this
# machine's CPU (bench/collector/decode_buffers.py). Everything lands under $OUT (small summaries + one
# tarball). Sections: GPU_CHECK_SECTIONS=idle,smoke,tests,e2e,live,trace,decode,impact (default tests,e2e,live;
# idle: test_live_idle.py alone; smoke: the live CUPTI tests once; trace: bench/overhead/trace_cost.py;
# decode: bench/collector/decode_buffers.py; impact: bench/overhead/host_impact.py; deploy: bench/deploy/deploy_restart.py, < 6 min,
# with a real Prometheus when .prom/prometheus.xz is carried; window: bench/diag/window_quality.py;
# fleet: bench/deploy/fleet.py (FLEET_WORKLOADS); burst: bench/overhead/burst_cost.py (BURST_WORKLOADS)).
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT/all"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >"$OUT/all/pip.txt" 2>&1 || { echo "wheel install failed"; tail -5 "$OUT/all/pip.txt"; exit 3; }
  export PYTHONPATH="$PWD:/tmp/site"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-python3}
# the native decode pass (setup.py), built in place: graphmon runs from this tree (PYTHONPATH)
$PY setup.py -q build_ext --inplace >"$OUT/all/build-native.txt" 2>&1 || echo "native decode not built (numpy path): see all/build-native.txt"
SECTIONS=${GPU_CHECK_SECTIONS:-tests,e2e,live}
IMPACT_ARGS=${IMPACT_ARGS:---rounds 3 --max-phase-s 16 --paired-s 40 --block-s 2}
has() { case ",$SECTIONS," in *",$1,"*) return 0;; esac; return 1; }
# a Prometheus binary carried as .prom/prometheus.xz (the device has none) -> /tmp/prometheus, so
# that the shipped rules fire for real; false when none is carried
unpack_prometheus() {
  [ -f .prom/prometheus.xz ] && $PY -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.prom/prometheus.xz'), open('/tmp/prometheus', 'wb'))" \
    && chmod +x /tmp/prometheus
}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  $PY -c "import cupti, importlib.metadata as m; print('cupti-python', m.version('cupti-python'))"
  $PY -c "from graphmon.sources.cupti import native; print('decode:', native.status())"; } > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

if has idle; then
  echo "== GPU test tests/gpu/test_live_idle.py alone"
  timeout 90 $PY -m pytest tests/gpu/test_live_idle.py -q -p no:cacheprovider -rA 2>&1 | tail -25 > "$OUT/all/gpu-tests-idle.txt"
  tail -1 "$OUT/all/gpu-tests-idle.txt" | tee -a "$OUT/gpu-tests-summary.txt"
fi

if has smoke; then
  echo "== GPU tests (tests/gpu/test_live_cupti.py, test_live_idle.py), once"
  # test_live_idle in a process of its own: once torch.profiler ran (test_live_cupti's last test),
  # Kineto keeps CUPTI and graphmon stays blocked in that process
  timeout 90 $PY -m pytest tests/gpu/test_live_idle.py -q -p no:cacheprovider -rA 2>&1 | tail -25 > "$OUT/all/gpu-tests-idle.txt"
  tail -1 "$OUT/all/gpu-tests-idle.txt" | tee -a "$OUT/gpu-tests-summary.txt"
  timeout 120 $PY -m pytest tests/gpu/test_live_cupti.py -q -p no:cacheprovider -rA 2>&1 | tail -25 > "$OUT/all/gpu-tests-smoke.txt"
  tail -1 "$OUT/all/gpu-tests-smoke.txt" | tee -a "$OUT/gpu-tests-summary.txt"
fi

if has tests; then
  for i in 1 2 3; do
    echo "== GPU tests (tests/gpu/test_live_cupti.py, test_live_idle.py), run $i of 3"
    timeout 90 $PY -m pytest tests/gpu/test_live_idle.py -q -p no:cacheprovider -rA 2>&1 | tail -25 > "$OUT/all/gpu-tests-idle-$i.txt"
    tail -1 "$OUT/all/gpu-tests-idle-$i.txt" | tee -a "$OUT/gpu-tests-summary.txt"
    timeout 120 $PY -m pytest tests/gpu/test_live_cupti.py -q -p no:cacheprovider -rA 2>&1 | tail -25 > "$OUT/all/gpu-tests-$i.txt"
    tail -1 "$OUT/all/gpu-tests-$i.txt" | tee -a "$OUT/gpu-tests-summary.txt"
  done
fi

if has e2e; then
  echo "== end-to-end on real clients under graphmon run (HF static-cache generate; vLLM-shaped tree)"
  timeout 330 $PY -m pytest tests/gpu/test_hf_generate.py tests/gpu/test_vllm_shaped.py -q -p no:cacheprovider -rA \
    --basetemp="$OUT/all/e2e" 2>&1 | tail -60 > "$OUT/all/gpu-e2e.txt"
  grep -E "passed|failed|PASSED|FAILED|Error" "$OUT/all/gpu-e2e.txt" | tail -8 | tee -a "$OUT/gpu-tests-summary.txt"
fi

if has live; then
  echo "== graphmon run -- examples/decode_server.py, scraped live"
  $PY -m graphmon.cli run --port 9477 --interval-s 2 --max-traced-share 1 -- $PY examples/decode_server.py --seconds 20 --layers 24 \
    > "$OUT/all/run.log" 2>&1 &
  RUN=$!
  sleep 15
  $PY - "$OUT" <<'PY'
import json, sys, urllib.request
out = sys.argv[1]
m = urllib.request.urlopen("http://127.0.0.1:9477/metrics", timeout=10).read().decode()
open(f"{out}/all/live-metrics.txt", "w").write(m)
st = json.load(urllib.request.urlopen("http://127.0.0.1:9477/status", timeout=10))
json.dump(st, open(f"{out}/all/live-status.json", "w"), indent=1)
modes = sorted({l.split('upload_mode="')[1].split('"')[0] for l in m.splitlines()
                if l.startswith("graphmon_kernel_gap_seconds_count")})
lines = [f"live: processes {[(p.get('rank'), p.get('pid'), p.get('state'), p.get('windows_total'), p.get('records_total')) for p in st.get('processes', [])]}",
         f"upload modes with gap series: {modes}"]
lines += [l for l in m.splitlines() if l.startswith(("graphmon_up", "graphmon_empty_windows_total", "graphmon_records_invalid_total{"))
          and not l.endswith(" 0.0")]
open(f"{out}/live-summary.txt", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
  wait $RUN; echo "graphmon run exit code: $?" | tee -a "$OUT/live-summary.txt"
fi
if has trace; then
  echo "== what kernel tracing costs a replay on the GPU (bench/overhead/trace_cost.py; CUPTI buffers on the device, then pinned)"
  timeout 150 $PY bench/overhead/trace_cost.py --out "$OUT/all/trace" > "$OUT/all/trace-cost.log" 2>&1; echo "exit $?"
  timeout 150 $PY bench/overhead/trace_cost.py --out "$OUT/all/trace" --pinned > "$OUT/all/trace-cost-pinned.log" 2>&1; echo "exit $?"
  cp "$OUT"/all/trace/trace-cost*.json "$OUT/" 2>/dev/null
  grep -h "kernels;" "$OUT"/all/trace-cost*.log | tee "$OUT/trace-cost-summary.txt"
fi
if has decode; then
  echo "== decode path on this CPU, native and numpy side by side (bench/collector/decode_buffers.py)"
  timeout 120 $PY bench/collector/decode_buffers.py --out "$OUT" > "$OUT/all/decode-buffers.log" 2>&1; echo "exit $?"
fi
if has impact; then
  echo "== host impact (bench/overhead/host_impact.py --modes agent $IMPACT_ARGS)"
  timeout ${IMPACT_TIMEOUT_S:-480} $PY bench/overhead/host_impact.py --out "$OUT/all/impact" --modes agent $IMPACT_ARGS \
    > "$OUT/all/host-impact.log" 2>&1; echo "exit $?"
  cp "$OUT/all/impact/host-impact.json" "$OUT/" 2>/dev/null
  tail -5 "$OUT/all/host-impact.log"
fi
if has deploy; then
  echo "== a deploy under one agent: decode v1 -> v2 (memcpy nodes) -> v3, HF h1 -> h2 (bench/deploy/deploy_restart.py)"
  PROM_ARGS=()
  if unpack_prometheus; then PROM_ARGS=(--prometheus /tmp/prometheus); fi
  timeout 340 $PY bench/deploy/deploy_restart.py --out "$OUT/all/deploy" --timeout-s 330 "${PROM_ARGS[@]}" > "$OUT/all/deploy-restart.log" 2>&1; echo "exit $?"
  cp "$OUT/all/deploy/deploy-restart.json" "$OUT/" 2>/dev/null
  grep -h "^rank " "$OUT/all/deploy-restart.log" | tee "$OUT/deploy-restart-summary.txt"
fi
if has window; then
  echo "== window data quality per tracing switch (bench/diag/window_quality.py): issue 37"
  timeout 240 $PY bench/diag/window_quality.py --out "$OUT/all/window" > "$OUT/all/window-quality.log" 2>&1; echo "exit $?"
  cp "$OUT"/all/window/*.json "$OUT/" 2>/dev/null
  tail -20 "$OUT/all/window-quality.log"
fi
if has fleet; then
  # a rolling update over two agents as two nodes, scored against each pod's untraced truth:
  # FLEET_WORKLOADS=widened,identical,rollback (issue 35) or eventrec,plus1 (issue 36), one call each
  echo "== fleet deploy verdict (bench/deploy/fleet.py --workloads ${FLEET_WORKLOADS:=widened,identical,rollback})"
  PROM=prometheus
  if unpack_prometheus; then PROM=/tmp/prometheus; fi
  timeout 560 $PY bench/deploy/fleet.py --out "$OUT/all/fleet" --prometheus "$PROM" --workloads "$FLEET_WORKLOADS" \
    > "$OUT/all/fleet.log" 2>&1; echo "exit $?"
  cp "$OUT/all/fleet/deploy-fleet.json" "$OUT/" 2>/dev/null
  tail -15 "$OUT/all/fleet.log"
fi
if has burst; then
  echo "== what untraced bursts cost a step (bench/overhead/burst_cost.py --workloads ${BURST_WORKLOADS:=decode_server}): issue 36"
  timeout 540 $PY bench/overhead/burst_cost.py --out "$OUT/all/burst" --workloads "$BURST_WORKLOADS" \
    > "$OUT/all/burst-cost.log" 2>&1; echo "exit $?"
  cp "$OUT/all/burst/burst-cost.json" "$OUT/" 2>/dev/null
  tail -15 "$OUT/all/burst-cost.log"
fi
tar -czf "$OUT/gpu-check.tgz" -C "$OUT" all && rm -rf "$OUT/all"
