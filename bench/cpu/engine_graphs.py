"""The CPU engine's forward with its plain graph (every convolution a Conv, as before
issue 39) and with its Winograd graph (export/winograd.py), against OpenCV 4's DNN, batch 1:
the three forwards interleaved, medians compared. Same networks, photo and OpenCV worker as
vs_opencv.py; each graph is exported, checked and cached in a temporary cache of its own,
then read back from it as a later command would.

    python3 bench/cpu/engine_graphs.py [--repeats N] [--pause S]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import vs_opencv  # noqa: E402

GRAPHS = {"plain": (None,), "winograd": ("auto", None)}


def engine_network(cfg, weights, forms, cache):
    """The network served by ONNX Runtime on the graph forms given, cached in `cache`."""
    import darknet_py as dn
    from darknet_py.export import engine

    os.environ["DARKNET_ONNX_CACHE"] = str(cache)
    saved, engine.ENGINE_GRAPH_FORMS = engine.ENGINE_GRAPH_FORMS, forms
    try:
        for _ in range(2):  # the first load exports, the second reads the cache
            net = dn.load_network(cfg, weights, batch=1, device="cpu", engine="onnxruntime")
            engine.describe(net)
    finally:
        engine.ENGINE_GRAPH_FORMS = saved
    assert "read from" in net.inference_engine.where, net.inference_engine.where
    return net


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--pause", type=float, default=0.25)
    args = ap.parse_args()
    import numpy as np

    import darknet_py as dn

    worker = vs_opencv.Worker()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, cfg, weights, _ in vs_opencv.CASES:
            if weights is None:
                weights = tmp / f"{cfg.stem}.weights"
                base = dn.load_network(cfg, None, batch=1, device="cpu", engine="numpy")
                vs_opencv.random_weights(base, weights)
            nets = {g: engine_network(cfg, weights, f, tmp / g) for g, f in GRAPHS.items()}
            c, h, w = nets["plain"].input_shape
            x = dn.letterbox(dn.load_image(vs_opencv.PHOTO), w, h)[None]
            np.save(tmp / "input.npy", x)
            worker.ask("load", cfg, weights, tmp / "input.npy")
            load_before = os.getloadavg()[0]
            times = {g: [] for g in [*nets, "opencv"]}
            for i in range(args.warmup + args.repeats):
                for g, net in nets.items():
                    start = time.perf_counter()
                    net.predict(x)
                    elapsed = time.perf_counter() - start
                    if i >= args.warmup:
                        times[g].append(elapsed)
                    time.sleep(args.pause)
                elapsed = float(worker.ask("time"))
                if i >= args.warmup:
                    times["opencv"].append(elapsed)
                time.sleep(args.pause)
            ms = {g: statistics.median(t) * 1e3 for g, t in times.items()}
            print(
                f"{name}: plain {ms['plain']:.1f} ms ({ms['plain'] / ms['opencv']:.3f}x OpenCV), "
                f"winograd {ms['winograd']:.1f} ms ({ms['winograd'] / ms['opencv']:.3f}x), "
                f"OpenCV {ms['opencv']:.1f} ms; load average {load_before:.2f} before, "
                f"{os.getloadavg()[0]:.2f} after",
                flush=True,
            )
    worker.close()


if __name__ == "__main__":
    main()
