#!/bin/bash
# Issue 27's original-flavour learning check on one GPU: pjreddie/darknet built with GPU=1
# (no cuDNN) against darknet-py's original flavour, yolov3-tiny adapted to the synthetic
# 3-shape set of ../fork/make_set.py (the fork race's set), one run of each per
# seed, all at once; every final weights file is scored by `darknet-py map` (pjreddie has
# no `detector map`). pjreddie's darknet takes no seed (it seeds itself with time(0)): its
# runs differ by its own randomness, SEED only names them.
# usage: run_device.sh PJREDDIE_SRC OUT_DIR ITERATIONS SEEDS...
#   PJREDDIE_SRC: pjreddie/darknet's sources (git archive); built in a copy under /tmp,
#   which is patched for CUDA 13 there. darknet-py on PYTHONPATH; logs go to OUT_DIR.
SRC=$(realpath "$1"); OUT=$(realpath "$2"); ITERATIONS=$3; shift 3
HERE=$(dirname "$(realpath "$0")")
T0=$(date +%s)
stamp() { echo "$1 $(( $(date +%s) - T0 ))s" | tee -a "$OUT/times.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
BUILD=/tmp/pjreddie-build
rm -rf "$BUILD" && cp -r "$SRC" "$BUILD"
# CUDA 13 builds neither the stock ARCH list (sm_30..sm_52) nor cudaThreadSynchronize
# (removed; cudaDeviceSynchronize is its successor). Only the build copy is patched.
sed -i -e 's/^GPU=0/GPU=1/' "$BUILD/Makefile"
sed -i 's/cudaThreadSynchronize/cudaDeviceSynchronize/' "$BUILD/src/gemm.c"
ARCH="-gencode arch=compute_90,code=[sm_90,compute_90]"
(cd "$BUILD" && mkdir -p obj backup results && timeout 200 make -j16 ARCH="$ARCH" \
    > "$OUT/build.log" 2>&1); stamp "build rc=$?"
[ -x "$BUILD/darknet" ] || { tail -20 "$OUT/build.log"; exit 1; }
# Its own folder, emptied first: the fork race (race.sh) leaves runs in /tmp/shapes on a warm
# machine, whose weights darknet-py rightly refuses to replace.
SET=/tmp/shapes-original
rm -rf "$SET" && python3 "$HERE/../fork/make_set.py" "$SET" 400 100 0 > /dev/null
stamp "set"
cd "$SET"
# yolov3-tiny for 3 classes at 160x160 (make_cfg.py) without `mosaic`, a fork key that
# pjreddie's parser only reports as unused: both programs read the same cfg.
python3 "$HERE/../fork/make_cfg.py" "$BUILD/cfg/yolov3-tiny.cfg" shapes.cfg \
    "$ITERATIONS" && sed -i '/^mosaic=/d' shapes.cfg && cp shapes.cfg "$OUT/"
for seed in "$@"; do
    for who in pjreddie py; do
        mkdir -p "backup_${who}_$seed"
        sed "s#^backup=.*#backup=$PWD/backup_${who}_$seed#" shapes.data > "${who}_$seed.data"
    done
    (timeout 330 "$BUILD/darknet" detector train "pjreddie_$seed.data" shapes.cfg \
        > "$OUT/pjreddie_train_$seed.log" 2>&1; stamp "pjreddie train $seed rc=$?") &
    (timeout 330 python3 -m darknet_py train shapes.cfg "py_$seed.data" --device cuda \
        --darknet original --seed "$seed" --quiet --workers 4 \
        > "$OUT/py_train_$seed.log" 2>&1; stamp "py train $seed rc=$?") &
done
wait
score() {   # WHO SEED: the common scorer on that run's final weights (else its last backup)
    local w="backup_$1_$2/shapes_final.weights"
    [ -f "$w" ] || w="backup_$1_$2/shapes.backup"
    echo "$w" > "$OUT/map_of_$1_$2.log"
    python3 -m darknet_py map shapes.cfg shapes.data "$w" --device cuda --darknet original \
        >> "$OUT/map_of_$1_$2.log" 2>&1
}
for seed in "$@"; do for who in pjreddie py; do score "$who" "$seed" & done; done
wait; stamp "maps"
python3 "$HERE/loss_curves.py" "$OUT" "$@" | tee "$OUT/summary.txt"
