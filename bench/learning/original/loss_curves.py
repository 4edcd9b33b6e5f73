"""Summarise run_device.sh's logs: for each program and seed the iterations reached, the
training wall time, the common scorer's mAP@0.50, and the mean loss over each tenth of the
run, then each program's mean over the seeds. pjreddie's `detector train` and
`darknet-py train` print the same iteration line ("N: loss, avg avg, rate rate, S seconds, ...").

usage: python loss_curves.py OUT_DIR SEEDS..."""

import re
import sys
from pathlib import Path

LINE = re.compile(r"^(\d+): (\S+), (\S+) avg, (\S+) rate, (\S+) seconds")
PROGRAMS = ("pjreddie", "py")


def iterations(log):
    """(iteration, loss, avg) for every iteration line of a training log."""
    rows = []
    for text in log.read_text(errors="replace").splitlines():
        m = LINE.match(text)
        if m:
            rows.append((int(m[1]), float(m[2].rstrip(",")), float(m[3])))
    return rows


def train_seconds(out, who, seed):
    """Seconds from the set being made to the end of this run (times.txt stamps)."""
    stamps = {}
    for text in (out / "times.txt").read_text().splitlines():
        label, _, secs = text.rpartition(" ")
        stamps[label] = int(secs.rstrip("s"))
    start = stamps.get("set")
    end = next((v for k, v in stamps.items() if k.startswith(f"{who} train {seed} ")), None)
    return None if start is None or end is None else end - start


def score(out, who, seed):
    """(mAP@0.50 in %, weights file scored) from the common scorer's log."""
    log = out / f"map_of_{who}_{seed}.log"
    if not log.exists():
        return None, "-"
    text = log.read_text(errors="replace")
    m = re.search(r"mean average precision \(mAP@0\.50\) = ([\d.]+)", text)
    return (100 * float(m[1]) if m else None), Path(text.splitlines()[0]).name


def main(out, seeds):
    curves = {}
    print("| program | seed | iterations | train wall (s) | mAP@0.50 | weights scored |")
    print("|---|---|---|---|---|---|")
    for who in PROGRAMS:
        for seed in seeds:
            log = out / f"{who}_train_{seed}.log"
            rows = iterations(log) if log.exists() else []
            curves[who, seed] = rows
            mean_ap, weights = score(out, who, seed)
            mean_ap = "n/a" if mean_ap is None else f"{mean_ap:.2f} %"
            print(
                f"| {who} | {seed} | {rows[-1][0] if rows else 0} | "
                f"{train_seconds(out, who, seed)} | {mean_ap} | {weights} |"
            )
    last = max((rows[-1][0] for rows in curves.values() if rows), default=0)
    tenths = [(last * k // 10, last * (k + 1) // 10) for k in range(10)]
    print(
        "\nmean loss over each tenth of the run (iterations "
        + " ".join(f"{a + 1}-{b}" for a, b in tenths)
        + ")"
    )
    for who in PROGRAMS:
        runs = []
        for seed in seeds:
            runs.append([tenth_mean(curves[who, seed], a, b) for a, b in tenths])
            print(f"{who} {seed}: " + " ".join(shown(v) for v in runs[-1]))
        columns = [[v for v in column if v is not None] for column in zip(*runs)]
        print(f"{who} mean: " + " ".join(shown(sum(c) / len(c) if c else None) for c in columns))


def tenth_mean(rows, first, last):
    """The mean loss over iterations first+1..last (None where the run has none)."""
    losses = [loss for i, loss, _ in rows if first < i <= last]
    return sum(losses) / len(losses) if losses else None


def shown(value):
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
