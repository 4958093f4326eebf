# Sourced by the scripts a lent GPU machine runs (gpu_check.sh, gpu_learning.sh): steps with their own time limits,
# whose logs survive the call. Such a machine sends back at most 8 files from $OUT, so every step's log, exit code and
# files go to a work folder, packed into $OUT/results.tar.gz after each step (a call cut short still returns what
# finished), with one line per step in $OUT/status.txt. Read them with: tar xzf results.tar.gz
OUT=${OUT:-outputs/gpu}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/lent_gpu.XXXXXX)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$WORK/gpu.txt" 2>&1
: > "$OUT/status.txt"
status=0

pack() {  # the work folder into $OUT/results.tar.gz, written whole or not at all
    tar czf "$OUT/results.tar.gz.part" -C "$WORK" . && mv "$OUT/results.tar.gz.part" "$OUT/results.tar.gz"
}

run() {  # run NAME SECONDS COMMAND...: its output to NAME.log, its exit code to status.txt; then pack
    local name=$1 seconds=$2
    shift 2
    echo "== $name (limit ${seconds}s): $*"
    local start=$SECONDS
    timeout "$seconds" "$@" > "$WORK/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc after $((SECONDS - start)) s" | tee -a "$OUT/status.txt"
    tail -n 25 "$WORK/$name.log"
    [ "$rc" -eq 0 ] || status=1
    pack
}
