#!/bin/bash
# Everything the GPU side of issues 26-28 asks for, in one call on a 4-GPU machine, the
# parts that need fewer GPUs side by side so the call stays short:
#   phase 1, in parallel:  GPU 0     `make gpu-test` (pytest -m gpu; 2-GPU tests skip here)
#                          GPU 1     bench/issue26_rows.py (issue 26's table + PyTorch twins)
#                          GPUs 2,3  bench/cluster_gpu_check.sh torchrun+signals, then the
#                                    2-GPU tests (tests/test_multigpu.py, test_nccl.py)
#   phase 2:               GPUs 0-3  bench/cluster_gpu_check.sh timing (1, 2, 4 GPUs)
# Logs and results.json go to $OUT (default /tmp/device-all); a summary is printed last.
#
#   bench/device_all.sh [YOLOV4_CFG]     (from the repository root, darknet-py importable)
set -u
OUT=${OUT:-/tmp/device-all}
mkdir -p "$OUT"
YOLOV4=${1:-../shared/darknet-cfg-ab/yolov4.cfg}
export PYTHONUNBUFFERED=1
T0=$(date +%s)
(CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -m gpu -p no:cacheprovider \
    > "$OUT/gpu-test.log" 2>&1; echo "rc=$?" >> "$OUT/gpu-test.log") &
(CUDA_VISIBLE_DEVICES=1 python3 bench/issue26_rows.py --json "$OUT/results.json" \
    --results "$OUT/rows.md" > "$OUT/rows.log" 2>&1) &
(CUDA_VISIBLE_DEVICES=2,3 PARTS="torchrun signals" bash bench/cluster_gpu_check.sh \
    "$YOLOV4" /tmp/cluster-a > "$OUT/cluster-a.log" 2>&1
 CUDA_VISIBLE_DEVICES=2,3 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_multigpu.py tests/test_nccl.py > "$OUT/multigpu-test.log" 2>&1
 echo "rc=$?" >> "$OUT/multigpu-test.log") &
wait
echo "phase 1: $(( $(date +%s) - T0 )) s"
PARTS=timing bash bench/cluster_gpu_check.sh "$YOLOV4" /tmp/cluster-b > "$OUT/cluster-b.log" 2>&1
echo "phase 2: $(( $(date +%s) - T0 )) s"
# Every log in one file: a call brings back only a few files.
tar czf "$OUT/logs.tgz" --exclude '*.weights' --exclude '*.backup' --exclude '*.jpg' \
    --exclude '*.png' --exclude '*.txt' -C / tmp/cluster-a tmp/cluster-b 2>/dev/null
echo "== gpu-test";      grep -E "^(FAILED|ERROR)" "$OUT/gpu-test.log" | head -20; tail -2 "$OUT/gpu-test.log"
echo "== 2-GPU tests";   tail -2 "$OUT/multigpu-test.log"
echo "== cluster";       tail -12 "$OUT/cluster-a.log"; tail -10 "$OUT/cluster-b.log"
echo "== issue 26 rows"; tail -16 "$OUT/rows.log"
