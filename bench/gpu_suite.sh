#!/usr/bin/env bash
# On the GPU machine: every gpu-marked test file in its own process (a crash loses one file, not
# the run; JOBS files at a time), the cross-check of the benchmark models, or the benchmark.
# Logs and results go to $OUT (few files: the device returns at most 8).
#   bash bench/gpu_suite.sh 1.6.1 tests          # GPU tests (JOBS=4 runs four files at once)
#   bash bench/gpu_suite.sh 1.6.1 crosscheck     # three-way cross-check of the benchmark models
#   bash bench/gpu_suite.sh 1.6.1 bench ARGS     # benchmark with ARGS
#   bash bench/gpu_suite.sh 1.6.1 refit ARGS     # refit against cold build (bench/refit.py)
set -uo pipefail
ver=$1; what=$2; shift 2
out=${OUT:-/tmp/out}
mkdir -p "$out"
site=/tmp/site-$ver  # one per version: a warm machine may run both
if [ ! -d "$site/tensorrt_rtx" ]; then
  bash .device/install.sh "$ver" "$site" >/dev/null || exit 1
  PYTHONPATH=$site python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
fi
export PYTHONPATH=$site PYTHONUNBUFFERED=1 RTX_BACKEND_DYNAMIC_JSON=$out/dynamic.jsonl
case "$what" in
tests)
  python3 -m rtx_backend info > "$out/info.txt" 2>&1
  logs=$(mktemp -d)
  # FILES: a subset; the memory test measures the whole GPU's memory, so it runs alone, last
  files=$(grep -l "mark.gpu" ${FILES:-$(find tests -name "test_*.py" | sort)})
  run_file='log='"$logs"'/$(basename {} .py).log; timeout '"${PER_FILE:-300}"' python3 -m pytest -m gpu -q -s \
    -p no:cacheprovider -o faulthandler_timeout='"${HANG_S:-150}"' -rfEs {} > $log 2>&1; \
    echo "{} rc=$? $(grep -E "(passed|failed|error|skipped)" $log | tail -1)"'
  echo "$files" | grep -v reliability_memory | xargs -P "${JOBS:-1}" -I{} sh -c "$run_file" | sort | tee "$out/summary.txt"
  echo "$files" | grep reliability_memory | xargs -I{} sh -c "$run_file" | tee -a "$out/summary.txt"
  for f in "$logs"/*.log; do echo "===== $f"; cat "$f"; done > "$out/gpu-tests.log"
  ;;
crosscheck)
  python3 bench/crosscheck_models.py --out "$out" "$@" > "$out/crosscheck.log" 2>&1
  echo "crosscheck rc=$?"; tail -40 "$out/crosscheck.md"
  ;;
refit)
  python3 bench/refit.py --out "$out" "$@" 2>&1 | tee "$out/refit.log" | grep -v Warning | tail -30
  ;;
bench)
  python3 bench/bench.py --out "$out" "$@" 2>&1 | tee "$out/bench.log" | grep -v Warning | tail -60
  ;;
esac
