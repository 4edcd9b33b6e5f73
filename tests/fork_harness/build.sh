#!/bin/sh
# Build fork_train_step against an AlexeyAB darknet tree built for the CPU (GPU=0, AVX=0,
# OPENMP=0, the Makefile's -Ofast): build.sh DARKNET_DIR OUT_BINARY
set -e
D=${1:-/work/cbuild/darknet-ab}
OUT=${2:-/tmp/forktrain/fork_train_step}
mkdir -p "$(dirname "$OUT")"
OBJS=$(ls "$D"/obj/*.o | grep -v '/darknet.o$')
gcc -I"$D/include" -I"$D/src" -Ofast -Wall -Wno-unused-result \
    -c "$(dirname "$0")/fork_train_step.c" -o "$OUT.o"
g++ "$OUT.o" $OBJS -o "$OUT" -lm -pthread
gcc -I"$D/include" -I"$D/src" -Ofast -Wall -Wno-unused-result \
    -c "$(dirname "$0")/fork_detect.c" -o "$(dirname "$OUT")/fork_detect.o"
g++ "$(dirname "$OUT")/fork_detect.o" $OBJS -o "$(dirname "$OUT")/fork_detect" -lm -pthread
