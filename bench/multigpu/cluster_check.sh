#!/bin/bash
# Issue 28's cluster checks on a GPU machine (2 GPUs; 4 for the 4-GPU figure), printing a
# short table. Run from the repository root with darknet-py importable (PYTHONPATH=. or
# installed), PyCUDA and NCCL present; nothing here needs the network.
#
#   bench/multigpu/cluster_check.sh [YOLOV4_CFG [WORK_DIR]]
#
#   YOLOV4_CFG  the AlexeyAB fork's stock yolov4.cfg [default: ../shared/darknet-cfg-ab/
#               yolov4.cfg]; made into 3 classes at 416x416, 64 images per GPU per
#               iteration in 2 passes of 32, random=0. Only the timing part needs it.
#   WORK_DIR    scratch space [default: /tmp/cluster-gpu-check]; removed and made again.
#   PARTS       environment: which parts run [default: "torchrun signals timing"].
#   ITERATIONS  iterations of the timed runs [default: 30].
#   COUNTS      the GPU counts the timing part runs [default: "1 2 4", those present].
#   CPU_DRY_RUN=1  check this script on a machine without GPUs: CPU ranks (--ranks N,
#               --device cpu) stand in for the GPUs, the small detector for yolov4 (the
#               figures mean nothing; every check must still pass).
#
# Parts:
#   torchrun  the reference run twice (the same weights: GPU training is deterministic), then
#             two processes with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
#             MASTER_ADDR=127.0.0.1, MASTER_PORT) train a small detector on GPUs 0 and 1
#             and must give the weights `train --gpus 0,1` gives (same seed); with the
#             torchrun command installed, the same once more under torchrun itself.
#   signals   a `train --gpus 0,1` run in its own process group gets SIGTERM to the group
#             (as timeout/scancel send): exit 143, one complete backup that loads, one
#             "Terminated (SIGTERM)" line, no process left; then Ctrl-C twice 50 ms apart
#             (exit 130, a backup, no traceback), then SIGUSR1 (a backup, training goes on
#             to the end, exit 0).
#   timing    whole-process images/s (process start to exit, ITERATIONS x 64 x GPUs
#             images) of yolov4 on 1 GPU (`--gpu 0`, one process) and on 2 and 4 GPUs
#             (`--gpus`), after one warm-up run that fills the kernel cache; the steady
#             images/s is the mean of the log's last 10 iteration lines.
set -u
ROOT=$(pwd)
PY=${PYTHON:-python3}
YOLOV4=$(realpath "${1:-../shared/darknet-cfg-ab/yolov4.cfg}" 2>/dev/null || echo "")
WORK=${2:-/tmp/cluster-gpu-check}
PARTS=${PARTS:-torchrun signals timing}
ITERATIONS=${ITERATIONS:-30}
COUNTS=${COUNTS:-1 2 4}
RESULTS=()            # lines of the table
FAILED=0

[ -d "$ROOT/darknet_py" ] || { echo "run from the repository root"; exit 2; }
GPUS=$($PY -c "from darknet_py.backends import cuda_device_count as c; print(c())")
DRY=${CPU_DRY_RUN:-0}
[ "$DRY" = 1 ] && GPUS=4
on_gpus() {   # on_gpus N: the options of a run on GPUs 0..N-1 (one process for N=1)
    if [ "$DRY" = 1 ]; then
        [ "$1" = 1 ] && echo "--device cpu" || echo "--ranks $1"
    else
        [ "$1" = 1 ] && echo "--gpu 0" || echo "--gpus $(seq -s, 0 $(($1 - 1)))"
    fi
}
ENV_DEVICE=""; [ "$DRY" = 1 ] && ENV_DEVICE="--device cpu"
echo "GPUs: $GPUS ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
rm -rf "$WORK" && mkdir -p "$WORK"
$PY bench/learning/fork/make_set.py "$WORK/shapes" 256 16 0 || exit 1
calc() { awk "BEGIN {printf \"%.${2:-1}f\", $1}"; }   # calc EXPR [DECIMALS]
free_port() { $PY -c "from darknet_py.distributed.comm import free_port; print(free_port())"; }
record() {   # record NAME OK DETAIL
    RESULTS+=("$(printf '%-44s %-5s %s' "$1" "$2" "$3")")
    [ "$2" = ok ] || [ "$2" = skip ] || FAILED=1
}
data_file() {   # data_file NAME: a .data file of the shapes set with its own backup dir
    mkdir -p "$WORK/$1"
    sed "s|^backup=.*|backup=$WORK/$1/|" "$WORK/shapes/shapes.data" > "$WORK/$1.data"
    echo "$WORK/$1.data"
}
# The small detector of the functional checks: yolov3-tiny's layout, 3 classes, 160x160.
SMALL=$WORK/small.cfg
sed -e 's/^batch=.*/batch=16/' -e 's/^subdivisions=.*/subdivisions=1/' \
    -e 's/^width=.*/width=160/' -e 's/^height=.*/height=160/' \
    -e 's/^burn_in=.*/burn_in=0/' -e 's/^random=.*/random=0/' \
    cfg/yolov3-tiny-3class.cfg > "$SMALL"
