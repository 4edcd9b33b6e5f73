#!/usr/bin/env bash
# `make gpu-test`: the GPU tests (pytest -m gpu). With GPU_TEST_JOBS=N (N > 1) the test files
# are dealt round-robin to N pytest processes sharing the GPU (about 4x faster on an H100
# with 4), and the files that need the GPU's memory to themselves run alone afterwards.
# Every process's summary line is printed; the exit code is nonzero if any failed.
set -u
PYTHON=${GPU_PYTHON:-python3}
JOBS=${GPU_TEST_JOBS:-1}
# Builds a wheel and runs a whole network from it: with other processes on the card it can
# run out of GPU memory.
ALONE="tests/test_wheel_gpu.py"
if [ "$JOBS" -le 1 ]; then
    exec "$PYTHON" -m pytest -q -m gpu "$@"
fi
logs=$(mktemp -d)
files=$(ls tests/test_*.py | grep -v -x -F "$ALONE")
status=0
pids=()
for ((i = 0; i < JOBS; i++)); do
    part=$(echo "$files" | awk -v n="$JOBS" -v k="$i" 'NR % n == k')
    "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider "$@" $part >"$logs/part$i.log" 2>&1 &
    pids+=($!)
done
for pid in "${pids[@]}"; do
    wait "$pid" || status=1
done
"$PYTHON" -m pytest -q -m gpu -p no:cacheprovider "$@" $ALONE >"$logs/alone.log" 2>&1 || status=1
for log in "$logs"/*.log; do
    echo "== $(basename "$log" .log): $(grep -E '^(=+ )?[0-9]+ (passed|failed|error|skipped)' "$log" | tail -1)"
    grep -E '^(FAILED|ERROR) ' "$log"
done
echo "logs: $logs"
exit $status
