#!/bin/bash
# The fork's GPU-build step fixtures (tests/fixtures/fork_train_gpu), on a GPU machine:
# build the AlexeyAB fork from FORK_SRC with GPU=1 CUDNN=1 (cuDNN from the machine's PyTorch,
# as bench/learning/fork/run_device.sh does) in BUILD_DIR, the harness against it, then
# make_fixtures.py with FORK_BUILD=gpu for CASES (default: all but adam and dropout).
# Case a5_train_yolov4tiny reads the shared fixture of that name under FIXTURES_AB (default
# ../shared/fixtures-ab beside the repository; the folder a5_train_yolov4tiny is all it needs).
# usage: [FIXTURES_AB=DIR] make_gpu_fixtures.sh FORK_SRC BUILD_DIR [CASE ...]
set -e
SRC=$(realpath "$1"); BUILD=$2; shift 2
HERE=$(dirname "$(realpath "$0")")
CUDNN=$(python3 -c "import nvidia.cudnn as c; print(list(c.__path__)[0])")
mkdir -p /tmp/cudnnlib && ln -sf "$CUDNN"/lib/libcudnn.so.9 /tmp/cudnnlib/libcudnn.so
export CPATH="$CUDNN/include:$CPATH" LIBRARY_PATH="/tmp/cudnnlib:$CUDNN/lib:$LIBRARY_PATH"
export LD_LIBRARY_PATH="$CUDNN/lib:/tmp/cudnnlib:$LD_LIBRARY_PATH"
if [ ! -x "$BUILD/darknet" ]; then
    mkdir -p "$BUILD" && cp -r "$SRC"/. "$BUILD"/
    sed -i -e 's/^GPU=0/GPU=1/' -e 's/^CUDNN=0/CUDNN=1/' "$BUILD/Makefile"
    (cd "$BUILD" && mkdir -p obj backup results && touch none.sh && make -j16 \
        ARCH="-gencode arch=compute_90,code=[sm_90,compute_90]" > build.log 2>&1) \
        || { tail -20 "$BUILD/build.log"; exit 1; }
fi
sh "$HERE/build.sh" "$BUILD" "$BUILD/harness/fork_train_step"
mkdir -p /tmp/forktrain
CASES=${*:-$(python3 -c "import sys; sys.path.insert(0, '$HERE'); import make_fixtures as m; \
print(' '.join(c for c in m.CASES if c not in ('adam', 'dropout')))")}
FORK_BUILD=gpu python3 "$HERE/make_fixtures.py" "$BUILD/harness/fork_train_step" $CASES