[ "$DRY" = 1 ] && sed -i -e 's/^batch=.*/batch=4/' -e 's/^width=.*/width=64/' \
    -e 's/^height=.*/height=64/' "$SMALL"
USR1_RUN=200; [ "$DRY" = 1 ] && USR1_RUN=15

same_weights() {   # same_weights A B: "ok" when A and B hold the same floats (rtol 1e-4)
    $PY - "$1" "$2" <<'EOF'
import sys
import numpy as np
from darknet_py.weights import read_header
def floats(path):
    with open(path, "rb") as f:
        _, seen, _, offset = read_header(f, path)
    return seen, np.fromfile(path, dtype="<f4", offset=offset)
(sa, a), (sb, b) = floats(sys.argv[1]), floats(sys.argv[2])
close = sa == sb and a.shape == b.shape and np.allclose(a, b, rtol=1e-4, atol=1e-5)
print("ok" if close else f"FAIL seen {sa}/{sb}, max diff {np.abs(a - b).max() if a.shape == b.shape else 'shapes differ'}")
EOF
}

part_torchrun() {
    local ref port out
    ref=$(data_file gpus)
    $PY -m darknet_py train "$SMALL" "$ref" $(on_gpus 2) --seed 3 --max-batches 20 \
        --quiet > "$WORK/gpus.log" 2>&1
    record "train on 2 GPUs (reference)" "$([ $? = 0 ] && echo ok || echo FAIL)" "$WORK/gpus.log"
    # Same seed again: training on the GPUs is deterministic (no atomics in any sum).
    $PY -m darknet_py train "$SMALL" "$(data_file again)" $(on_gpus 2) --seed 3 \
        --max-batches 20 --quiet > "$WORK/again.log" 2>&1
    out=$(same_weights "$WORK/gpus/small_final.weights" "$WORK/again/small_final.weights")
    record "2 GPUs twice, same seed: same weights" "$([ "$out" = ok ] && echo ok || echo FAIL)" \
        "$out ($WORK/again.log)"
    port=$(free_port)
    local data pids=()
    data=$(data_file env)
    for r in 1 0; do
        RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            $PY -m darknet_py train "$SMALL" "$data" --seed 3 --max-batches 20 \
            --quiet $ENV_DEVICE > "$WORK/env$r.log" 2>&1 &
        pids+=($!)
    done
    wait "${pids[0]}"; local rc1=$?; wait "${pids[1]}"; local rc0=$?
    out=$(same_weights "$WORK/gpus/small_final.weights" "$WORK/env/small_final.weights")
    record "2 processes, torchrun variables, 2 GPUs" \
        "$([ $rc0$rc1 = 00 ] && [ "$out" = ok ] && echo ok || echo FAIL)" \
        "exit $rc0/$rc1, weights vs the reference: $out; $(grep -h -o '[a-z:0-9]*, local rank [0-9], from the [a-z]* environment' "$WORK"/env?.log | tr '\n' ' ')"
    if command -v torchrun > /dev/null && [ "$DRY" = 0 ]; then
        port=$(free_port)
        torchrun --nnodes=1 --nproc-per-node=2 --master-addr=127.0.0.1 --master-port=$port \
            -m darknet_py train "$SMALL" "$(data_file torchrun)" --seed 3 --max-batches 20 \
            --quiet > "$WORK/torchrun.log" 2>&1
        local rc=$?
        out=$(same_weights "$WORK/gpus/small_final.weights" "$WORK/torchrun/small_final.weights")
        record "torchrun --nproc-per-node=2 -m darknet_py" \
            "$([ $rc = 0 ] && [ "$out" = ok ] && echo ok || echo FAIL)" \
            "exit $rc, weights: $out ($WORK/torchrun.log)"
    else
        record "torchrun --nproc-per-node=2 -m darknet_py" skip "no torchrun command"
    fi
}

