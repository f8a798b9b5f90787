#!/usr/bin/env bash
# OUT=DIR bash bench/observer/gpu.sh   (on a CUDA machine, from the repo root; TRUTH_S, SIGNAL_S,
# GT_S, HF_S: each bench's time limit in seconds). The observer effect in one device call: the
# ground truth (bench/observer/truth.py), the always-on candidates (bench/observer/replay_signal.py;
# its graph_trace stage in a process of its own) and both on an HF torch.compile decode
# (bench/observer/hf_decode.py). Each script is its own process with its own time limit, each
# writes its JSON after every stage: a stage or a script that fails or runs out of time leaves the
# others' results. Everything lands under $OUT/observer. cupti-python and libcupti 13.4 come from
# .whl/ when the image lacks them (as scripts/gpu_check.sh).
set -u
case "${1:-}" in -h|--help) sed -n '2,/^set -u/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac  # the comment above
OUT=${OUT:-gpu-out}
D="$OUT/observer"
mkdir -p "$D"
SUMMARY='^(==|!!)|->|: replay|cost |hf truth|gt_' SUMMARY_LINES=30
. bench/common/observer_env.sh
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  $PY -c "import importlib.metadata as m; print('cupti-python', m.version('cupti-python'))"; } > "$D/gpu.txt" 2>&1
cat "$D/gpu.txt"
T0=$SECONDS
# each graph in a process of its own: a graph captured after kernel tracing was on may run slower
run truth ${TRUTH_S:-30} $PY bench/observer/truth.py --out "$D" --stages chain
run truth_decode ${TRUTH_S:-30} $PY bench/observer/truth.py --out "$D/decode" --stages decode
run signal ${SIGNAL_S:-40} $PY bench/observer/replay_signal.py --out "$D"
run graph_trace ${GT_S:-50} $PY bench/observer/replay_signal.py --out "$D/graph_trace" --stages graph_trace
run hf ${HF_S:-150} $PY bench/observer/hf_decode.py --out "$D"
echo "observer: total $((SECONDS - T0)) s"
