#!/bin/bash
# Issue 26's learning check on one GPU: yolov4-tiny (the fork's stock cfg via
# bench/learning/fork/make_cfg.py: 3 classes, 160x160, batch 32, ITERATIONS iterations) on the
# synthetic shapes set, trained in fp32, fp16 and bf16 with the same seeds, all at once; each
# final weights file is scored by `darknet-py map` in fp32, so the training alone differs.
# usage: bench/learning/precision.sh STOCK_YOLOV4_TINY_CFG OUT_DIR ITERATIONS SEEDS...
#   (darknet-py and PyCUDA on PYTHONPATH; DEVICE=cpu for a smoke run; writes OUT_DIR/summary.txt)
STOCK=$(realpath "$1"); OUT=$(realpath "$2"); ITERATIONS=$3; shift 3
HERE=$(dirname "$(realpath "$0")")
PRECISIONS=${PRECISIONS:-"fp32 fp16 bf16"}
SET=${SET:-/tmp/shapes-precision}
mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "$1 $(( $(date +%s) - T0 ))s" | tee -a "$OUT/times.txt"; }
python3 "$HERE/fork/make_set.py" "$SET" 1000 300 0 > /dev/null; stamp "set"
python3 "$HERE/fork/make_cfg.py" "$STOCK" "$SET/shapes.cfg" "$ITERATIONS"
cd "$SET" || exit 1
for seed in "$@"; do
    for p in $PRECISIONS; do
        run="${p}_$seed"
        mkdir -p "backup_$run"
        sed "s#^backup=.*#backup=$PWD/backup_$run#" shapes.data > "$run.data"
        (timeout 500 python3 -m darknet_py train shapes.cfg "$run.data" --device "${DEVICE:-cuda}" \
            --precision "$p" --seed "$seed" --quiet > "$OUT/train_$run.log" 2>&1
         stamp "train $run rc=$?") &
    done
done
wait
for seed in "$@"; do
    for p in $PRECISIONS; do
        run="${p}_$seed"
        python3 -m darknet_py map shapes.cfg shapes.data "backup_$run/shapes_final.weights" \
            --device "${DEVICE:-cuda}" --precision fp32 > "$OUT/map_$run.log" 2>&1 &
    done
done
wait; stamp "maps"
for seed in "$@"; do for p in $PRECISIONS; do
    echo "seed $seed $p: $(grep -h -o 'mean average precision (mAP@0.50) = [0-9.]*' \
        "$OUT/map_${p}_$seed.log" | tail -1 | awk '{print $NF}')"
done; done | tee "$OUT/summary.txt"
