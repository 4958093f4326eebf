#!/usr/bin/env bash
# A real model's learning run in one call, for a GPU machine lent for a few minutes: a main job with
# --preset smollm2-gpu, three seeds sharing the one GPU, then seed 0's exported policy evaluated from its folder on
# the GPU (it must give back the run's greedy figures). What the results pages need comes back in
# $OUT/results.tar.gz (default OUT: outputs/gpu_learning; benchmarks/lent_gpu.sh): the job's console and log, every
# summary.json, each trial's progress.csv, params.json, machine.json and every validation state's outcome before and
# after RL (outcomes.json), seed 0's greedy episodes, and the evaluation. The models stay on the machine.
#
#   bash benchmarks/gpu_learning.sh sokoban       # at most 10 minutes on one H100/H200
#   bash benchmarks/gpu_learning.sh frozenlake
#
# JOB_FLAGS are added to the job's flags (they win), e.g. a dry run on a CPU:
#   JOB_FLAGS="--model tiny --num-gpus-per-learner 0 --num-gpus-per-env-runner 0 --autocast-dtype null \
#       --warm-start-precision float32 --iterations 2" EVAL_DEVICE=cpu bash benchmarks/gpu_learning.sh sokoban
set -u
cd "$(dirname "$0")/.."
case "${1:-}" in
    sokoban) job=tuned_examples/starpo_sokoban.py ;;
    frozenlake) job=tuned_examples/starpo_frozenlake.py ;;
    *) echo "usage: bash benchmarks/gpu_learning.sh sokoban|frozenlake" >&2; exit 2 ;;
esac
OUT=${OUT:-outputs/gpu_learning}
source benchmarks/lent_gpu.sh
# The run folder stays on the machine: three exported models and the warm start are over a gigabyte.
jobs_dir=${GPU_LEARNING_DIR:-/tmp/gpu_learning}
run_dir="$jobs_dir/smollm2_$1"
# Three trials on one GPU, a third of it each (the driver's sampler shares its trial's share), 4 minutes each, not
# the preset's 5: the job (Ray, warm start, trials, report: about 8 minutes) and the evaluation then fit one
# 10-minute call of a lent machine.
# shellcheck disable=SC2086  # JOB_FLAGS is a list of flags
run main_job 480 python "$job" --preset smollm2-gpu --seeds 0,1,2 --num-gpus-per-learner 0.33 --max-minutes 4 \
    --output-dir "$jobs_dir" --run-name "smollm2_$1" ${JOB_FLAGS:-}
cp "$run_dir/job.log" "$run_dir/summary.json" "$run_dir/run_config.json" "$WORK/" 2>/dev/null
for trial in "$run_dir"/seed*/; do
    mkdir -p "$WORK/$(basename "$trial")"
    cp "$trial"/summary.json "$trial"/progress.csv "$trial"/machine.json "$trial"/params.json \
        "$WORK/$(basename "$trial")/" 2>/dev/null
done
cp "$run_dir"/seed0/validation_before_greedy.parquet "$run_dir"/seed0/validation_greedy.parquet "$WORK/seed0/" \
    2>/dev/null
# Every validation state's outcome, by file (the episodes themselves are megabytes): pooled and paired figures
# over the seeds are computed from these.
python - "$run_dir" "$WORK" <<'PY' || status=1
import json, pathlib, sys
from rllib_ragen.jobs.outputs import read_outcomes
run, work = map(pathlib.Path, sys.argv[1:])
for folder in [*sorted(run.glob("seed*")), run / "baselines"]:
    if folder.is_dir():
        outcomes = {f.stem: read_outcomes(f) for f in sorted(folder.glob("*.parquet"))}
        (work / folder.name).mkdir(exist_ok=True)
        (work / folder.name / "outcomes.json").write_text(json.dumps(outcomes))
PY
pack
if [ -f "$run_dir/seed0/policy/config.json" ]; then
    # Greedy only (the figure the bar is on), to fit the call.
    run evaluate 100 python -m rllib_ragen.jobs.evaluate "$run_dir/seed0/policy" --device "${EVAL_DEVICE:-cuda}" \
        --modes greedy --output "$WORK/evaluate_seed0.json"
else
    echo "evaluate: skipped, seed0 exported no policy" | tee -a "$OUT/status.txt"
    status=1
fi
exit $status
