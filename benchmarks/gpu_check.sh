#!/usr/bin/env bash
# Every GPU check of the speed work in one call, for a GPU machine lent for a few minutes, the figures first: the
# Sokoban iteration before/after (benchmarks/gpu.py), the weight sync (benchmarks/weight_sync.py), the GPU tests,
# then the Sokoban main job itself for a few iterations (warm start and validation included). Each step has its own
# time limit, and a failing step does not stop the others; the script exits non-zero if any failed. Everything
# comes back in $OUT/results.tar.gz (default OUT: outputs/gpu_check), one line per step in $OUT/status.txt
# (benchmarks/lent_gpu.sh).
#
#   bash benchmarks/gpu_check.sh            # about 8 minutes on one H100/H200 with SmolLM2
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-outputs/gpu_check}
source benchmarks/lent_gpu.sh
# A GPU machine without a package index may lack pytest: pure-Python wheels carried beside the pack (e.g.
# .device/3/pytest-*.whl, pluggy, iniconfig) are unpacked onto the path.
if ! python -c "import pytest" 2>/dev/null && ls .device/*/*.whl >/dev/null 2>&1; then
    mkdir -p /tmp/gpu_check_wheels
    for wheel in .device/*/*.whl; do python -m zipfile -e "$wheel" /tmp/gpu_check_wheels; done
    export PYTHONPATH="/tmp/gpu_check_wheels:$PYTHONPATH"
fi
run gpu_benchmark 240 python benchmarks/gpu.py --iterations 3 --json "$WORK/gpu.json"
run weight_sync 60 python benchmarks/weight_sync.py --repeats 5
run gpu_tests 150 python -m pytest -q -m gpu -s -p no:cacheprovider tests/test_gpu.py
# The job as a user runs it on one GPU (its folder outside $OUT: the exported model is large); its log comes back.
job_dir=${GPU_CHECK_JOB_DIR:-/tmp/gpu_check_job}
run main_job 200 python tuned_examples/starpo_sokoban.py --model smollm2-135m --num-gpus-per-learner 1 \
    --num-gpus-per-env-runner 1 --autocast-dtype '"bfloat16"' --warm-start-precision bfloat16 --iterations 3 \
    --output-dir "$job_dir" --run-name gpu_check --verbose
cp "$job_dir"/gpu_check/job.log "$job_dir"/gpu_check/summary.json "$job_dir"/gpu_check/seed0/progress.csv "$WORK/" \
    2>/dev/null
pack
exit $status
