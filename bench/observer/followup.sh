#!/usr/bin/env bash
# OUT=DIR bash bench/observer/followup.sh   (on a CUDA machine, from the repo root, as gpu.sh;
# RESIDUE_S, TRUTH_S, GT_S, HF_S: time limits). The follow-up of observer-h200-call1 in one device
# call: does a graph captured after kernel tracing was on run slower untraced
# (bench/observer/trace_residue.py); decode_server's ground truth on a graph captured before any
# tracing (truth.py --stages decode, in a process of its own); GRAPH_TRACE's cost without switching
# it off and on (replay_signal.py --stages graph_trace, in a process of its own); HF's replays timed
# untraced by GRAPH_TRACE and traced by CUPTI, the same instances (hf_decode.py --gt-first).
# Everything lands under $OUT/observer2; bench/observer/followup.py analyses it on a CPU.
set -u
case "${1:-}" in -h|--help) sed -n '2,/^set -u/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac  # the comment above
OUT=${OUT:-gpu-out}
D="$OUT/observer2"
mkdir -p "$D/truth-pristine"
SUMMARY='^(==|!!)|->|cost |hf truth|gt_|: .* us \(' SUMMARY_LINES=20
. bench/common/observer_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader > "$D/gpu.txt" 2>&1
T0=$SECONDS
run residue ${RESIDUE_S:-50} $PY bench/observer/trace_residue.py --out "$D"
run truth_pristine ${TRUTH_S:-45} $PY bench/observer/truth.py --out "$D/truth-pristine" --stages decode
run graph_trace ${GT_S:-60} $PY bench/observer/replay_signal.py --out "$D" --stages graph_trace
run hf_gt ${HF_S:-120} $PY bench/observer/hf_decode.py --out "$D" --gt-first --stages warm,gt_only,truth
echo "observer2: total $((SECONDS - T0)) s"
