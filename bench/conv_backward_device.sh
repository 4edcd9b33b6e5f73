#!/bin/bash
# The implicit-GEMM backward on a lent GPU, from /work/main with this worktree copied to
# .wt-backward (see BRIEF): the gpu tests, then (with "bench") yolov4 3-class fp16 b32
# training pass before (DARKNET_IMPLICIT_BACKWARD=never: im2col + GEMM + col2im) and after (auto).
# Make the cfg here first: python3 bench/conv_backward_bench.py --make-cfg build/yolov4_3c.cfg
# Targets: tests net plans broad errors shapes shapes32 bench (PRECISION=, SWEEP= to skip the sweep).
ln -sfn $PWD/.shared shared && ln -sfn $PWD/.shared ../shared
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.wt-backward PYTHONUNBUFFERED=1
cd .wt-backward
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
for what in "$@"; do
  case $what in
  tests) timeout 200 python3 -m pytest -q -m gpu tests/test_conv_backward.py -x 2>&1 | tail -15 ;;
  broad) timeout 240 python3 -m pytest -q -m gpu tests/test_conv_backward.py tests/test_cuda_graphs.py \
           tests/test_cuda_fork.py tests/test_cuda_network.py tests/test_precision.py 2>&1 | tail -8 ;;
  net) timeout 200 python3 -m pytest -q -m gpu tests/test_cuda_network.py tests/test_precision.py \
         -k "training_step" -x 2>&1 | tail -8 ;;
  errors) timeout 100 python3 - <<'PY' 2>&1 | tail -12
import sys; sys.path.insert(0, "tests")
import numpy as np
import test_conv_backward as t
from darknet_py.backends.cuda_backend import CudaBackend
be = CudaBackend(0); be.implicit_conv_backward = "always"
for p in t.PRECISIONS:
    worst = {}
    for i, case in enumerate(t.CASES):
        a = t._arrays(case, 50 + i)
        for name, op in (("weight", lambda b, q: t._weight_grad(b, q, case, a)),
                         ("data", lambda b, q: t._data_grad(b, q, case, a, False))):
            ref = op(t.REF, "fp32")
            err = np.max(np.abs(op(be, p) - ref)) / np.max(np.abs(ref))
            worst[name] = max(worst.get(name, 0), err)
    print(p, "max |gpu - float64 numpy| / max |numpy| over the cases:", {k: f"{v:.2e}" for k, v in worst.items()})
PY
  ;;
  plans) timeout 60 python3 -m pytest -q -m gpu tests/test_conv_backward.py -k "plans or training_step" 2>&1 | tail -3 ;;
  shapes32) timeout 150 python3 bench/conv_backward_bench.py build/yolov4_3c.cfg --batch 32 \
            --precision fp32 2>&1 | tail -40 ;;
  shapes) timeout 250 python3 bench/conv_backward_bench.py build/yolov4_3c.cfg --batch 32 \
            --precision ${PRECISION:-fp16} ${SWEEP---sweep} --json $OUT/shapes.json 2>&1 | tail -40 ;;
  bench)
    for implicit in never auto; do
      DARKNET_IMPLICIT_BACKWARD=$implicit timeout 150 python3 -m darknet_py bench build/yolov4_3c.cfg \
        --batch 32 --train --layers --gpu 0 --precision ${PRECISION:-fp16} --repeats 10 \
        --json $OUT/bench_$implicit.json --overwrite > $OUT/bench_$implicit.txt 2>&1
      echo "implicit=$implicit rc=$?"; grep -iE "train|peak|backward|forward" $OUT/bench_$implicit.txt | head -8
    done ;;
  esac
done