signal_run() {   # signal_run NAME SIGNAL TIMES EXPECTED_RC MAX_BATCHES: one --gpus 0,1 run
    local name=$1 sig=$2 times=$3 want=$4 max=$5 data pid rc log backup
    data=$(data_file "$name")
    log=$WORK/$name.log
    # setsid: its own process group, as a shell job gets; the pid is the group's id.
    setsid $PY -m darknet_py train "$SMALL" "$data" $(on_gpus 2) --max-batches "$max" \
        --quiet > "$log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do grep -q '^5: ' "$log" 2>/dev/null && break; sleep 0.2; done
    for i in $(seq "$times"); do kill -s "$sig" -- "-$pid"; sleep 0.05; done
    wait "$pid"; rc=$?
    local left
    for _ in $(seq 50); do   # loader workers notice their parent's end within a second
        left=$(pgrep -g "$pid" | wc -l); [ "$left" = 0 ] && break; sleep 0.1
    done
    backup=$WORK/$name/small.backup
    local loads; loads=$($PY -c "
import darknet_py as dn
net = dn.load_network('$SMALL', '$backup', device='cpu'); print('loads, seen', net.seen)" 2>&1 | tail -1)
    local lines; lines=$(grep -c "(SIG$sig) at iteration\|^SIG$sig at iteration" "$log")
    local trace; trace=$(grep -c "Traceback\|Aborted\|KeyboardInterrupt" "$log")
    local ok=ok
    { [ "$rc" = "$want" ] && [ "$left" = 0 ] && [ "$lines" = 1 ] && [ "$trace" = 0 ] &&
      [[ "$loads" == loads* ]]; } || ok=FAIL
    record "2 GPUs: SIG$sig x$times to the group" $ok \
        "exit $rc (want $want), $lines line(s) naming it, backup $loads, $left process(es) left, $trace traceback(s)"
}

part_signals() {
    signal_run sigterm TERM 1 143 100000
    signal_run sigint INT 2 130 100000
    signal_run sigusr1 USR1 1 0 "$USR1_RUN"
    grep -q "Saved .*small_final.weights after $USR1_RUN iterations" "$WORK/sigusr1.log" ||
        record "2 GPUs: SIGUSR1 run reached the end" FAIL "$WORK/sigusr1.log"
}

part_timing() {
    local cfg=$WORK/yolov4-3c.cfg
    if [ "$DRY" = 1 ]; then
        cfg=$SMALL; ITERATIONS=3
    elif [ ! -f "$YOLOV4" ]; then
        record "timing" skip "no yolov4.cfg (give its path)"; return
    fi
    $PY - "$YOLOV4" "$cfg" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
body = text[text.index("[convolutional]"):]
net = ("[net]\nbatch=64\nsubdivisions=2\nwidth=416\nheight=416\nchannels=3\nmomentum=0.949\n"
       "decay=0.0005\nangle=0\nsaturation=1.5\nexposure=1.5\nhue=.1\nlearning_rate=0.0013\n"
       "burn_in=1000\nmax_batches=500500\npolicy=steps\nsteps=400000,450000\nscales=.1,.1\n"
       "mosaic=1\n\n")
body = body.replace("filters=255", "filters=24").replace("classes=80", "classes=3")
if not sys.argv[2].endswith("small.cfg"):
    open(sys.argv[2], "w").write(net + re.sub(r"random=\d", "random=0", body))
EOF
    local t0 t1 rc data
    data=$(data_file warm)
    t0=$(date +%s.%N)
    $PY -m darknet_py train "$cfg" "$data" $(on_gpus 1) --max-batches 1 --quiet \
        > "$WORK/warm.log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    record "yolov4 warm-up (kernel cache), 1 iteration" "$([ $rc = 0 ] && echo ok || echo FAIL)" \
        "$(calc "$t1 - $t0") s ($WORK/warm.log)"
    local one=""
    for g in $COUNTS; do
        [ "$g" -le "$GPUS" ] || continue
        data=$(data_file "yolov4-$g")
        t0=$(date +%s.%N)
        # Each line stamped with the seconds since the start: where start-up goes.
        NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT $PY bench/multigpu/timestamped.py \
            $PY -m darknet_py train "$cfg" "$data" $(on_gpus "$g") \
            --max-batches "$ITERATIONS" --quiet > "$WORK/yolov4-$g.log" 2>&1
        rc=$?
        t1=$(date +%s.%N)
        local rate steady
        local batch; batch=$(grep -m1 '^batch=' "$cfg" | cut -d= -f2)
        rate=$(calc "$ITERATIONS * $batch * $g / ($t1 - $t0)")
        steady=$(grep -o '| [0-9.]* images/s' "$WORK/yolov4-$g.log" | tail -10 |
                 awk '{s += $2} END {if (NR) printf "%.1f", s / NR}')
        [ -n "$one" ] || one=$rate
        record "$(basename "$cfg" .cfg), $batch/GPU, $ITERATIONS its, $g GPU(s)" \
            "$([ $rc = 0 ] && echo ok || echo FAIL)" \
            "$(calc "$t1 - $t0") s, $rate images/s whole process ($(calc "$rate / $one" 2)x one GPU), steady $steady images/s ($WORK/yolov4-$g.log)"
    done
}

[ "$GPUS" -ge 2 ] || { echo "needs 2 GPUs, found $GPUS"; exit 2; }
for part in $PARTS; do "part_$part"; done
echo
printf '%-44s %-5s %s\n' check result detail
for line in "${RESULTS[@]}"; do echo "$line"; done
exit $FAILED
