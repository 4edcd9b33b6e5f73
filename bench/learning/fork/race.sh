#!/bin/bash
# Issue 27's learning race on one GPU: the fork's GPU build against darknet-py's default fork
# flavour (which follows that build), one run of each per seed, all at once; every final
# weights file is scored by both `darknet detector map` and `darknet-py map`.
# usage: race.sh FORK_BUILD_DIR CFG OUT_DIR SEEDS...
#   FORK_BUILD_DIR: the fork built with GPU=1 CUDNN=1 (tests/fork_harness/make_gpu_fixtures.sh
#   leaves one), cuDNN on LD_LIBRARY_PATH; darknet-py on PYTHONPATH. The fork takes no seed:
#   its runs differ by its own randomness.
FORK=$(realpath "$1"); CFG=$(realpath "$2"); OUT=$(realpath "$3"); shift 3
HERE=$(dirname "$(realpath "$0")")
T0=$(date +%s)
stamp() { echo "$1 $(( $(date +%s) - T0 ))s" | tee -a "$OUT/times.txt"; }
python3 "$HERE/make_set.py" /tmp/shapes 400 100 0 > /dev/null; stamp "set"
cd /tmp/shapes && cp "$CFG" shapes.cfg
for seed in "$@"; do
    for who in fork py; do
        mkdir -p "backup_${who}_$seed"
        sed "s#^backup=.*#backup=$PWD/backup_${who}_$seed#" shapes.data > "${who}_$seed.data"
    done
    (timeout 250 "$FORK/darknet" detector train "fork_$seed.data" shapes.cfg -dont_show \
        > "$OUT/fork_train_$seed.log" 2>&1; stamp "fork train $seed rc=$?") &
    (timeout 250 python3 -m darknet_py train shapes.cfg "py_$seed.data" --device cuda \
        --seed "$seed" --quiet > "$OUT/py_train_$seed.log" 2>&1; stamp "py train $seed rc=$?") &
done
wait
score() {   # WHO SEED: both scorers on that run's final weights
    local w="backup_$1_$2/shapes_final.weights"
    "$FORK/darknet" detector map shapes.data shapes.cfg "$w" -dont_show \
        > "$OUT/map_by_fork_of_$1_$2.log" 2>&1
    python3 -m darknet_py map shapes.cfg shapes.data "$w" --device cuda \
        > "$OUT/map_by_py_of_$1_$2.log" 2>&1
}
for seed in "$@"; do for who in fork py; do score "$who" "$seed" & done; done
wait; stamp "maps"
for seed in "$@"; do for who in fork py; do
    for by in fork py; do
        echo "run $who seed $seed, scored by $by: $(grep -h -o 'mean average precision (mAP@0.50) = [0-9.]*' \
            "$OUT/map_by_${by}_of_${who}_$seed.log" | tail -1)"
    done
done; done | tee "$OUT/summary.txt"
