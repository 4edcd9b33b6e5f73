#!/bin/sh
# Build fork_train_step (and fork_detect) against an AlexeyAB darknet tree built with its
# Makefile: for the CPU (GPU=0, AVX=0, OPENMP=0, the Makefile's -Ofast), or for the GPU
# (GPU=1 CUDNN=1: then the harness dumps the GPU build's step; CUDA under $CUDA_HOME or
# /usr/local/cuda, cuDNN on the compiler's and linker's paths).
# usage: build.sh DARKNET_DIR OUT_BINARY
set -e
D=${1:-/work/cbuild/darknet-ab}
OUT=${2:-/tmp/forktrain/fork_train_step}
mkdir -p "$(dirname "$OUT")"
OBJS=$(ls "$D"/obj/*.o | grep -v '/darknet.o$')
FLAGS="" LIBS=""
if [ -f "$D/obj/convolutional_kernels.o" ]; then
    CUDA=${CUDA_HOME:-/usr/local/cuda}
    FLAGS="-DGPU -DCUDNN -I$CUDA/include"
    LIBS="-L$CUDA/lib64 -lcuda -lcudart -lcublas -lcurand -lcudnn -lstdc++"
fi
gcc -I"$D/include" -I"$D/src" $FLAGS -Ofast -Wall -Wno-unused-result \
    -c "$(dirname "$0")/fork_train_step.c" -o "$OUT.o"
g++ "$OUT.o" $OBJS -o "$OUT" -lm -pthread $LIBS
gcc -I"$D/include" -I"$D/src" $FLAGS -Ofast -Wall -Wno-unused-result \
    -c "$(dirname "$0")/fork_detect.c" -o "$(dirname "$OUT")/fork_detect.o"
g++ "$(dirname "$OUT")/fork_detect.o" $OBJS -o "$(dirname "$OUT")/fork_detect" -lm -pthread $LIBS
