#!/usr/bin/env bash
# Every GPU check of the speed work in one call, for a GPU machine lent for a few minutes: the GPU tests, the
# Sokoban iteration before/after (benchmarks/gpu.py) and the weight sync (benchmarks/weight_sync.py). Each step has
# its own time limit and log under $OUT (default: outputs/gpu_check), and a failing step does not stop the others;
# the script exits non-zero if any failed.
#
#   bash benchmarks/gpu_check.sh            # about 4-5 minutes on one H100/H200 with SmolLM2
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-outputs/gpu_check}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
status=0
run() {  # run NAME SECONDS COMMAND...: its output to $OUT/NAME.log, its exit code in $OUT/NAME.rc
    local name=$1 seconds=$2
    shift 2
    echo "== $name (limit ${seconds}s): $*"
    timeout "$seconds" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$rc" > "$OUT/$name.rc"
    tail -n 25 "$OUT/$name.log"
    [ "$rc" -eq 0 ] || status=1
}
run gpu_tests 150 python -m pytest -q -m gpu -s -p no:cacheprovider tests/test_gpu.py
run gpu_benchmark 240 python benchmarks/gpu.py --iterations 3 --json "$OUT/gpu.json"
run weight_sync 60 python benchmarks/weight_sync.py --repeats 5
exit $status
