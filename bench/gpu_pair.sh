#!/usr/bin/env bash
# On a two-GPU machine: two shell jobs at once, one per GPU (CUDA_VISIBLE_DEVICES), each with its
# own $OUT folder; then everything is packed into $OUT/results.tgz (the device returns few files).
#   bash bench/gpu_pair.sh 1.6.1 'S=bench/gpu_suite.sh; FILES=tests/test_backend.py bash $S 1.6.1 tests' \
#                                'bash bench/gpu_suite.sh 1.6.1 bench --parts models --tag b'
# Each job gets LIMIT_S seconds (default 520); a job that runs over keeps what it saved.
set -uo pipefail
ver=$1
out=${OUT:-/tmp/out}
bash bench/gpu_suite.sh "$ver" none || exit 1  # installs TensorRT-RTX $ver once, before the jobs
for gpu in 0 1; do
  job=${2}; [ $gpu = 1 ] && job=${3}
  mkdir -p "$out/gpu$gpu"
  CUDA_VISIBLE_DEVICES=$gpu OUT=$out/gpu$gpu timeout "${LIMIT_S:-520}" bash -c "$job" > "$out/gpu$gpu/job.log" 2>&1 &
done
wait
for gpu in 0 1; do echo "===== gpu$gpu"; grep -v Warning "$out/gpu$gpu/job.log" | tail -40; done
tar czf "$out/results.tgz" -C "$out" gpu0 gpu1 && rm -rf "$out/gpu0" "$out/gpu1"
