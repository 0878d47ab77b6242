#!/usr/bin/env bash
# On the GPU machine: every gpu-marked test file in its own process (a crash loses one file, not
# the run), or the benchmark. Logs and results go to $OUT (few files: the device returns at most 8).
#   bash bench/gpu_suite.sh 1.6.1 tests        # GPU tests
#   bash bench/gpu_suite.sh 1.6.1 bench ARGS   # benchmark with ARGS
set -uo pipefail
ver=$1; what=$2; shift 2
out=${OUT:-/tmp/out}
mkdir -p "$out"
bash .device/install.sh "$ver" /tmp/site >/dev/null || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 RTX_BACKEND_DYNAMIC_JSON=$out/dynamic.jsonl
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
if [ "$what" = tests ]; then
  python3 -m rtx_backend info > "$out/info.txt" 2>&1
  for f in $(grep -l "mark.gpu" tests/test_*.py); do
    timeout "${PER_FILE:-240}" python3 -m pytest -m gpu -q -s -p no:cacheprovider -rfEs "$f" > /tmp/one.log 2>&1
    rc=$?
    { echo "===== $f rc=$rc"; cat /tmp/one.log; } >> "$out/gpu-tests.log"
    echo "$f rc=$rc $(grep -E '(passed|failed|error|skipped)' /tmp/one.log | tail -1)" | tee -a "$out/summary.txt"
  done
else
  python3 bench/bench.py --out "$out" "$@" 2>&1 | tee "$out/bench.log" | grep -v Warning | tail -40
fi
