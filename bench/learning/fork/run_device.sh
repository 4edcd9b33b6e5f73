#!/bin/bash
# The fork learning check on a GPU machine: build the AlexeyAB fork (GPU=1 CUDNN=1, sm_90)
# from FORK_DIR, make the synthetic set, train the fork and darknet-py on CFG for its
# max_batches, score both with `detector map` / `darknet-py map`. Logs go to OUT_DIR.
# usage: run_device.sh FORK_DIR CFG OUT_DIR SEEDS...   (darknet-py on PYTHONPATH)
FORK=$(realpath "$1"); CFG=$(realpath "$2"); OUT=$(realpath "$3"); shift 3
HERE=$(dirname "$(realpath "$0")")
T0=$(date +%s)
stamp() { echo "$1 $(( $(date +%s) - T0 ))s" | tee -a "$OUT/times.txt"; }
# cuDNN comes with the device's PyTorch (nvidia/cudnn); the fork's Makefile looks for it
# in /usr/local/cudnn, so the compiler and linker are pointed at it instead.
CUDNN=$(python3 -c "import nvidia.cudnn as c; print(list(c.__path__)[0])")
mkdir -p /tmp/cudnnlib && ln -sf "$CUDNN"/lib/libcudnn.so.9 /tmp/cudnnlib/libcudnn.so
export CPATH="$CUDNN/include:$CPATH" LIBRARY_PATH="/tmp/cudnnlib:$CUDNN/lib:$LIBRARY_PATH"
export LD_LIBRARY_PATH="$CUDNN/lib:/tmp/cudnnlib:$LD_LIBRARY_PATH"
# A GPU build for this GPU only (the stock ARCH list has architectures CUDA 13 dropped).
sed -i -e 's/^GPU=0/GPU=1/' -e 's/^CUDNN=0/CUDNN=1/' "$FORK/Makefile"
ARCH="-gencode arch=compute_90,code=[sm_90,compute_90]"
# The fork's `all` also runs chmod +x *.sh, which fails in a tree without scripts.
(cd "$FORK" && mkdir -p obj backup results && touch none.sh && timeout 200 make -j16 \
    ARCH="$ARCH" > "$OUT/build.log" 2>&1); stamp "build rc=$?"
python3 "$HERE/make_set.py" /tmp/shapes 400 100 0; stamp "set"
cd /tmp/shapes && cp "$CFG" shapes.cfg
for seed in "$@"; do
    rm -f backup/*
    timeout 120 "$FORK/darknet" detector train shapes.data shapes.cfg -dont_show \
        > "$OUT/fork_train_$seed.log" 2>&1; stamp "fork train rc=$?"
    "$FORK/darknet" detector map shapes.data shapes.cfg backup/shapes_final.weights \
        -dont_show > "$OUT/fork_map_$seed.log" 2>&1; stamp "fork map"
    rm -f backup/*
    timeout 150 python3 -m darknet_py train shapes.cfg shapes.data --device cuda \
        --seed "$seed" --quiet > "$OUT/py_train_$seed.log" 2>&1; stamp "py train rc=$?"
    python3 -m darknet_py map shapes.cfg shapes.data backup/shapes_final.weights \
        --device cuda > "$OUT/py_map_$seed.log" 2>&1; stamp "py map"
    grep -h "mean average precision" "$OUT/fork_map_$seed.log" "$OUT/py_map_$seed.log"
done
