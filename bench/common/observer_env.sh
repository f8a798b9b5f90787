# Sourced by bench/observer/gpu.sh and bench/observer/followup.sh once D (their output folder)
# exists: cupti-python and libcupti 13.4 from .whl/ when the image lacks them (as
# scripts/gpu_check.sh), PY, and `run NAME LIMIT_S CMD...`: one bench in a process of its own with
# its own time limit (a bench that fails or runs out of time leaves the others' results), its log
# in $D/NAME.log, the lines matching $SUMMARY echoed (the last $SUMMARY_LINES). The caller sets T0.
PY=${PYTHON:-python3}
if ! $PY -c "import cupti" >/dev/null 2>&1 && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >"$D/pip.txt" 2>&1 || { echo "wheel install failed"; tail -5 "$D/pip.txt"; }
  export PYTHONPATH="$PWD:/tmp/site"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
run() {  # name, limit_s, command...
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s)"
  timeout "$limit" "$@" > "$D/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - T0)) s"
  grep -E "$SUMMARY" "$D/$name.log" | tail -"${SUMMARY_LINES:-20}"
}
